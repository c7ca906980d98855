"""The protocol-tax benchmark: Zerolayer's direct paths against the layered gateway it replaces,
on the same engine and model, side by side in one run.

Phases (each point bounded in requests and in time):
1. loopback, one client at a time: every path at max_tokens 1 and 64;
2. loopback, concurrency 8, 32 and 64 (and 1 from phase 1) at max_tokens 1;
3. loopback captures (tcpdump on lo, read back with tshark): packets, bytes and round trips per request;
4. a lossy link: two network namespaces, netem 10 ms each way (20 ms round trip) and 1% loss each way.

The servers (the Zerolayer daemon; Redis, the layer service and nginx for the baseline) are
started and stopped here; the client runs in its own process (`bench.protocol.load`).

Run: `make bench-protocol` (writes bench/results/protocol.md and its plots), or
`python -m bench.protocol --smoke` (a few requests per path, prints, writes nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.host import load_average, machine
from bench.protocol.capture import WireStats, read_pcap, tcpdump, wire_stats
from bench.protocol.load import Point
from bench.protocol.paths import PATHS, Sample
from bench.protocol.report import (
    Summary,
    concurrency_table,
    headline_table,
    latency_table,
    lossy_table,
    plot_cdf,
    plot_concurrency,
    summarise,
    wire_table,
)
from bench.protocol.servers import REPO, Stack, lossy_pair, start_stack, stop_stack

RESULTS = REPO / "bench" / "results"
C1_PATHS = ["engine", "unix", "h3-warm", "tcp-reuse", "layered-reuse", "h3-0rtt-get", "h3-0rtt", "h3-resumed",
            "h3-cold", "tcp-new", "layered-new"]  # fmt: skip
CONCURRENT_PATHS = ["engine", "unix", "h3-warm", "tcp-reuse", "layered-reuse", "h3-cold", "tcp-new", "layered-new"]
CAPTURE_PATHS = ["h3-warm", "tcp-reuse", "layered-reuse", "h3-0rtt-get", "h3-0rtt", "h3-resumed", "h3-cold",
                 "tcp-new", "layered-new"]  # fmt: skip
LOSSY_PATHS = ["h3-warm", "tcp-reuse", "layered-reuse", "h3-0rtt", "h3-resumed", "h3-cold", "tcp-new", "layered-new"]
DELAY_MS, LOSS_PCT = 10.0, 1.0  # each way


@dataclass(frozen=True)
class Plan:
    requests: int  # per point, the goal at concurrency 1
    seconds: float  # per point, the bound (twice that for max_tokens 64)
    concurrency: tuple[int, ...]
    per_client: int  # at concurrency c a point's goal is max(requests, per_client * c)
    capture_requests: int
    lossy_requests: int
    lossy_seconds: float
    lossy: bool


FULL = Plan(requests=500, seconds=12, concurrency=(8, 32, 64), per_client=16, capture_requests=61, lossy_requests=300,
            lossy_seconds=20, lossy=True)  # fmt: skip
SMOKE = Plan(requests=4, seconds=10, concurrency=(8,), per_client=2, capture_requests=4, lossy_requests=3,
             lossy_seconds=10, lossy=True)  # fmt: skip


@dataclass
class Run:
    plan: Plan
    firmware: str
    c1: list[dict[str, Any]] = field(default_factory=list)
    conc: list[dict[str, Any]] = field(default_factory=list)
    wire: dict[str, WireStats] = field(default_factory=dict)
    capture_notes: list[str] = field(default_factory=list)
    lossy: list[dict[str, Any]] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)
    link: list[str] = field(default_factory=list)  # the lossy link forwarder's own counts
    started: float = field(default_factory=time.time)


def cpu_busy() -> float:
    """Seconds of CPU time the whole machine has spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]  # idle + iowait
    return (sum(parts[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def ours() -> float:
    """CPU seconds of this process and its reaped children (servers, clients, tcpdump, tshark)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_client(work: Path, stack: Stack, points: list[Point], name: str, ns: str | None = None) -> list[dict[str, Any]]:
    spec, out = work / f"{name}-spec.json", work / f"{name}-out.json"
    spec.write_text(json.dumps({"target": asdict(stack.target), "points": [asdict(p) for p in points],
                                "server_pgids": stack.pids()}))  # fmt: skip
    cmd = [sys.executable, "-m", "bench.protocol.load", str(spec), str(out)]
    if ns is not None:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    bound = sum(p.seconds + 30 for p in points) + 60
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=bound)
    stack.check()
    results: list[dict[str, Any]] = json.loads(out.read_text())
    return results


def phase(run: Run, what: str) -> None:
    line = f"{what}: load average {load_average()} at {time.strftime('%H:%M:%S', time.gmtime())} UTC"
    run.loads.append(line)
    print(f"\n== {line}", flush=True)


def loopback(run: Run, work: Path, bundle: Path, trusted: Path) -> None:
    plan = run.plan
    stack = start_stack(work / "loopback", bundle, trusted)
    try:
        phase(run, "phase 1, loopback, one client")
        points = [Point(p, 1, mt, plan.requests, plan.seconds * (1 if mt == 1 else 2))
                  for mt in (1, 64) for p in C1_PATHS if mt == 1 or p != "h3-0rtt-get"]  # fmt: skip  # a GET: no tokens
        run.c1 = run_client(work, stack, points, "c1")
        phase(run, "phase 2, loopback, concurrency")
        points = [Point(p, c, 1, max(plan.requests, plan.per_client * c), plan.seconds, warmup=1)
                  for c in plan.concurrency for p in CONCURRENT_PATHS]  # fmt: skip
        run.conc = run_client(work, stack, points, "conc")
        phase(run, "phase 3, loopback captures")
        captures(run, work, stack)
    finally:
        stop_stack(stack)


def captures(run: Run, work: Path, stack: Stack) -> None:
    t = stack.target
    front = {t.gateway_port, t.tcp_port, t.quic_port}
    internal = set(stack.internal_ports)
    for path in CAPTURE_PATHS:
        pcap = work / f"{path}.pcap"
        point = Point(path, 1, 1, run.plan.capture_requests, run.plan.seconds)
        with tcpdump("lo", sorted(front | internal), pcap) as summary:
            result = run_client(work, stack, [point], f"capture-{path}")[0]
        dropped = next((s for s in summary if "dropped by kernel" in s), "?")
        samples = [Sample(**s) for s in result["samples"]]
        run.wire[path] = wire_stats(read_pcap(pcap), samples, front, internal, dropped)
        if not dropped.startswith("0 "):
            run.capture_notes.append(f"{path}: tcpdump reports {dropped}")
        print(f"  capture {path:14} {run.wire[path]}", flush=True)


def lossy(run: Run, work: Path, bundle: Path, trusted: Path) -> None:
    plan = run.plan
    with lossy_pair(DELAY_MS, LOSS_PCT) as pair:
        stack = start_stack(work / "lossy", bundle, trusted, host=pair.server_ip, ns=pair.server_ns,
                            extra_hosts=(pair.server_ip,))  # fmt: skip
        try:
            phase(run, f"phase 4, lossy link ({2 * DELAY_MS:.0f} ms round trip, {LOSS_PCT}% loss each way)")
            points = [Point(p, 1, 1, plan.lossy_requests, plan.lossy_seconds, warmup=1) for p in LOSSY_PATHS]
            run.lossy = run_client(work, stack, points, "lossy", ns=pair.client_ns)
        finally:
            stop_stack(stack)
    run.link = pair.link_report


# --- targets and the report ----------------------------------------------------------------------


def find(rows: list[Summary], path: str, c: int = 1, max_tokens: int = 1) -> Summary | None:
    return next((r for r in rows if r.path == path and r.concurrency == c and r.max_tokens == max_tokens), None)


def targets(run: Run) -> list[tuple[str, bool | None]]:
    c1 = [summarise(r) for r in run.c1]
    conc = [summarise(r) for r in run.conc] + [r for r in c1 if r.max_tokens == 1]
    out: list[tuple[str, bool | None]] = []
    h3, eng = find(c1, "h3-warm"), find(c1, "engine")
    if h3 and eng:
        tax = h3.ttft[0] - eng.ttft[0]
        out.append((f"protocol tax: HTTP/3 warm TTFT P50 {h3.ttft[0]:.2f} ms - engine alone {eng.ttft[0]:.2f} ms = "
                    f"{tax:.2f} ms (max_tokens 1, loopback); target <= 1 ms", tax <= 1.0))  # fmt: skip
    for base in ("layered-new", "layered-reuse"):
        h, b = find(conc, "h3-warm", 32), find(conc, base, 32)
        if h and b:
            ratio = h.ttlt[2] / b.ttlt[2]
            out.append((f"HTTP/3 warm P99 at concurrency 32: {h.ttlt[2]:.1f} ms / {base} {b.ttlt[2]:.1f} ms = "
                        f"{ratio:.2f}x; target <= 0.2x", ratio <= 0.2))  # fmt: skip
    w = run.wire.get("h3-0rtt-get")
    if w is not None and w.requests:
        spread = ", ".join(f"{k}: {v}" for k, v in w.in_all_counts.items())
        out.append((f"resumed 0-RTT GET for a small answer: {w.datagrams_in_all:.0f} datagrams in all (median of "
                    f"{w.requests}; mean {w.packets:.1f}; datagrams: requests {spread}; both directions, "
                    f"CONNECTION_CLOSE included), {w.datagrams_to_answer:.0f} until the answer was whole; the most "
                    f"common sequence ({w.common_count} of {w.requests}; C client, S server, IP bytes): {w.common}; "
                    f"target <= 4 in all", w.datagrams_in_all <= 4))  # fmt: skip
    lossy_rows = [summarise(r) for r in run.lossy]
    q, t = find(lossy_rows, "h3-cold"), find(lossy_rows, "tcp-new")
    if q and t:
        gain = t.ttft[0] - q.ttft[0]
        rtt = 2 * DELAY_MS
        out.append((f"lossy link, cold TTFT P50: HTTPS/TCP {t.ttft[0]:.1f} ms - HTTP/3 {q.ttft[0]:.1f} ms = "
                    f"{gain:.1f} ms ({gain / rtt:.2f} round trips of {rtt:.0f} ms); target >= 1 round trip",
                    gain >= rtt))  # fmt: skip
    return out


def versions() -> str:
    import aioquic
    import hypercorn  # noqa: F401
    import redis

    def first_line(cmd: list[str]) -> str:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            return (p.stdout or p.stderr).splitlines()[0].strip()
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "?"

    from importlib.metadata import version

    parts = [first_line(["nginx", "-v"]), first_line(["redis-server", "--version"]), f"aioquic {aioquic.__version__}",
             f"Hypercorn {version('hypercorn')}", f"httpx2 {version('httpx2')}", f"redis-py {redis.__version__}",
             first_line(["tshark", "--version"])]  # fmt: skip
    return "; ".join(parts)


def markdown(run: Run, busy: float, mine: float, wall: float, command: str) -> str:
    c1 = [summarise(r) for r in run.c1]
    order = {p: i for i, p in enumerate(PATHS)}
    c1.sort(key=lambda r: (r.max_tokens, order[r.path]))
    conc = [summarise(r) for r in run.conc] + [r for r in c1 if r.max_tokens == 1 and r.path in CONCURRENT_PATHS]
    lossy_rows = sorted((summarise(r) for r in run.lossy), key=lambda r: order[r.path])
    plan = run.plan
    others = max(0.0, busy - mine)
    cores = os.cpu_count() or 1
    tgt = "\n".join(f"- {'met' if ok else '**missed**'}: {what}" for what, ok in targets(run))
    notes = [f"{r.path} c={r.concurrency} max_tokens={r.max_tokens}: {', '.join(r.notes)}"
             for r in [*c1, *conc, *lossy_rows] if r.notes]  # fmt: skip
    errors = [f"{r['point']['path']} c={r['point']['concurrency']}: {r['errors'][0]}"
              for r in [*run.c1, *run.conc, *run.lossy] if r["errors"]]  # fmt: skip
    extra = "\n".join(f"- {x}" for x in [*notes, *run.capture_notes, *errors]) or "- none"
    zero = find(c1, "h3-0rtt")
    zero_line = (f"On the 0-RTT path the early-data GET's whole answer came back after {zero.extra_p50_ms:.2f} ms "
                 f"(P50) while the POST waited for the handshake." if zero and zero.extra_p50_ms == zero.extra_p50_ms
                 else "")  # fmt: skip
    return f"""# Protocol tax: Zerolayer's direct paths against the layered gateway

One run of `bench/protocol` on firmware `{run.firmware}`. Every path sends the same streaming Anthropic Messages
request ("{'What is the capital of France?'}") to the same daemon, engine and model; the layered baseline's
model server is that daemon's own HTTPS listener. Times run from the moment the client starts the request
(connection set-up included) to the first text delta (TTFT) and to the end of the stream (TTLT).

- machine: {machine()}
- software: {versions()}
- load: {'; '.join(run.loads)}; at the end {load_average()}
- other work on the machine during the run (not ours: CPU busy from /proc/stat less this benchmark's own
  processes): {others:.0f} CPU-seconds over {wall:.0f} s, {others / wall / cores * 100:.0f}% of {cores} cores
- points: at most {plan.requests} requests or {plan.seconds:.0f} s each at concurrency 1 ({2 * plan.seconds:.0f} s at
  max_tokens 64; after 2 warm-up requests per client), at most max({plan.requests}, {plan.per_client} x concurrency)
  requests or {plan.seconds:.0f} s at higher concurrency (after 1 warm-up request per client); a point that hit its
  time bound first is marked "cut short".
  Client: one Python process (asyncio; httpx2 for HTTPS and the Unix socket, our aioquic client
  `bench/protocol/h3.py` for HTTP/3, the engine in process).
  CPU per request: client = that process; Zerolayer = the daemon (its ONNX Runtime threads included); gateway =
  nginx + the layer service + Redis, all from /proc over the measured interval (10 ms ticks).

## Targets (ratios from this run)

{tgt}

## Headline (max_tokens 1)

{headline_table(c1, conc, run.wire, lossy_rows, 2 * DELAY_MS)}

Round trips before the request: the median time from the start of a request to the moment the client handed the
model request to its transport, on the lossy link, in units of its {2 * DELAY_MS:.0f} ms round trip (CPU time
included, so a 1 reads as "one round trip and a little").

## One client at a time, loopback

{latency_table(c1)}

{zero_line}

![TTFT CDF](protocol-cdf-ttft.png)

## Concurrency, loopback, max_tokens 1

Requests/s and TTLT P50 / P99 (ms), requests measured in brackets; `*`: cut short by the time bound.

{concurrency_table(conc)}

![P99 against concurrency](protocol-concurrency.png)

## On the wire, loopback, one client, max_tokens 1

tcpdump on `lo` filtered to the servers' ports, read back with tshark; {plan.capture_requests - 1} requests per path
counted (each request owns the packets from its start to the next one's: set-up, exchange and close). "Behind the
gateway" is nginx <-> layer service <-> Redis, on loopback here and on a datacenter network in the old design.
Round trips before the first byte of the model request are timed on the lossy link below (its last column), where
each one costs 20 ms.

{wire_table(run.wire)}

## Lossy link: {2 * DELAY_MS:.0f} ms round trip, {LOSS_PCT}% loss each way, one client, max_tokens 1

Two network namespaces, the servers in one and the client in the other, joined by a TUN device in each and a
userspace forwarder (`bench/protocol/wire.py`) that holds every packet {DELAY_MS:.0f} ms and drops {LOSS_PCT}% at
random, each way: this kernel has no `sch_netem` (CONFIG_NET_SCH_NETEM is not set), so `tc netem` is not available. The
forwarder's own count: {'; '.join(run.link) or 'not reported'}. At most {plan.lossy_requests} requests or
{plan.lossy_seconds:.0f} s per path.

{lossy_table(lossy_rows, 2 * DELAY_MS)}

![lossy TTFT CDF](protocol-cdf-lossy.png)

## Notes

{extra}

Reproduce: `{command}` (about {wall / 60:.0f} minutes here; `python -m bench.protocol --smoke` runs a few requests per
path).
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few requests per path; writes nothing unless --out")
    parser.add_argument("--firmware", choices=["tiny", "demo"], default="tiny")
    parser.add_argument("--no-lossy", action="store_true", help="skip the network-namespace phase")
    parser.add_argument("--out", type=Path, help=f"results folder (default {RESULTS} on a full run)")
    parser.add_argument("--json", type=Path, help="also write every sample here")
    args = parser.parse_args()
    plan = SMOKE if args.smoke else FULL
    out: Path | None = args.out or (None if args.smoke else RESULTS)
    from firmware.toolchain.devkit import dev_trusted_keys

    if args.firmware == "demo":
        from firmware.toolchain.demo import demo_bundle

        bundle = demo_bundle()
    else:
        from firmware.toolchain.tiny import tiny_bundle

        bundle = tiny_bundle()
    trusted = dev_trusted_keys()
    run = Run(plan, f"{bundle.name} ({args.firmware})")
    work = Path(tempfile.mkdtemp(prefix="zl-bench-protocol-"))
    busy0, mine0, t0 = cpu_busy(), ours(), time.monotonic()
    try:
        loopback(run, work, bundle, trusted)
        if plan.lossy and not args.no_lossy:
            lossy(run, work, bundle, trusted)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    busy, mine, wall = cpu_busy() - busy0, ours() - mine0, time.monotonic() - t0
    results = {"c1": run.c1, "conc": run.conc, "lossy": run.lossy,
               "wire": {k: asdict(v) for k, v in run.wire.items()}}  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(results))
    print()
    for what, ok in targets(run):
        print(f"{'met' if ok else 'MISSED'}: {what}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        command = "make bench-protocol" + (f" ARGS='--firmware {args.firmware}'" if args.firmware != "tiny" else "")
        (out / "protocol.md").write_text(markdown(run, busy, mine, wall, command))
        by_path = {r["point"]["path"]: r for r in run.c1 if r["point"]["max_tokens"] == 1}
        plot_cdf([by_path[p] for p in PATHS if p in by_path], "TTFT, loopback, one client, max_tokens 1",
                 out / "protocol-cdf-ttft.png")  # fmt: skip
        conc = [summarise(r) for r in run.conc] + [summarise(r) for r in run.c1 if r["point"]["max_tokens"] == 1
                                                    and r["point"]["path"] in CONCURRENT_PATHS]  # fmt: skip
        plot_concurrency(conc, out / "protocol-concurrency.png")
        if run.lossy:
            plot_cdf(run.lossy, f"TTFT, lossy link ({2 * DELAY_MS:.0f} ms RTT, {LOSS_PCT}% loss)",
                     out / "protocol-cdf-lossy.png")  # fmt: skip
        print(f"\nwrote {out / 'protocol.md'}")
    else:
        print(json.dumps(smoke_summary(run)))
    return 0


def smoke_summary(run: Run) -> dict[str, Any]:
    """What the smoke test checks: requests and errors per path and phase."""
    def per(rs: list[dict[str, Any]]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for r in rs:
            key = f"{r['point']['path']}@c{r['point']['concurrency']}/t{r['point']['max_tokens']}"
            out[key] = [len(r["samples"]), len(r["errors"]), r["point"]["requests"]]
        return out

    return {"c1": per(run.c1), "conc": per(run.conc), "lossy": per(run.lossy),
            "wire": {k: asdict(v) for k, v in run.wire.items()}}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
