"""Zerolayer against llama.cpp's own server, on the same model, cores and prompts, side by side.

llama.cpp's `llama-server -np 8 -kvu` (built once from the llama-cpp-python sdist by
bench/llama_server.sh, cached under ~/.cache/zerolayer) serves the GGUF file the demo firmware is
converted from; our daemon serves the demo firmware over its Unix socket with the same number of
slots (8). Both get the same thread count, greedy decoding, no prompt cache, and the same
requests through the OpenAI chat completions API, streamed; the two servers take turns, in
alternating order, for every measurement:

- single-stream decode tokens/s (128 new tokens, over 8 turns) and prefill tokens/s (a
  ~1400-token prompt);
- 1, 4, 8 and 16 concurrent clients, each a closed loop of requests for 64 new tokens: aggregate
  tokens/s, inter-token latency (median, P99) and request latency P99.

Targets (the batching issue): our 8-client aggregate >= 1.5x llama-server's, our 8-client P99
request latency <= llama-server's, and the single-stream leads kept.

Run: `make bench-peers` (about 3 minutes on 2 CPUs after the one-time llama.cpp build; writes
bench/results/peers.md), or `--quick` (one repetition, prints, writes nothing unless --out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.host import load_average, machine
from bench.streams import (
    ANSWER_TOKENS,
    ROUNDS,
    Endpoint,
    LoadResult,
    PromptSerials,
    median_run,
    one_request,
    run_load,
    serving,
    zerolayer_daemon,
)
from firmware.toolchain.demo import demo_gguf

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "peers.md"
SLOTS = 8
# Single-stream decode is one 128-token request a turn (under a second): the noisiest number here,
# so it takes more turns than the rest (two turns of it ranged 0.93x-1.09x on one day).
DECODE_TURNS = 8
CONCURRENCY = (1, 4, 8, 16)
SENTENCE = ("The appliance keeps every decision local, in the process that runs the model, and a signed "
            "firmware bundle carries the weights, the tokenizer and the chat template. ")  # fmt: skip


@contextlib.contextmanager
def servers(work: Path, threads: int) -> Iterator[tuple[Endpoint, Endpoint]]:
    """Our daemon (Unix socket) and llama-server (loopback TCP), both ready, both stopped after."""
    binary = subprocess.run(["bash", str(REPO / "bench" / "llama_server.sh")], check=True, capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    port = free_port()
    log = work / "llama-server.log"
    with zerolayer_daemon(work, SLOTS, threads) as ours, open(log, "wb") as out:
        proc = subprocess.Popen([binary, "-m", str(demo_gguf()), "-np", str(SLOTS), "-kvu", "-c", "16384",
                                 "-t", str(threads), "-tb", str(threads), "--host", "127.0.0.1", "--port",
                                 str(port)], stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        theirs = Endpoint("llama-server", f"http://127.0.0.1:{port}", None, "demo", {"cache_prompt": False})
        with serving(proc, log, theirs, "/health"):
            yield ours, theirs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alternating(reps: int, ours: Callable[[int], float], theirs: Callable[[int], float],
                paired: list[float] | None = None) -> tuple[float, float]:  # fmt: skip
    """Median of each side over `reps` turns, the order alternating each turn (rep index passed in);
    `paired` gets each turn's ratio, ours / theirs."""
    xs, ys = [], []
    for i in range(reps):
        if i % 2 == 0:
            xs.append(ours(i))
            ys.append(theirs(i))
        else:
            ys.append(theirs(i))
            xs.append(ours(i))
    if paired is not None:
        paired.extend(x / y for x, y in zip(xs, ys, strict=True))
    return statistics.median(xs), statistics.median(ys)


def long_prompt(rep: int, sentences: int = 37) -> str:
    # A different first line each time: neither side may reuse an earlier prefill.
    return f"Document {rep * 7919 + 13}. " + SENTENCE * sentences + "Summarise the document in one line."


def decode_rate(endpoint: Endpoint, rep: int) -> float:
    result = asyncio.run(run_load(endpoint, 1, 1, 128))
    r = result.requests[0]
    return (len(r.chunks) - 1) / (r.chunks[-1] - r.chunks[0])


def prefill_rate(endpoint: Endpoint, rep: int) -> tuple[float, int]:
    async def go() -> tuple[float, int]:
        async with endpoint.client() as http:
            timing = await one_request(http, endpoint, long_prompt(rep), 1)
        return timing.ttft, timing.prompt_tokens

    seconds, tokens = asyncio.run(go())
    return tokens / seconds, tokens


