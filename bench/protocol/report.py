"""From the points' samples to the report: percentiles, tables, the targets as ratios from the same
run, and the plots (matplotlib, PNG)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.protocol.capture import WireStats
from bench.protocol.paths import PATHS

GATEWAY = ("nginx", "layer", "redis")


def pct(xs: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of xs; NaN when empty."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


@dataclass(frozen=True)
class Summary:
    path: str
    concurrency: int
    max_tokens: int
    n: int
    errors: int
    cut_short: bool
    goal: int
    seconds: float
    wall: float
    ttft: tuple[float, float, float]  # P50, P90, P99, ms
    ttlt: tuple[float, float, float]
    rps: float
    client_cpu_ms: float  # per request
    zerolayer_cpu_ms: float
    gateway_cpu_ms: float  # nginx + layer service + Redis
    extra_p50_ms: float  # h3-0rtt: the early-data GET
    notes: tuple[str, ...]
    send_ms_p50: float  # start -> model request handed to the transport


def summarise(r: dict[str, Any]) -> Summary:
    p, samples = r["point"], r["samples"]
    n = len(samples)
    ttft = [s["ttft"] * 1000 for s in samples]
    ttlt = [s["ttlt"] * 1000 for s in samples]
    per = max(n, 1)
    srv = r["server_cpu"]
    sends = [(s["sent_wall"] - s["start_wall"]) * 1000 for s in samples if s["sent_wall"]]
    return Summary(
        p["path"], p["concurrency"], p["max_tokens"], n, len(r["errors"]), r["cut_short"], p["requests"],
        p["seconds"], r["wall"], (pct(ttft, 50), pct(ttft, 90), pct(ttft, 99)),
        (pct(ttlt, 50), pct(ttlt, 90), pct(ttlt, 99)), n / r["wall"] if r["wall"] else 0.0,
        r["client_cpu"] * 1000 / per, srv.get("zerolayer", 0.0) * 1000 / per,
        sum(srv.get(k, 0.0) for k in GATEWAY) * 1000 / per,
        pct([s["extra"] * 1000 for s in samples if s["extra"]], 50), tuple(r["notes"]), pct(sends, 50),
    )  # fmt: skip


def _f(x: float, digits: int = 2) -> str:
    return "—" if math.isnan(x) else f"{x:.{digits}f}"


def latency_table(rows: list[Summary]) -> str:
    out = ["| path | max_tokens | requests | TTFT P50 / P90 / P99 ms | TTLT P50 / P90 / P99 ms | client CPU ms/req "
           "| Zerolayer CPU ms/req | gateway CPU ms/req |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        n = f"{r.n}{' (cut short)' if r.cut_short else ''}{f', {r.errors} errors' if r.errors else ''}"
        out.append(f"| {r.path} | {r.max_tokens} | {n} | {' / '.join(_f(x) for x in r.ttft)} | "
                   f"{' / '.join(_f(x) for x in r.ttlt)} | {_f(r.client_cpu_ms)} | {_f(r.zerolayer_cpu_ms)} | "
                   f"{_f(r.gateway_cpu_ms)} |")  # fmt: skip
    return "\n".join(out)


def concurrency_table(rows: list[Summary]) -> str:
    levels = sorted({r.concurrency for r in rows})
    paths = [p for p in PATHS if any(r.path == p for r in rows)]
    head = "| path | " + " | ".join(f"c={c}: req/s, TTLT P50 / P99 ms (n)" for c in levels) + " |"
    out = [head, "| --- |" + " --- |" * len(levels)]
    for path in paths:
        cells = []
        for c in levels:
            r = next((x for x in rows if x.path == path and x.concurrency == c), None)
            if r is None:
                cells.append("—")
                continue
            mark = "*" if r.cut_short else ""
            err = f", {r.errors} errors" if r.errors else ""
            cells.append(f"{r.rps:.0f}, {_f(r.ttlt[0], 1)} / {_f(r.ttlt[2], 1)} ({r.n}{mark}{err})")
        out.append(f"| {path} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def wire_table(stats: dict[str, WireStats]) -> str:
    out = ["| path | requests counted | packets / req | IP bytes / req | behind the gateway: packets, bytes / req "
           "| UDP datagrams until the answer was whole / in all (medians) |",
           "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for path, w in stats.items():
        behind = f"{w.internal_packets:.1f}, {w.internal_bytes:.0f}" if w.internal_packets else "—"
        grams = f"{w.datagrams_to_answer:.0f} / {w.datagrams_in_all:.0f}" if path.startswith("h3") else "—"
        out.append(f"| {path} | {w.requests} | {w.packets:.1f} | {w.bytes:.0f} | {behind} | {grams} |")
    seqs = [f"- {path}: {w.common} ({w.common_count} of {w.requests} requests)" for path, w in stats.items()
            if path.startswith("h3") and w.common]  # fmt: skip
    if seqs:
        out += ["", "The most common datagram sequence per HTTP/3 request (C: from the client, S: from the server, IP "
                "bytes; a datagram of 1228 bytes carries an Initial packet, padded):", "", *seqs]  # fmt: skip
    return "\n".join(out)


def lossy_table(rows: list[Summary], rtt_ms: float) -> str:
    out = ["| path | requests | TTFT P50 / P90 / P99 ms | TTLT P50 / P90 / P99 ms | start to the model request "
           "handed to the transport, P50 (in round trips) |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        n = f"{r.n}{' (cut short)' if r.cut_short else ''}{f', {r.errors} errors' if r.errors else ''}"
        send = "—" if math.isnan(r.send_ms_p50) else f"{r.send_ms_p50:.1f} ms ({r.send_ms_p50 / rtt_ms:.1f})"
        out.append(f"| {r.path} | {n} | {' / '.join(_f(x, 1) for x in r.ttft)} | "
                   f"{' / '.join(_f(x, 1) for x in r.ttlt)} | {send} |")  # fmt: skip
    return "\n".join(out)


# --- plots ---------------------------------------------------------------------------------------


def _style(path: str) -> dict[str, Any]:
    """One colour per path, one line style per family (layered dashed, TCP dash-dot, HTTP/3 solid)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    index = list(PATHS).index(path) if path in PATHS else 0
    dash = "--" if path.startswith("layered") else "-." if path.startswith("tcp") else ":" if path in (
        "unix", "engine") else "-"  # fmt: skip
    return {"color": cmap(((index * 2) % 20 if index < 10 else 1) / 20), "linestyle": dash}


