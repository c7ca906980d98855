"""Where the time of the steps behind issue 15's unmet targets goes, from ONNX Runtime's own
per-node profile, so the README's explanations can be reproduced rather than taken on trust.

1. Model runs on the demo firmware, each alone and repeated (median): a decode of 7 rows with the
   short histories the fairness check's streams have before a long prompt arrives, and with the
   histories they reach while it prefills; the smallest prompt chunk (2 tokens) at the end of a
   2000-token prompt, and an early chunk; a decode of 1 and of 8 rows. For each: the run's time,
   and within it GroupQueryAttention (attention), the weight matmuls (MatMulNBits in the int8 demo)
   and the rest. The
   fairness floor follows from them: while a long prompt's last chunks run between the streams'
   steps, a step is at least a decode at the late histories plus the smallest chunk, whatever the
   chunk budget decides (why a long prompt now runs on the prefill lane instead, lane.py).
2. Single-stream decode, per token of a 128-token answer: one-row decode runs bare, the engine in
   process, and the daemon over its Unix socket as the benchmark's client sees it, alternating; and
   while the daemon answers, the CPU of its event loop (its main thread), of its model threads (the
   worker and ONNX Runtime's pool) and of the client, from /proc and getrusage. On 2 cores the
   model's two threads leave no core idle, so what the loop and the client spend is taken from it.
3. Eight streams against one (the concurrency table's 3x target): each weight matmul shape of the
   graph timed alone at 1-16 rows, and the prefill each request of the concurrency table runs;
   with section 1's one-row and eight-row decodes, the most 8 streams can get over one.

    .venv/bin/python -m bench.step_profile    # about four minutes; writes bench/results/step-profile.md
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import resource
import socket
import statistics
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from appliance.engine.session import KVCache, ModelSession
from bench.host import load_average, machine
from bench.streams import ANSWER_TOKENS, ROUNDS, story_prompt
from firmware import Bundle

RESULTS = Path(__file__).resolve().parent / "results" / "step-profile.md"
# The weights are MatMulNBits in a quantized graph (the demo: int8), MatMul in an fp32 one.
OP_GROUPS = {"GroupQueryAttention": "attention", "MatMulNBits": "weight matmuls", "MatMul": "weight matmuls"}
GROUPS = [*dict.fromkeys(OP_GROUPS.values()), "other nodes"]


@dataclass(frozen=True)
class Lengths:
    """The histories of the fairness check (bench/engine.py section 5) on the demo firmware."""

    early: int = 80  # the 7 streams' positions when the long prompt arrives
    late: int = 430  # theirs when its last chunk runs (its prefill takes about 10 s)
    prompt: int = 1950  # where the long prompt's last chunks start
    early_chunk_at: int = 100
    early_chunk: int = 16
    small_chunk: int = 2  # the scheduler's smallest chunk (MIN_CHUNK_TOKENS)
    streams: int = 7


@dataclass
class RunProfile:
    """One model run: its time and its nodes' times by op group, in milliseconds (in section 1,
    the time is the plain session's run and the groups the profiled one's)."""

    total: float
    ops: dict[str, float] = field(default_factory=dict)


def read_profile(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """ONNX Runtime's profile file: its model runs in order, and its kernel (node) events."""
    events = json.loads(path.read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    nodes = [e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]
    return runs, nodes


def by_run(runs: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> list[RunProfile]:
    """Each run's time and its nodes' times summed by op group (the event times are µs)."""
    profiles = [RunProfile(int(run["dur"]) / 1000) for run in runs]
    starts = [int(run["ts"]) for run in runs]
    for node in nodes:
        ts = int(node["ts"])
        i = bisect.bisect_right(starts, ts) - 1
        if i < 0 or ts > starts[i] + int(runs[i]["dur"]):
            continue  # a node outside every run (one before the runs asked about)
        op = str(node.get("args", {}).get("op_name", "?"))
        group = OP_GROUPS.get(op, "other nodes")
        profiles[i].ops[group] = profiles[i].ops.get(group, 0.0) + int(node["dur"]) / 1000
    return profiles


def _median_ops(profiles: list[RunProfile]) -> dict[str, float]:
    return {g: statistics.median(p.ops.get(g, 0.0) for p in profiles) for g in GROUPS}


def _fill(session: ModelSession, cache: KVCache, tokens: int, rng: np.random.Generator) -> None:
    """Prefill real keys and values: a row only given a length reads the kernel's zero page, which
    stays in cache, and its attention looks a third cheaper than it is."""
    step = 256
    while cache.length < tokens:
        n = min(step, tokens - cache.length)
        session.forward(cache, rng.integers(10, session.facts.vocab_size, n).astype(np.int64))


def _kinds(session: ModelSession, lengths: Lengths, rng: np.random.Generator) -> dict[str, Callable[[], object]]:
    """The runs of section 1 on this session, by key, over KV rows filled for them here."""
    slots = session.new_slots(lengths.streams + 1, lengths.prompt + lengths.small_chunk + 8)
    prompt = slots.row(lengths.streams)
    early_prompt = session.new_slots(1, lengths.early_chunk_at + lengths.early_chunk + 8).row(0)
    _fill(session, early_prompt, lengths.early_chunk_at, rng)
    _fill(session, prompt, lengths.prompt, rng)
    for i in range(lengths.streams):
        _fill(session, slots.row(i), lengths.late, rng)

    def decode(rows: int, at: int) -> Callable[[], object]:
        # Each run rewrites position `at`, so every repetition runs at the same length.
        return lambda: session.decode(slots, np.full(rows, 7, dtype=np.int64), np.full(rows, at))

    def chunk(cache: KVCache, n: int) -> Callable[[], object]:
        def run() -> None:
            session.forward(cache, rng.integers(10, session.facts.vocab_size, n).astype(np.int64))
            cache.length -= n  # the next repetition runs at the same position

        return run

    return {
        "before": decode(lengths.streams, lengths.early), "late": decode(lengths.streams, lengths.late),
        "last chunk": chunk(prompt, lengths.small_chunk), "early chunk": chunk(early_prompt, lengths.early_chunk),
        "one row": decode(1, lengths.early), "all rows": decode(lengths.streams + 1, lengths.early),
    }  # fmt: skip


def profile_steps(bundle: Bundle, lengths: Lengths, reps: int, threads: int) -> dict[str, RunProfile]:
    """Section 1: each run's time on a plain session, and where its time goes on a profiled one
    (the profiler's own bookkeeping adds some 5 µs to every node, about 1.5 ms to a run), `reps`
    times after a warm-up, the kinds interleaved in alternating order."""
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        plain = _kinds(ModelSession(bundle, intra_op_threads=threads), lengths, rng)
        profiled_session = ModelSession(bundle, intra_op_threads=threads, profile_prefix=str(Path(tmp) / "steps"))
        profiled = _kinds(profiled_session, lengths, rng)
        # One session at a time: ONNX Runtime's threads spin for a while after a run, and another
        # session's spinning threads would take the cores from this one's run.
        order: list[str] = []
        times: dict[str, list[float]] = {name: [] for name in plain}
        for rep in range(reps + 1):  # the first, a warm-up, is left out
            for name in plain if rep % 2 else reversed(plain):
                t0 = time.perf_counter()
                plain[name]()
                if rep:
                    times[name].append((time.perf_counter() - t0) * 1000)
        for rep in range(reps + 1):
            for name in profiled if rep % 2 else reversed(profiled):
                profiled[name]()
                order.append(name if rep else "")
        runs, nodes = read_profile(Path(profiled_session.session.end_profiling()))
    profiles = by_run(runs[-len(order) :], nodes)
    return {name: RunProfile(statistics.median(times[name]),
                             _median_ops([p for p, n in zip(profiles, order, strict=True) if n == name]))
            for name in plain}  # fmt: skip


def labels(lengths: Lengths) -> dict[str, str]:
    """What each run of `profile_steps` is, for the table."""
    n, rows = lengths.streams, lengths.streams + 1
    return {
        "before": f"decode, {n} rows after {lengths.early} positions (the streams before)",
        "late": f"decode, {n} rows after {lengths.late} positions (the streams at the prompt's end)",
        "last chunk": f"chunk of {lengths.small_chunk} tokens after {lengths.prompt} (the prompt's last chunks)",
        "early chunk": f"chunk of {lengths.early_chunk} tokens after {lengths.early_chunk_at} (an early chunk)",
        "one row": f"decode, 1 row after {lengths.early} positions",
        "all rows": f"decode, {rows} rows after {lengths.early} positions",
    }


def steps_table(profiles: dict[str, RunProfile], lengths: Lengths) -> list[str]:
    """Each run's time, and each op group's share of its nodes' time under the profiler."""
    lines = [f"| run | ms | {' | '.join(GROUPS)} |", f"| --- | --- |{' --- |' * len(GROUPS)}"]
    for key, label in labels(lengths).items():
        p = profiles[key]
        nodes = sum(p.ops.values()) or 1.0
        lines.append(f"| {label} | {p.total:.1f} | {' | '.join(f'{p.ops[g] / nodes:.0%}' for g in GROUPS)} |")
    return lines


def fairness_floor(profiles: dict[str, RunProfile]) -> tuple[float, float, float]:
    """(before, floor, ratio): the streams' decode before the prompt, the least a step with the
    prompt's last chunk can take (the late decode plus the smallest chunk), and their ratio."""
    before = profiles["before"].total
    floor = profiles["late"].total + profiles["last chunk"].total
    return before, floor, floor / before


# --- 2. the CPU a streamed token costs, by thread -----------------------------------------------


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of a process, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


@dataclass
class SingleStream:
    """Per streamed token of a 128-token answer, in ms: each path's median over the repetitions, the
    median of each repetition's difference between neighbouring paths (the paths of one repetition
    run within a few seconds, so the machine's drift cancels there), and the CPU spent during the
    daemon's answers, by whom."""

    daemon: float  # wall time through the daemon over its Unix socket
    bare: float  # one-row decode runs back to back in this process (no engine, no HTTP, no profiler)
    engine: float  # the engine in this process: its worker's sampling, detokenizing and hand-over
    engine_over_bare: float
    daemon_over_engine: float
    loop_cpu: float  # the daemon's main thread (its event loop: HTTP, streaming)
    model_cpu: float  # the daemon's other threads (the engine worker and ONNX Runtime's pool)
    client_cpu: float  # the benchmark's client (this process's main thread: httpx, SSE parsing)


def single_stream(bundle: Bundle, threads: int, reps: int) -> SingleStream:
    """The three paths of a single-stream answer, interleaved in alternating order (their
    differences are a few percent, less than the machine drifts between runs of a minute)."""
    from appliance.engine import Engine, EngineConfig, GenerationRequest, Message, TextDelta
    from bench.streams import one_request, zerolayer_daemon

    engine = Engine(bundle, EngineConfig(prefix_cache_bytes=0, intra_op_threads=threads))
    session = ModelSession(bundle, intra_op_threads=threads)
    cache = session.new_cache(200)
    _fill(session, cache, 60, np.random.default_rng(1))
    times: dict[str, list[float]] = {"daemon": [], "bare": [], "engine": []}
    cpu = {"loop": 0.0, "model": 0.0, "client": 0.0, "tokens": 0.0}

    def bare(i: int) -> float:
        lengths, token, gaps = np.zeros(1, dtype=np.int64), np.full(1, 7, dtype=np.int64), []
        for n in range(128):
            lengths[0] = 60 + n
            t0 = time.perf_counter()
            session.decode(cache.slots, token, lengths)
            gaps.append(time.perf_counter() - t0)
        return statistics.median(gaps) * 1000

    def in_engine(i: int) -> float:
        async def go() -> list[float]:
            request = GenerationRequest(messages=(Message("user", story_prompt(i)),), max_tokens=128,
                                        temperature=0)  # fmt: skip
            return [time.perf_counter() async for e in engine.submit(request) if isinstance(e, TextDelta)]

        return _ms_per_gap(asyncio.run(go()))

    with tempfile.TemporaryDirectory() as tmp, zerolayer_daemon(Path(tmp), 8, threads) as endpoint:
        pid = daemon_pid(endpoint.uds)

        def through_daemon(i: int) -> float:
            async def go() -> list[float]:
                async with endpoint.client() as http:
                    return (await one_request(http, endpoint, story_prompt(i), 128)).chunks

            before, mine = thread_cpu(pid), resource.getrusage(resource.RUSAGE_THREAD)
            stamps = asyncio.run(go())
            after, mine_after = thread_cpu(pid), resource.getrusage(resource.RUSAGE_THREAD)
            spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
            cpu["loop"] += spent.get(pid, 0.0)
            cpu["model"] += sum(v for tid, v in spent.items() if tid != pid)
            cpu["client"] += mine_after.ru_utime + mine_after.ru_stime - mine.ru_utime - mine.ru_stime
            cpu["tokens"] += len(stamps)
            return _ms_per_gap(stamps)

        paths = {"daemon": through_daemon, "bare": bare, "engine": in_engine}
        for run in paths.values():  # warm
            run(0)
        cpu = dict.fromkeys(cpu, 0.0)
        for i in range(1, reps + 1):
            for name, run in paths.items() if i % 2 else reversed(paths.items()):
                times[name].append(run(i))
    engine.close()
    per_token = {k: v / cpu["tokens"] * 1000 for k, v in cpu.items() if k != "tokens"}
    median = {k: statistics.median(v) for k, v in times.items()}
    over = {(a, b): statistics.median(x - y for x, y in zip(times[a], times[b], strict=True))
            for a, b in (("engine", "bare"), ("daemon", "engine"))}  # fmt: skip
    return SingleStream(median["daemon"], median["bare"], median["engine"], over[("engine", "bare")],
                        over[("daemon", "engine")], per_token["loop"], per_token["model"],
                        per_token["client"])  # fmt: skip


def _ms_per_gap(stamps: list[float]) -> float:
    """Milliseconds between streamed tokens on average, from their arrival times."""
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1000


def daemon_pid(socket_path: str | None) -> int:
    """The process that listens on the daemon's Unix socket (its peer credentials)."""
    assert socket_path is not None
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(socket_path)
        creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[0])


def single_stream_lines(r: SingleStream) -> list[str]:
    return [
        "| what | ms per streamed token |",
        "| --- | --- |",
        f"| the same decode run bare, in process, back to back | {r.bare:.2f} |",
        f"| the engine in process (its worker's sampling, detokenizing and hand-over; no HTTP) | {r.engine:.2f} |",
        f"| through the daemon over its Unix socket, as the benchmark's client sees it | {r.daemon:.2f} |",
        f"| CPU meanwhile: the daemon's model threads (worker and ONNX Runtime's pool) | {r.model_cpu:.2f} |",
        f"| CPU meanwhile: the daemon's event loop (HTTP over the Unix socket, streaming) | {r.loop_cpu:.2f} |",
        f"| CPU meanwhile: the benchmark's client (httpx, SSE parsing) | {r.client_cpu:.2f} |",
    ]


# --- 3. eight streams against one: the bound the model's runs set -----------------------------

BATCH_ROWS = (1, 2, 4, 8, 16)
CONCURRENCY_PROMPTS = 8 * ROUNDS  # the prompts of the concurrency table's 8-stream row


@dataclass(frozen=True)
class MatMulShape:
    """The weight matmuls of one shape in the graph: MatMulNBits' attributes and how many nodes."""

    k: int
    n: int
    bits: int
    block_size: int
    accuracy_level: int
    nodes: int


def matmul_shapes(bundle: Bundle) -> list[MatMulShape]:
    """The graph's MatMulNBits nodes by shape, the most numerous first."""
    import onnx
    from onnx import helper

    graph_dir, facts = bundle.graph("cpu")
    model = onnx.load(str(graph_dir / facts.onnx_file), load_external_data=False)
    counts: dict[tuple[int, ...], int] = {}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            key = tuple(int(attrs.get(name, default)) for name, default in
                        (("K", 0), ("N", 0), ("bits", 4), ("block_size", 32), ("accuracy_level", 0)))  # fmt: skip
            counts[key] = counts.get(key, 0) + 1
    return [MatMulShape(k, n, bits, block, level, nodes)
            for (k, n, bits, block, level), nodes in sorted(counts.items(), key=lambda kv: -kv[1])]  # fmt: skip


def matmul_by_rows(shape: MatMulShape, threads: int, reps: int) -> dict[int, float]:
    """Microseconds of one MatMulNBits node of this shape (random weights, the same kernel the
    graph's node takes) for each row count of BATCH_ROWS, run back to back so the weights stay in
    the caches: the kernel's own cost at each batch, without the weights' trip from memory."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    blocks = -(-shape.k // shape.block_size)
    weights = rng.integers(0, 256, (shape.n, blocks, shape.block_size * shape.bits // 8), dtype=np.uint8)
    scales = (rng.random(shape.n * blocks, dtype=np.float32) * 0.01).astype(np.float32)
    zero_points = rng.integers(0, 256, shape.n * -(-blocks * shape.bits // 8), dtype=np.uint8)
    node = helper.make_node("MatMulNBits", ["x", "w", "s", "z"], ["y"], domain="com.microsoft", K=shape.k,
                            N=shape.n, bits=shape.bits, block_size=shape.block_size,
                            accuracy_level=shape.accuracy_level)  # fmt: skip
    graph = helper.make_graph(
        [node], "matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", shape.k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", shape.n])],
        [numpy_helper.from_array(a, name) for a, name in ((weights, "w"), (scales, "s"), (zero_points, "z"))],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {rows: {"x": rng.random((rows, shape.k), dtype=np.float32)} for rows in BATCH_ROWS}
    runs: dict[int, list[float]] = {rows: [] for rows in BATCH_ROWS}
    for rep in range(reps + 1):  # the first, a warm-up, is left out; the batches interleaved
        for rows in BATCH_ROWS if rep % 2 else reversed(BATCH_ROWS):
            t0 = time.perf_counter()
            for _ in range(50):
                session.run(None, feeds[rows])
            if rep:
                runs[rows].append((time.perf_counter() - t0) / 50 * 1e6)
    return {rows: statistics.median(times) for rows, times in runs.items()}


@dataclass
class StreamsBound:
    shapes: list[tuple[MatMulShape, dict[int, float]]]
    prompt_tokens: int  # the median concurrency-table prompt, through the chat template
    reused: int  # of those, what the prefix pool holds for every request (its first block)
    prefill_ms: float  # the rest of that prompt, prefilled on a row holding the reused part


def streams_bound(bundle: Bundle, threads: int, reps: int) -> StreamsBound:
    """What bounds 8 streams against one: the weight matmuls' cost by batch, and the prefill every
    request of the concurrency table runs beside its answer."""
    from appliance.engine import EngineConfig, Message
    from appliance.engine.chat import ChatTemplate
    from appliance.engine.tokenizer import TextTokenizer
    shapes = [(shape, matmul_by_rows(shape, threads, reps)) for shape in matmul_shapes(bundle)]
    template = ChatTemplate(bundle.chat_template, TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path))
    lengths = sorted(len(template.prompt([Message("user", story_prompt(i))]).ids) for i in range(CONCURRENCY_PROMPTS))
    tokens = lengths[len(lengths) // 2]
    reused = EngineConfig().prefix_block_tokens
    session = ModelSession(bundle, intra_op_threads=threads)
    rng = np.random.default_rng(2)
    cache = session.new_cache(tokens + 8)
    _fill(session, cache, reused, rng)
    ids = rng.integers(10, session.facts.vocab_size, tokens - reused).astype(np.int64)
    times = []
    for rep in range(reps + 1):
        t0 = time.perf_counter()
        session.forward(cache, ids)
        if rep:  # the first, a warm-up, is left out
            times.append((time.perf_counter() - t0) * 1000)
        cache.length = reused
    return StreamsBound(shapes, tokens, reused, statistics.median(times))


def streams_lines(bound: StreamsBound, profiles: dict[str, RunProfile], lengths: Lengths) -> list[str]:
    rows = lengths.streams + 1
    one, all_rows = profiles["one row"].total, profiles["all rows"].total
    per_request = bound.prefill_ms / ANSWER_TOKENS  # a prompt's prefill, spread over its answer's tokens
    decode_only = rows * one / all_rows
    with_prefill = (one + per_request) / (all_rows / rows + per_request)
    head = " | ".join(f"{r} row{'s' if r > 1 else ''}" for r in BATCH_ROWS)
    lines = [f"| weight matmul K x N (nodes) | {head} |", f"| --- |{' --- |' * len(BATCH_ROWS)}"]
    if not bound.shapes:
        lines = ["No MatMulNBits in this graph (its weights are not quantized): no kernel table."]
    for shape, by_rows in bound.shapes:
        cells = " | ".join(f"{by_rows[r]:.0f} µs ({by_rows[r] / by_rows[1]:.1f}x)" for r in BATCH_ROWS)
        lines.append(f"| {shape.k} x {shape.n}, {shape.bits}-bit, block {shape.block_size} ({shape.nodes}) | {cells} |")
    in_cache = {r: sum(shape.nodes * by_rows[r] for shape, by_rows in bound.shapes) / 1000 for r in (1, rows)}
    profiled = {r: profiles[key].ops.get("weight matmuls", 0.0) for r, key in ((1, "one row"), (rows, "all rows"))}
    lines += [
        "",
        f"- The graph's weight matmuls, summed from this table: {in_cache[1]:.1f} ms at one row, "
        f"{in_cache[rows]:.1f} ms at {rows}; in section 1's runs (profiled, the weights read from memory) "
        f"{profiled[1]:.1f} and {profiled[rows]:.1f} ms.",
        f"- Decode alone (section 1: {one:.1f} ms for one row, {all_rows:.1f} ms for {rows}): {rows} streams "
        f"can get at most **{decode_only:.2f}x** one stream's tokens/s.",
        f"- Each request of the concurrency table also prefills its prompt: {bound.prompt_tokens} tokens (the "
        f"median), {bound.reused} of them from the prefix pool, the other {bound.prompt_tokens - bound.reused} "
        f"in {bound.prefill_ms:.1f} ms, once per {ANSWER_TOKENS} answer tokens, at any number of streams. "
        f"With it, {rows} streams can get at most **{with_prefill:.2f}x** one stream.",
    ]
    return lines


# --- report ------------------------------------------------------------------------------------


def report(bundle: Bundle, lengths: Lengths, reps: int, threads: int, requests: int) -> str:
    load_start = load_average()
    profiles = profile_steps(bundle, lengths, reps, threads)
    before, floor, ratio = fairness_floor(profiles)
    print("\n".join(steps_table(profiles, lengths)), flush=True)
    single = single_stream(bundle, threads, requests)
    print("\n".join(single_stream_lines(single)), flush=True)
    bound = streams_bound(bundle, threads, reps)
    print("\n".join(streams_lines(bound, profiles, lengths)), flush=True)
    return f"""# Step profile: where the unmet targets' time goes

{bundle.name} {bundle.version}, CPU execution provider, {threads} intra-op threads. Reproduce:
`.venv/bin/python -m bench.step_profile` (about four minutes).

- machine: {machine()}
- load average (1, 5, 15 min): {load_start} at the start, {load_average()} at the end

## 1. Model runs, each alone (median of {reps}; the op groups' shares of the run's node time under the profiler)

{chr(10).join(steps_table(profiles, lengths))}

The fairness floor with chunks between the streams' steps (`engine.prefill_lane = false`; with the
lane, the prompt runs on its own core beside the steps): while the long prompt's last chunks run,
a step takes at least the decode at the late histories plus the smallest chunk: {floor:.1f} ms
against the {before:.1f} ms of a step before the prompt arrived, **{ratio:.2f}x** before any noise,
against a target of 3x for the P99. Attention is what grows: the streams' own histories grow while
the prompt prefills, and a chunk of two or more tokens takes ONNX Runtime's GroupQueryAttention
path that copies every earlier key and value once per query head.