@dataclass
class LoadRow:
    clients: int
    ours: LoadResult
    theirs: LoadResult


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition; writes no file unless --out")
    parser.add_argument("--reps", type=int, help="repetitions per number (default 2, 1 with --quick)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    reps = args.reps or (1 if args.quick else 2)
    decode_turns = 1 if args.quick else max(reps, DECODE_TURNS)
    out: Path | None = args.out or (None if args.quick else RESULTS)
    threads = os.cpu_count() or 1
    load_start = load_average()
    lines: list[str] = []
    targets: list[tuple[str, bool]] = []
    work = REPO / "build" / "bench-peers"  # the servers' logs stay here after the run
    work.mkdir(parents=True, exist_ok=True)
    with servers(work, threads) as (ours, theirs):
        for side in (ours, theirs):  # warm both: first requests pay for lazy initialisation
            asyncio.run(run_load(side, 2, 1, 8))
        decode_ratios: list[float] = []
        d_ours, d_theirs = alternating(decode_turns, lambda i: decode_rate(ours, i),
                                       lambda i: decode_rate(theirs, i), decode_ratios)  # fmt: skip
        print(f"  decode: ours {d_ours:.1f}, llama-server {d_theirs:.1f} tokens/s", flush=True)
        counts: dict[str, int] = {}

        def prefill(side: Endpoint, key: str) -> Callable[[int], float]:
            def run(i: int) -> float:
                rate, counts[key] = prefill_rate(side, i)
                return rate

            return run

        p_ours, p_theirs = alternating(reps, prefill(ours, "ours"), prefill(theirs, "theirs"))
        print(f"  prefill: ours {p_ours:.1f}, llama-server {p_theirs:.1f} tokens/s", flush=True)
        rows: list[LoadRow] = []
        serials = PromptSerials()
        for clients in CONCURRENCY:
            results: dict[str, list[LoadResult]] = {"ours": [], "theirs": []}
            for i in range(reps):
                first = serials.take(clients * 3)  # each turn its own prompts, the same for both sides
                order = [("ours", ours), ("theirs", theirs)]
                for key, side in order if i % 2 == 0 else order[::-1]:
                    results[key].append(asyncio.run(run_load(side, clients, ROUNDS, ANSWER_TOKENS, first)))
            best = {k: median_run(v) for k, v in results.items()}
            rows.append(LoadRow(clients, best["ours"], best["theirs"]))
            print(f"  {clients} clients: ours {best['ours'].tokens_per_s:.1f}, llama-server "
                  f"{best['theirs'].tokens_per_s:.1f} tokens/s", flush=True)  # fmt: skip
    single = [
        ("single-stream decode (128 new tokens), tokens/s", d_ours, d_theirs, "> 1.0x"),
        (f"prefill ({counts.get('ours', 0)} / {counts.get('theirs', 0)} prompt tokens), tokens/s", p_ours,
         p_theirs, "> 1.0x"),
    ]  # fmt: skip
    lines += ["| measurement | Zerolayer | llama-server | ratio | target |", "| --- | --- | --- | --- | --- |"]
    for what, a, b, target in single:
        lines.append(f"| {what} | {a:.1f} | {b:.1f} | {a / b:.2f}x | {target} |")
    targets.append(("single-stream decode lead kept", d_ours > d_theirs))
    targets.append(("prefill lead kept", p_ours > p_theirs))
    lines += ["", "| clients | Zerolayer tokens/s | llama-server tokens/s | ratio | Zerolayer ITL median / P99 ms "
              "| llama-server ITL median / P99 ms | Zerolayer request P99 s | llama-server request P99 s |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for row in rows:
        us, them = row.ours, row.theirs
        lines.append(f"| {row.clients} | {us.tokens_per_s:.1f} | {them.tokens_per_s:.1f} | "
                     f"{us.tokens_per_s / them.tokens_per_s:.2f}x | "
                     f"{us.itl(0.5) * 1000:.0f} / {us.itl(0.99) * 1000:.0f} | "
                     f"{them.itl(0.5) * 1000:.0f} / {them.itl(0.99) * 1000:.0f} | {us.latency(0.99):.2f} | "
                     f"{them.latency(0.99):.2f} |")  # fmt: skip
    eight = next(r for r in rows if r.clients == 8)
    ratio = eight.ours.tokens_per_s / eight.theirs.tokens_per_s
    targets.append((f"8-client aggregate >= 1.5x llama-server ({ratio:.2f}x)", ratio >= 1.5))
    targets.append((f"8-client P99 request latency <= llama-server's ({eight.ours.latency(0.99):.2f} s vs "
                    f"{eight.theirs.latency(0.99):.2f} s)", eight.ours.latency(0.99) <= eight.theirs.latency(0.99)))
    table = "\n".join(lines)
    verdicts = "\n".join(f"- {'met' if ok else '**not met**'}: {what}" for what, ok in targets)
    print()
    print(table)
    print()
    print(verdicts)
    if out is not None:
        loads = f"{load_start} at the start, {load_average()} at the end"
        command = "make bench-peers" + (f" ARGS='--reps {reps}'" if args.reps else "")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"""# Zerolayer against llama.cpp's server

{(__doc__ or '').split(chr(10) + chr(10))[1]}

- machine: {machine()}
- load average (1, 5, 15 min): {loads}
- {threads} threads each; {SLOTS} slots each (`llama-server -np {SLOTS} -kvu`, `limits.max_active_per_device =
  {SLOTS}`); median of {reps} turns per number, {decode_turns} for single-stream decode; concurrency rows: each
  client sends 3 requests in a row, 64 new tokens each (ITL: gaps between streamed chunks)
- single-stream decode, each turn's ratio (ours / llama-server, in order):
  {", ".join(f"{r:.2f}x" for r in decode_ratios)}; their median {statistics.median(decode_ratios):.2f}x

{table}

Targets:

{verdicts}

Reproduce: `{command}`
""")
        print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