def plot_cdf(results: list[dict[str, Any]], title: str, out: Path, metric: str = "ttft") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for r in results:
        xs = sorted(s[metric] * 1000 for s in r["samples"])
        if not xs:
            continue
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.plot(xs, ys, label=f"{r['point']['path']} (n={len(xs)})", linewidth=1.6, **_style(r["point"]["path"]))
    ax.set_xscale("log")
    ax.set_xlabel(f"{'time to first token' if metric == 'ttft' else 'time to last token'} (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_concurrency(rows: list[Summary], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 5))
    for path in [p for p in PATHS if any(r.path == p for r in rows)]:
        mine = sorted((r for r in rows if r.path == path), key=lambda r: r.concurrency)
        cs = [r.concurrency for r in mine]
        a1.plot(cs, [r.ttlt[2] for r in mine], marker="o", label=path, **_style(path))
        a2.plot(cs, [r.rps for r in mine], marker="o", label=path, **_style(path))
    for ax, label in ((a1, "TTLT P99 (ms, log scale)"), (a2, "requests/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    a1.set_yscale("log")
    a1.set_title("P99 against concurrency (max_tokens 1)")
    a2.set_title("throughput against concurrency (max_tokens 1)")
    a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def headline_table(c1: list[Summary], conc: list[Summary], wire: dict[str, WireStats], lossy: list[Summary],
                   rtt_ms: float) -> str:  # fmt: skip
    """One row per path: the figures the README shows (max_tokens 1 throughout)."""
    out = ["| path | TTFT P50 ms, 1 client | TTLT P99 ms, 1 client | TTLT P99 ms / req/s, 32 clients | packets / req "
           f"| lossy link ({rtt_ms:.0f} ms RTT, 1% loss): TTFT P50 ms | round trips before the request |",
           "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for path in PATHS:
        one = next((r for r in c1 if r.path == path and r.max_tokens == 1), None)
        if one is None:
            continue
        c32 = next((r for r in conc if r.path == path and r.concurrency == 32), None)
        w = wire.get(path)
        lo = next((r for r in lossy if r.path == path), None)
        out.append(
            f"| {path} | {_f(one.ttft[0])} | {_f(one.ttlt[2], 1)} | "
            f"{f'{_f(c32.ttlt[2], 1)} / {c32.rps:.0f}' if c32 else '—'} | {f'{w.packets:.1f}' if w else '—'} | "
            f"{_f(lo.ttft[0], 1) if lo else '—'} | {f'{lo.send_ms_p50 / rtt_ms:.1f}' if lo else '—'} |"
        )
    return "\n".join(out)