## 2. Single-stream decode: from the bare run to the client (median of {requests}, the paths alternating)

{chr(10).join(single_stream_lines(single))}

The median difference within a repetition: from the bare run to the engine, the worker's own work
adds {single.engine_over_bare:.2f} ms a token; from the engine to the daemon's client,
{single.daemon_over_engine:.2f} ms. With ONNX Runtime's two threads on both cores during a run, what
the event loop and the client spend meanwhile is taken from the model's run, not done beside it.

## 3. Eight streams against one: the bound the model's runs set (median of {reps})

{chr(10).join(streams_lines(bound, profiles, lengths))}

The table times one weight matmul of each of the graph's shapes alone, back to back, so its
weights stay in the caches: the kernel's own cost at each batch. ONNX Runtime's int8 kernel
quantizes the rows block by block and scales every block's sum, and from a few rows on its cost
grows with the rows: 8 rows cost a multiple of one. One row's decode is bound by the weights'
trip from memory, which 8 rows share; their compute is what 8 rows add. The prompts' prefill
costs the same per request however many streams run, so it weighs more beside 8 rows' cheap
tokens than beside one row's. What the daemon reaches (bench/engine.py section 4) stays below
the bound by its worker's own work between runs (choosing, detokenizing and handing over each
row's token, and storing each finished request's prefix), while ONNX Runtime's pool waits.
"""


def main(argv: list[str] | None = None) -> int:
    from firmware import load
    from firmware.toolchain.demo import demo_bundle
    from firmware.toolchain.devkit import dev_trusted_keys

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--requests", type=int, default=9, help="repetitions of each single-stream path")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    bundle = load(demo_bundle(), dev_trusted_keys())
    args.out.write_text(report(bundle, Lengths(), args.reps, args.threads, args.requests))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
