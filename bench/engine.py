"""Engine benchmark: ours against onnxruntime-genai's og.Generator on the demo firmware.

Same model folder, same CPU execution provider, measured side by side in one run (ours and
theirs interleaved, median of several repetitions, each warmed up first):

1. prefill tokens/s at 512 and 2048 prompt tokens, and decode tokens/s over 128 new tokens;
2. sharded (512-token shards) against one-pass prefill of a 2048-token prompt, on our engine;
3. turn-2 time to first token with a reused ~2k-token prefix against cold.

Run: `make bench-engine` (or `.venv/bin/python bench/engine.py [--quick]`). Writes
bench/results/engine.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import onnxruntime_genai as og

import firmware
from appliance.engine import Engine, EngineConfig, GenerationRequest, Message, Prefilled
from appliance.engine.session import ModelSession
from firmware.demo import demo_bundle
from firmware.devkit import dev_trusted_keys

RESULTS = Path(__file__).parent / "results" / "engine.md"
SENTENCE = ("The appliance keeps every decision local: shards, cache and device placement are chosen "
            "in the same process that runs the model. ")  # fmt: skip


def median_of(reps: int, fn: Callable[[], float]) -> float:
    fn()  # warm-up
    return statistics.median(fn() for _ in range(reps))


def prompt_ids(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(100, 40000, size=n).astype(np.int64)


def ours_prefill(session: ModelSession, ids: np.ndarray) -> float:
    cache = session.new_cache(len(ids) + 1)
    t = time.perf_counter()
    session.forward(cache, ids)
    return len(ids) / (time.perf_counter() - t)


def og_prefill(model: og.Model, ids: np.ndarray) -> float:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 1, do_sample=False)
    gen = og.Generator(model, params)
    t = time.perf_counter()
    gen.append_tokens(ids.astype(np.int32))
    return len(ids) / (time.perf_counter() - t)


def ours_decode(session: ModelSession, ids: np.ndarray, steps: int) -> float:
    cache = session.new_cache(len(ids) + steps + 1)
    logits = session.forward(cache, ids)
    t = time.perf_counter()
    for _ in range(steps):
        logits = session.forward(cache, np.array([int(np.argmax(logits))], dtype=np.int64))
    return steps / (time.perf_counter() - t)


def og_decode(model: og.Model, ids: np.ndarray, steps: int) -> float:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + steps + 1, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids.astype(np.int32))
    t = time.perf_counter()
    for _ in range(steps):
        gen.generate_next_token()
    return steps / (time.perf_counter() - t)


async def ttft(engine: Engine, request: GenerationRequest) -> tuple[float, int]:
    t = time.perf_counter()
    stream = engine.submit(request)
    first = 0.0
    async for event in stream:
        if isinstance(event, Prefilled) and not first:
            first = time.perf_counter() - t
    assert stream.finished is not None
    return first, stream.finished.trace.reused_tokens


def long_text(tokens: int, engine: Engine) -> str:
    text = ""
    while len(engine.tokenizer.encode(text)[0]) < tokens:
        text += SENTENCE
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = parser.parse_args()
    reps = 1 if args.quick else 5
    steps = 16 if args.quick else 128
    bundle = firmware.load(demo_bundle(), dev_trusted_keys())
    session = ModelSession(bundle)
    model = og.Model(str(bundle.root))
    rows: list[tuple[str, float, float, str, bool | None]] = []  # what, ours, theirs, unit, target met

    for n in (512, 2048):
        ids = prompt_ids(n)
        ours, theirs = [], []
        for _ in range(reps + 1):  # interleaved; the first pair is the warm-up
            ours.append(ours_prefill(session, ids))
            theirs.append(og_prefill(model, ids))
        o, g = statistics.median(ours[1:] or ours), statistics.median(theirs[1:] or theirs)
        rows.append((f"prefill, {n}-token prompt", o, g, "tokens/s", o >= g))
    ids = prompt_ids(64, seed=1)
    ours, theirs = [], []
    for _ in range(reps + 1):
        ours.append(ours_decode(session, ids, steps))
        theirs.append(og_decode(model, ids, steps))
    o, g = statistics.median(ours[1:] or ours), statistics.median(theirs[1:] or theirs)
    rows.append((f"decode, {steps} new tokens", o, g, "tokens/s", o >= g))

    one = Engine(bundle, EngineConfig(prefix_cache_bytes=0))
    sharded = Engine(bundle, EngineConfig(prefix_cache_bytes=0, max_tokens_per_shard=512))
    warm = Engine(bundle, EngineConfig(prefix_cache_bytes=512 << 20))
    try:
        text = long_text(2000, one)
        first = (Message("user", text),)
        req1 = GenerationRequest(messages=first, max_tokens=8, temperature=0.0)
        t_one, t_sharded = [], []
        for _ in range(reps + 1):
            t_one.append(asyncio.run(ttft(one, req1))[0])
            t_sharded.append(asyncio.run(ttft(sharded, req1))[0])
        a, b = statistics.median(t_one[1:] or t_one), statistics.median(t_sharded[1:] or t_sharded)
        rows.append(("prefill ~2k tokens: 512-token shards / one pass", b * 1000, a * 1000, "ms", b <= a * 1.05))

        async def turn2(engine: Engine) -> tuple[float, int]:
            answer = await engine.complete(req1)
            msgs = (*first, Message("assistant", answer[0]), Message("user", "Summarise that in one line."))
            return await ttft(engine, GenerationRequest(messages=msgs, max_tokens=8, temperature=0.0))

        cold, reused, reused_tokens = [], [], 0
        for _ in range(reps):
            cold.append(asyncio.run(turn2(one))[0])
            assert warm.prefix_cache is not None
            warm.prefix_cache.clear()  # turn 1 of each repetition starts cold
            r, reused_tokens = asyncio.run(turn2(warm))
            reused.append(r)
        c, r = statistics.median(cold), statistics.median(reused)
        rows.append((f"turn-2 TTFT, reused prefix ({reused_tokens} tokens) / cold", r * 1000, c * 1000, "ms",
                     r <= 0.2 * c))  # fmt: skip
    finally:
        for e in (one, sharded, warm):
            e.close()

    targets = {0: ">= 1.0x", 1: ">= 1.0x", 2: ">= 1.0x", 3: "overhead <= 5%", 4: "<= 0.2x"}
    header = ["| measurement | ours | baseline | ratio | target | met |", "| --- | --- | --- | --- | --- | --- |"]
    lines = []
    for i, (what, o, g, unit, met) in enumerate(rows):
        lines.append(f"| {what} | {o:.1f} {unit} | {g:.1f} {unit} | {o / g:.2f}x | {targets[i]} | "
                     f"{'yes' if met else 'NO'} |")  # fmt: skip
    table = "\n".join(header + lines)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}"
    report = f"""# Engine benchmark

Ours (appliance.engine) against onnxruntime-genai's `og.Generator`, on the demo firmware
({bundle.name} {bundle.version}, {bundle.manifest.source.get('precision')}), same model folder, same
CPU execution provider, side by side in one run (median of {reps}, interleaved, after a warm-up).
Baseline: onnxruntime-genai for rows 1-3, our one-pass prefill for row 4, our cold turn 2 for row 5.

- machine: {machine}
- onnxruntime {ort.__version__}, onnxruntime-genai {og.__version__}

{table}

Reproduce: `make bench-engine` (`.venv/bin/python bench/engine.py`).
"""
    print(table)
    if not args.quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(report)
        print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
