"""The engine on real ONNX Runtime sessions: the tiny fixture against transformers, sharding,
prefix reuse, concurrency, cancellation, limits; the demo firmware end to end."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

import firmware
from appliance.engine import (
    ContextOverflow,
    Engine,
    EngineConfig,
    Finished,
    GenerationFailed,
    GenerationRequest,
    InvalidRequest,
    Message,
    ModelSession,
    Prefilled,
    Stream,
    TextDelta,
)
from appliance.engine.prefix_cache import block_digests
from appliance.engine.session import KVCache
from appliance.engine.shards import plan_shards

CONVERSATION = (
    Message("user", "Explain the for statement and how the else clause of a loop works."),
    Message("assistant", "The for statement iterates over the items of any sequence, in order."),
    Message("user", "And what does break do inside a while loop with an else clause?"),
)


@pytest.fixture(scope="module")
def bundle(tiny_bundle_path: Path, trusted_keys: Path) -> firmware.Bundle:
    return firmware.load(tiny_bundle_path, trusted_keys)


@pytest.fixture(scope="module")
def hf_model(tiny_hf_path: Path):  # type: ignore[no-untyped-def]
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_hf_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(bundle: firmware.Bundle):  # type: ignore[no-untyped-def]
    eng = Engine(bundle, EngineConfig(prefix_cache_bytes=0))
    yield eng
    eng.close()


def _hf_logits(model, ids: list[int]) -> np.ndarray:  # type: ignore[no-untyped-def]
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def _prompt_ids(bundle: firmware.Bundle, messages: tuple[Message, ...] = CONVERSATION) -> list[int]:
    from appliance.engine.chat import ChatTemplate
    from appliance.engine.tokenizer import TextTokenizer

    tok = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    return ChatTemplate(bundle.chat_template, tok).prompt(messages).ids


def _run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def _in_loop(fn):  # type: ignore[no-untyped-def]
    return fn()


def _greedy(max_tokens: int = 32, messages: tuple[Message, ...] = CONVERSATION, **kw) -> GenerationRequest:  # type: ignore[no-untyped-def]
    return GenerationRequest(messages=messages, max_tokens=max_tokens, temperature=0.0, **kw)


def test_prefill_logits_match_transformers(bundle: firmware.Bundle, hf_model) -> None:  # type: ignore[no-untyped-def]
    ids = _prompt_ids(bundle)
    ref = _hf_logits(hf_model, ids)
    full = ModelSession(bundle, last_position_logits=False).all_logits(np.array(ids, dtype=np.int64))
    assert full.shape == ref.shape
    assert np.abs(full - ref).max() <= 1e-4
    fast = ModelSession(bundle)  # the shipping graph: LM head on the last position only
    assert fast.last_position_logits
    last = fast.forward(fast.new_cache(len(ids)), np.array(ids, dtype=np.int64))
    assert np.abs(last - ref[-1]).max() <= 1e-4


def test_greedy_tokens_match_transformers_for_32_steps(bundle: firmware.Bundle, hf_model) -> None:  # type: ignore[no-untyped-def]
    ids = _prompt_ids(bundle)
    ref_ids = list(ids)
    for _ in range(32):
        ref_ids.append(int(_hf_logits(hf_model, ref_ids)[-1].argmax()))
    session = ModelSession(bundle)
    cache = session.new_cache(len(ids) + 32)
    logits = session.forward(cache, np.array(ids, dtype=np.int64))
    ours = []
    for _ in range(32):
        ours.append(int(logits.argmax()))
        logits = session.forward(cache, np.array([ours[-1]], dtype=np.int64))
    assert ours == ref_ids[len(ids) :]


@pytest.mark.parametrize("algorithm", ["fixed", "semantic"])
@pytest.mark.parametrize("shard", [7, 16, 33])
def test_sharded_prefill_equals_one_pass(bundle: firmware.Bundle, algorithm: str, shard: int) -> None:
    from appliance.engine.chat import ChatTemplate
    from appliance.engine.tokenizer import TextTokenizer

    tok = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    prompt = ChatTemplate(bundle.chat_template, tok).prompt(CONVERSATION)
    # Where the second and third messages begin, and where the messages end (the generation prompt begins)
    assert len(prompt.message_starts) == 3 and prompt.message_starts[-1] == prompt.history_end < len(prompt.ids)
    session = ModelSession(bundle)
    ids = np.array(prompt.ids, dtype=np.int64)
    one = session.forward(session.new_cache(len(ids)), ids)
    plan = plan_shards(0, len(ids), shard, algorithm, prompt.message_starts)
    assert len(plan.shards) > 1
    cache = session.new_cache(len(ids))
    for a, b in plan.shards:
        logits = session.forward(cache, ids[a:b])
    assert np.abs(logits - one).max() <= 1e-4


def test_a_slot_takes_chunks_of_any_length_on_either_graph(bundle: firmware.Bundle) -> None:
    ids = np.array(_prompt_ids(bundle), dtype=np.int64)
    for edited in (True, False):  # a model whose graph cannot be edited runs the plain one
        session = ModelSession(bundle, last_position_logits=edited)
        one = session.forward(session.new_cache(len(ids)), ids)
        slots = session.new_slots(2, len(ids) + 4)
        cache = slots.row(1)
        for a, b in ((0, 5), (5, 19), (19, len(ids))):  # one row, three shapes, one binding
            logits = session.forward(cache, ids[a:b])
        assert np.abs(logits - one).max() <= 1e-4
        batch = session.decode(slots, np.array([7, int(one.argmax())]), np.array([0, cache.length]))
        alone = session.forward(cache, np.array([int(one.argmax())]))
        assert np.abs(batch[1] - alone).max() <= 1e-4  # the next token, alone or beside another row


def _decode_one(session: ModelSession, cache: KVCache, token: int) -> np.ndarray:
    """One decode step of a cache's row alone, as the worker runs it; a copy of its logits."""
    logits = session.decode(cache.slots, np.array([token]), np.array([cache.length]))[0].copy()
    cache.length += 1
    return logits


def test_one_row_alternates_chunks_and_decode_steps_on_either_graph(bundle: firmware.Bundle) -> None:
    """A lone stream's prompt chunks and decode steps run through one binding (row 0 of one row):
    a decode binds its own ids, mask and logits again after a chunk bound others, even where its
    mask keeps the width it had before the chunk, and a chunk after a decode runs on its own
    inputs."""
    ids = np.array(_prompt_ids(bundle), dtype=np.int64)
    assert len(ids) > 16
    for edited in (True, False):
        session = ModelSession(bundle, last_position_logits=edited)
        assert session.mask_width_step > 13  # the two steps below bind one mask width
        mixed, alone = session.new_cache(len(ids) + 4), session.new_cache(len(ids) + 4)

        start = 0
        for chunk_end in (8, 12):  # two decode steps with masks of one width, a chunk between
            session.forward(mixed, ids[start:chunk_end])
            got = _decode_one(session, mixed, int(ids[chunk_end]))
            want = session.forward(alone, ids[start : chunk_end + 1])
            assert np.abs(got - want).max() <= 1e-4
            start = chunk_end + 1
        got, want = session.forward(mixed, ids[start:]), session.forward(alone, ids[start:])
        assert np.abs(got - want).max() <= 1e-4
        for _ in range(2):
            token = int(want.argmax())
            got, want = _decode_one(session, mixed, token), session.forward(alone, np.array([token]))
            assert np.abs(got - want).max() <= 1e-4


async def _collect(engine: Engine, request: GenerationRequest) -> tuple[str, Finished, list[object]]:
    events: list[object] = []
    async for e in engine.submit(request):
        events.append(e)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    done = events[-1]
    assert isinstance(done, Finished)
    return text, done, events


def _vma_kib(address: int) -> dict[str, int]:
    """The kernel's accounting (kB) of the mapping that holds `address` (/proc/self/smaps)."""
    found: dict[str, int] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if not parts[0].endswith(":"):  # a mapping's first line: its address range
            if found is not None:
                return found
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            found = {} if lo <= address < hi else None
        elif found is not None and parts[-1] == "kB":
            found[parts[0].rstrip(":")] = int(parts[1])
    assert found is not None, f"no mapping holds {address:#x}"
    return found


def test_a_released_kv_row_is_the_kernels_to_take_back_and_still_takes_the_next_request(
        bundle: firmware.Bundle) -> None:  # fmt: skip
    session = ModelSession(bundle)
    slots = session.new_slots(2, 4096)
    f = session.facts
    keys = np.random.default_rng(0).random((f.num_kv_heads, 4096, f.head_size), dtype=np.float32)
    for layer in range(f.num_layers):
        slots.write(layer, 1, 0, keys, keys)
    mapped = slots.pointers[0][0]  # layer 0's keys: one mapping of both rows
    row_kib = slots.layer_row_bytes[0] // 1024
    before = _vma_kib(mapped)  # the kernel may have merged it with a neighbour, released rows and all
    assert before["Rss"] >= row_kib
    slots.release(1)
    after = _vma_kib(mapped)
    # Counted as free for the taking (MemAvailable includes it), not dropped: the next request in
    # the row writes into the same pages without a fault for each.
    assert after["LazyFree"] - before["LazyFree"] >= row_kib - 4
    slots.write(0, 1, 0, keys[:, :100], keys[:, :100])
    assert np.array_equal(slots.read(0, 1, 0, 100)[0], keys[:, :100])


def test_engine_stream_matches_transformers_greedy(bundle: firmware.Bundle, engine: Engine, hf_model) -> None:  # type: ignore[no-untyped-def]
    ids = _prompt_ids(bundle)
    ref = list(ids)
    eos = set(bundle.model.eos_token_ids)
    for _ in range(24):
        nxt = int(_hf_logits(hf_model, ref)[-1].argmax())
        if nxt in eos:
            break
        ref.append(nxt)
    expected = engine.tokenizer.decode(ref[len(ids) :])
    text, done, events = _run(_collect(engine, _greedy(24)))
    assert text == expected
    assert isinstance(events[0], Prefilled)  # the decision comes before the first delta
    assert done.input_tokens == len(ids)
    assert done.output_tokens == len(ref) - len(ids)
    assert done.stop_reason == ("max_tokens" if done.output_tokens == 24 else "end_turn")


def test_sharded_engine_generates_the_same_text(bundle: firmware.Bundle, engine: Engine) -> None:
    cold, _, _ = _run(_collect(engine, _greedy(16)))
    for algorithm in ("fixed", "semantic"):
        object.__setattr__(bundle.manifest.layer, "split_algorithm", algorithm)
        sharded = Engine(bundle, EngineConfig(max_tokens_per_shard=16, prefix_cache_bytes=0))
        try:
            text, done, _ = _run(_collect(sharded, _greedy(16)))
        finally:
            sharded.close()
            object.__setattr__(bundle.manifest.layer, "split_algorithm", "semantic")
        assert text == cold
        assert done.trace.shards > 1 and done.trace.shard_reason.startswith(algorithm)


def test_prefix_reuse_equals_cold_generation(bundle: firmware.Bundle, engine: Engine) -> None:
    warm = Engine(bundle, EngineConfig(prefix_cache_bytes=64 << 20, prefix_block_tokens=8))
    try:
        first_text, first, _ = _run(_collect(warm, _greedy(12)))
        turn2 = (*CONVERSATION, Message("assistant", first_text), Message("user", "Give an example."))
        prior = tuple(first.trace.digests)
        text, done, _ = _run(_collect(warm, _greedy(12, turn2, prior_digests=prior)))
    finally:
        warm.close()
    cold_text, cold, _ = _run(_collect(engine, _greedy(12, turn2)))
    assert done.trace.reused_tokens >= 8 * (first.input_tokens // 8)  # at least the whole first prompt
    assert cold.trace.reused_tokens == 0
    assert text == cold_text
    assert done.trace.prior_digests_total == len(prior) == 10
    assert done.trace.prior_digests_found > 0
    assert f"found {done.trace.prior_digests_found}/10 digests" in done.trace.lines()[1]


def test_default_blocks_reuse_a_short_shared_system_prompt(bundle: firmware.Bundle) -> None:
    """Two questions under one short system prompt (what a chat template's own system part is, 24
    tokens for SmolLM2): with the default block size the second reuses every full block of their
    shared start, and answers as it does cold."""
    warm = Engine(bundle, EngineConfig(prefix_cache_bytes=16 << 20))
    block = warm.config.prefix_block_tokens
    first, second = (_greedy(8, (Message("system", "You answer briefly."),
                                 Message("user", q))) for q in ("What does try do?", "Explain the with statement."))
    try:
        a, b = warm.prepare(first).ids, warm.prepare(second).ids
        shared = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        _run(_collect(warm, first))
        text, done, _ = _run(_collect(warm, second))
    finally:
        warm.close()
    cold = Engine(bundle, EngineConfig(prefix_cache_bytes=0))
    try:
        cold_text, _, _ = _run(_collect(cold, second))
    finally:
        cold.close()
    assert 16 <= shared < 32, f"the two prompts share {shared} tokens"
    assert done.trace.reused_tokens == shared // block * block > 0
    assert text == cold_text


QUESTIONS = [
    "Hi.",
    "Question 1: what does the for statement do?",
    "Explain, in a few words, how a while loop with an else clause behaves when break runs inside it.",
    "What does try do?",
    "Question 4: with statement? " * 6,
    "def",
    "Question 6: what does the class statement do, and how does inheritance pick a method?",
    "Return values: " * 12,
]


async def _staggered(engine: Engine, requests: list[GenerationRequest], gap: float = 0.004) -> list[str]:
    """Submit one after another, `gap` seconds apart, so each joins a batch already running."""
    return [t for t, _ in await _staggered_runs(engine, requests, gap)]


async def _staggered_runs(engine: Engine, requests: list[GenerationRequest],
                          gap: float = 0.004) -> list[tuple[str, Finished]]:  # fmt: skip
    tasks = []
    for r in requests:
        tasks.append(asyncio.create_task(_collect(engine, r)))
        await asyncio.sleep(gap)
    return [(t, done) for t, done, _ in await asyncio.gather(*tasks)]


async def _together(engine: Engine, requests: list[GenerationRequest]) -> list[tuple[str, Finished, list[object]]]:
    return list(await asyncio.gather(*(_collect(engine, r) for r in requests)))


TIE = 0.02  # logits this close are a tie that float rounding (another batch shape) may break either way


def _alone_then_staggered(bundle: firmware.Bundle, max_tokens: int, gap: float,
                          monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], int]:  # fmt: skip
    """QUESTIONS (each a different length and max_tokens) one at a time, then staggered into one
    8-slot engine. Each request must choose the same tokens both times, except that from a step
    where its two best tokens tied (within TIE) the runs may part: ONNX Runtime's kernels sum in
    another order for a batch of 8 rows than for 1. Returns the rows each decode run carried, and
    the tokens the staggered run decoded."""
    from appliance.engine.generation import Generation
    from appliance.engine.sampling import Sampler

    picks: dict[str, list[tuple[int, float]]] = {}  # request id -> (token, lead over the runner-up)
    owners: dict[int, str] = {}
    real_init, real_call = Generation.__init__, Sampler.__call__

    def init(gen, *args, **kwargs):  # type: ignore[no-untyped-def]
        real_init(gen, *args, **kwargs)
        owners[id(gen.sampler)] = gen.request.request_id
        picks[gen.request.request_id] = []

    def call(sampler, logits):  # type: ignore[no-untyped-def]
        token = real_call(sampler, logits)
        top2 = np.sort(logits)[-2:]
        picks[owners[id(sampler)]].append((token, float(top2[1] - top2[0])))
        return token

    monkeypatch.setattr(Generation, "__init__", init)
    monkeypatch.setattr(Sampler, "__call__", call)
    requests = [_greedy(max_tokens + 3 * i, (Message("user", q),)) for i, q in enumerate(QUESTIONS)]
    engine = Engine(bundle, EngineConfig(prefix_cache_bytes=0, max_active_per_device=8))
    try:
        solo_texts, solo = [], []
        for r in requests:
            solo_texts.append(_run(_collect(engine, r))[0])
            solo.append(picks[r.request_id])
        sizes = _batch_sizes(engine)
        runs = _run(_staggered_runs(engine, requests, gap))
    finally:
        engine.close()
    for r, alone, text, (together_text, _) in zip(requests, solo, solo_texts, runs, strict=True):
        together = picks[r.request_id]
        parted = next((i for i, (a, b) in enumerate(zip(alone, together, strict=False)) if a[0] != b[0]), None)
        if parted is None:
            assert together_text == text and len(together) == len(alone)
        else:
            assert min(alone[parted][1], together[parted][1]) < TIE, (r.messages[0].content, parted, alone[parted])
    return sizes, sum(done.trace.decode_tokens for _, done in runs)


def _batch_sizes(engine: Engine) -> list[int]:
    """Record how many rows each decode run of the engine's CPU worker carries (until closed)."""
    session, sizes = engine.workers["cpu"].session, []
    real_decode = session.decode

    def counting_decode(slots, tokens, lengths, *rest):  # type: ignore[no-untyped-def]
        sizes.append(int(tokens.shape[0]))
        return real_decode(slots, tokens, lengths, *rest)

    session.decode = counting_decode  # type: ignore[method-assign]
    return sizes


def test_staggered_requests_of_different_lengths_decode_together_and_match_their_solo_runs(
    bundle: firmware.Bundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes, decoded = _alone_then_staggered(bundle, 16, 0.0, monkeypatch)
    assert max(sizes) >= 4  # they really shared decode runs
    assert len(sizes) < decoded // 2


def test_seeded_sampling_is_the_same_whatever_else_runs(engine: Engine) -> None:
    def sampled(seed: int) -> GenerationRequest:
        return GenerationRequest(messages=CONVERSATION, max_tokens=20, temperature=1.0, top_p=0.95, seed=seed)

    alone = [_run(_collect(engine, sampled(s)))[0] for s in (5, 6)]
    others = [_greedy(24, (Message("user", q),)) for q in QUESTIONS[:5]]
    mixed = _run(_staggered(engine, [others[0], sampled(5), *others[1:3], sampled(6), *others[3:]]))
    assert [mixed[1], mixed[4]] == alone


def test_cancelling_one_stream_leaves_the_others_unchanged(engine: Engine) -> None:
    requests = [_greedy(24, (Message("user", q),)) for q in QUESTIONS[:4]]
    solo = [_run(_collect(engine, r))[0] for r in requests]

    async def with_one_cancelled() -> list[str]:
        doomed = engine.submit(_greedy(1500, (Message("user", "Tell me everything about loops."),)))
        tasks = [asyncio.create_task(_collect(engine, r)) for r in requests]
        async for event in doomed:
            if isinstance(event, TextDelta):
                doomed.cancel()
        assert doomed.finished is not None and doomed.finished.stop_reason == "cancelled"
        return [t for t, _, _ in await asyncio.gather(*tasks)]

    # Steps slowed to 3 ms so the tiny model cannot reach its end of turn before the cancel lands.
    session, real_decode = engine.workers["cpu"].session, engine.workers["cpu"].session.decode

    def slow_decode(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(0.003)
        return real_decode(*args, **kwargs)

    session.decode = slow_decode  # type: ignore[method-assign]
    try:
        assert _run(with_one_cancelled()) == solo
    finally:
        session.decode = real_decode  # type: ignore[method-assign]
    assert engine.workers["cpu"].depth == 0


@contextlib.asynccontextmanager
async def _a_stream_decoding(engine: Engine) -> AsyncIterator[Stream]:
    """A stream decoding from the block's start to its end (the tiny model's answer to "Hi." never ends)."""
    running = engine.submit(_greedy(1500, (Message("user", "Hi."),)))
    decoding = asyncio.Event()

    async def consume() -> None:
        async for event in running:
            if isinstance(event, TextDelta):
                decoding.set()

    consumer = asyncio.create_task(consume())
    await decoding.wait()
    try:
        yield running
    finally:
        running.cancel()
        await consumer


@pytest.mark.parametrize("lane", [False, True], ids=["in-step", "lane"])
def test_a_newcomers_first_token_leaves_before_the_next_decode_run(
    bundle: firmware.Bundle, lane: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The step that ends a newcomer's prefill (in the step, or taken back from the prefill lane)
    # also decodes the running streams. Its first token is handed to its stream before that decode
    # run, not after it: here that decode run waits (up to 10 s) until the newcomer's first token
    # has reached the event loop.
    from appliance.engine.generation import Generation

    newcomer = (Message("user", "Tell me everything about loops. " * 12),)  # past what runs whole in a step
    newcomer_length = len(_prompt_ids(bundle, newcomer))
    engine = Engine(bundle, EngineConfig(prefix_cache_bytes=0, intra_op_threads=2, prefill_lane=lane))
    worker = engine.workers["cpu"]
    assert (worker.lane is not None) == lane
    prefilled, first_token, waits = threading.Event(), threading.Event(), []
    real_prefilled = Generation.prefilled

    def on_prefilled(gen, end, logits, **kw):  # type: ignore[no-untyped-def]
        events = real_prefilled(gen, end, logits, **kw)
        if end == newcomer_length:
            prefilled.set()
        return events

    def waiting(real_decode):  # type: ignore[no-untyped-def]
        def decode(*args, **kwargs):  # type: ignore[no-untyped-def]
            if prefilled.is_set() and not waits:
                waits.append(first_token.wait(10))
            return real_decode(*args, **kwargs)

        return decode

    async def scenario() -> None:
        async with _a_stream_decoding(engine) as running:
            async for event in engine.submit(_greedy(4, newcomer)):
                if isinstance(event, TextDelta):
                    assert running.finished is None
                    first_token.set()

    monkeypatch.setattr(Generation, "prefilled", on_prefilled)
    lane_ranges: list[tuple[int, int]] = []
    if worker.lane is not None:
        real_run = worker.lane.run

        def run(owner, row, ids, start, end, *rest):  # type: ignore[no-untyped-def]
            lane_ranges.append((start, end))
            real_run(owner, row, ids, start, end, *rest)

        monkeypatch.setattr(worker.lane, "run", run)
    for session in {worker.session, worker.decode_half} - {None}:
        monkeypatch.setattr(session, "decode", waiting(session.decode))
    try:
        _run(scenario())
    finally:
        first_token.set()
        engine.close()
    assert waits == [True]  # the decode after the newcomer's last chunk ran after its first token was out
    assert (lane_ranges[-1][1] == newcomer_length) if lane else not lane_ranges  # its last range ran on the lane
    assert worker.depth == 0


# --- the prefill lane (appliance/engine/lane.py) ------------------------------------------------

LONG = (Message("user", "Explain every loop statement. " * 50),)  # about 760 tokens: 12 shards of 64


def _lane_engine(bundle: firmware.Bundle, **kw) -> Engine:  # type: ignore[no-untyped-def]
    """Two threads: a lane of one beside decode steps on one, whatever the machine's CPUs."""
    engine = Engine(bundle, EngineConfig(**{"prefix_cache_bytes": 0, "intra_op_threads": 2, **kw}))
    assert engine.workers["cpu"].lane is not None
    return engine


def _lane_record(worker, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list[int]]:  # type: ignore[no-untyped-def]
    """What the lane hands back (its LaneRuns), and a count of the decode steps on the half session."""
    runs: list = []  # type: ignore[type-arg]
    steps = [0]
    real_take, real_decode = worker.lane.take, worker.decode_half.decode

    def take():  # type: ignore[no-untyped-def]
        done = real_take()
        runs.extend(done)
        return done

    def decode(*args, **kwargs):  # type: ignore[no-untyped-def]
        steps[0] += 1
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(worker.lane, "take", take)
    monkeypatch.setattr(worker.decode_half, "decode", decode)
    return runs, steps


def _slow_lane(worker, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Runs of 4 tokens, each 2 ms longer on the lane: a cancel or recall lands mid-range."""
    from appliance.engine import lane

    monkeypatch.setattr(lane, "LANE_CHUNK_TOKENS", 4)
    real_forward = worker.lane.session.forward

    def slow_forward(cache, ids):  # type: ignore[no-untyped-def]
        if threading.current_thread().name.startswith("prefill-"):
            time.sleep(0.002)
        return real_forward(cache, ids)

    monkeypatch.setattr(worker.lane.session, "forward", slow_forward)


async def _beside(engine: Engine, streams: list[GenerationRequest], newcomer: GenerationRequest,
                  tokens: int = 2) -> list[str]:  # fmt: skip
    """Start the streams, one after another; once each has sent `tokens` pieces, the newcomer comes.
    The texts of all, the newcomer's last."""
    seen = [0] * len(streams)

    async def stream(i: int, request: GenerationRequest) -> str:
        parts = []
        async for event in engine.submit(request):
            if isinstance(event, TextDelta):
                parts.append(event.text)
                seen[i] += 1
        seen[i] = tokens  # ended early: nothing to wait for
        return "".join(parts)

    tasks = []
    for i, r in enumerate(streams):
        tasks.append(asyncio.create_task(stream(i, r)))
        await asyncio.sleep(0.005)
    while min(seen) < tokens:
        await asyncio.sleep(0.001)
    text, _, _ = await _collect(engine, newcomer)
    return [*await asyncio.gather(*tasks), text]


def test_a_long_prompt_beside_decoding_streams_prefills_on_the_lane_and_answers_as_alone(
    bundle: firmware.Bundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _lane_engine(bundle)
    worker = engine.workers["cpu"]
    streams = [_greedy(150, (Message("user", q),)) for q in QUESTIONS[:3]]
    long = _greedy(8, LONG)
    try:
        solo = [_run(_collect(engine, r))[0] for r in [*streams, long]]
        runs, steps = _lane_record(worker, monkeypatch)
        together = _run(_beside(engine, streams, long))
    finally:
        engine.close()
    assert together == solo
    assert runs and runs[0].start == 0 and all(r.error is None for r in runs)
    assert steps[0] > 0  # the streams stepped on the other half of the cores meanwhile
    assert worker.depth == 0


def test_a_prompt_on_the_lane_in_a_slot_below_decoding_streams_keeps_its_first_position(
    bundle: firmware.Bundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Slot 0 frees while slots 1 and 2 decode: the newcomer takes it, and the decode steps pad along
    # its row (at length 0, writing its position 0) while the lane prefills; the worker puts the
    # lane's position 0 back, else the newcomer's first token attends to a stale key.
    engine = _lane_engine(bundle)
    worker = engine.workers["cpu"]
    long = _greedy(8, LONG)
    slots: list[int | None] = []
    real_run = worker.lane.run

    def run(owner, *args):  # type: ignore[no-untyped-def]
        slots.append(owner.ticket.slot)
        real_run(owner, *args)

    async def scenario() -> str:
        first = engine.submit(_greedy(1500, (Message("user", "Hi."),)))  # slot 0
        await asyncio.sleep(0.001)
        streams = [engine.submit(_greedy(1500, (Message("user", "Hi."),))) for _ in range(2)]  # slots 1, 2
        consumers = [asyncio.create_task(_drain(s)) for s in [first, *streams]]
        await _decoding(worker, 3)
        first.cancel()
        while worker.scheduler.running[0] is not None:
            await asyncio.sleep(0.001)
        text, _, _ = await _collect(engine, long)
        for s in streams:
            s.cancel()
        await asyncio.gather(*consumers)
        return text

    from appliance.engine.generation import Generation

    real_prefilled, rows_equal = Generation.prefilled, []

    def prefilled(gen, end, logits, **kw):  # type: ignore[no-untyped-def]
        # Once the whole prompt is back in the slot row, it holds exactly what the lane computed.
        if end == len(gen.prompt.ids) > 100 and gen.cache is not None and worker.lane is not None:  # the long one
            host, staged = worker.kv.host, worker.lane.staging.slots.host
            assert host is not None and staged is not None
            rows_equal.append(all(np.array_equal(mine[gen.cache.row, :, :end], lane[0, :, :end])
                                  for layer, lane_layer in zip(host, staged, strict=True)
                                  for mine, lane in zip(layer, lane_layer, strict=True)))  # fmt: skip
        return real_prefilled(gen, end, logits, **kw)

    try:
        solo = _run(_collect(engine, long))[0]
        runs, steps = _lane_record(worker, monkeypatch)
        monkeypatch.setattr(worker.lane, "run", run)
        monkeypatch.setattr(Generation, "prefilled", prefilled)
        text = _run(scenario())
    finally:
        engine.close()
    assert slots and set(slots) == {0} and runs and steps[0] > 0  # on the lane from slot 0, streams beside
    assert rows_equal == [True]
    assert text == solo


async def _decoding(worker, streams: int) -> None:  # type: ignore[no-untyped-def]
    """Until that many requests decode on the worker."""
    while sum(t is not None and t.decoding for t in worker.scheduler.running) < streams:
        await asyncio.sleep(0.001)


async def _drain(stream) -> None:  # type: ignore[no-untyped-def]
    async for _ in stream:
        pass


def test_cancelling_a_prompt_on_the_lane_stops_it_within_a_run_and_frees_its_slot(
    bundle: firmware.Bundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _lane_engine(bundle)
    worker = engine.workers["cpu"]
    _slow_lane(worker, monkeypatch)
    streams = [_greedy(1500, (Message("user", "Hi."),)) for _ in range(2)]  # never end on their own

    async def scenario() -> Finished | None:
        tasks = [asyncio.create_task(_collect(engine, r)) for r in streams]
        await _decoding(worker, 2)
        doomed = engine.submit(_greedy(8, LONG))
        while not worker.scheduler.lane_busy:
            await asyncio.sleep(0.0005)
        doomed.cancel()
        async for _ in doomed:
            pass
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return doomed.finished

    try:
        solo = _run(_collect(engine, _greedy(8, LONG)))[0]
        runs, _ = _lane_record(worker, monkeypatch)
        finished = _run(scenario())
        assert finished is not None and finished.stop_reason == "cancelled"
        assert any(r.reached < r.end for r in runs)  # handed back mid-range, not run to its end
        deadline = time.monotonic() + 10
        while worker.depth and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.depth == 0 and not worker.scheduler.lane_busy
        assert _run(_collect(engine, _greedy(8, LONG)))[0] == solo  # the lane's next owner starts clean
    finally:
        engine.close()


def test_when_the_streams_end_the_lane_hands_the_rest_of_the_prompt_to_all_the_cores(
    bundle: firmware.Bundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _lane_engine(bundle)
    worker = engine.workers["cpu"]
    long = _greedy(8, LONG)
    _slow_lane(worker, monkeypatch)

    async def scenario() -> str:
        stream = engine.submit(_greedy(1500, (Message("user", "Hi."),)))
        consumer = asyncio.create_task(_drain(stream))
        await _decoding(worker, 1)
        answer = asyncio.create_task(_collect(engine, long))
        while not worker.scheduler.lane_busy:
            await asyncio.sleep(0.0005)
        stream.cancel()  # the only stream beside the lane ends
        await consumer
        return (await answer)[0]

    try:
        solo = _run(_collect(engine, long))[0]
        runs, _ = _lane_record(worker, monkeypatch)
        text = _run(scenario())
    finally:
        engine.close()
    assert text == solo
    assert runs and runs[0].reached < runs[0].end  # recalled after a run, not left to finish on one core
    assert all(r.error is None for r in runs)


def test_a_failing_lane_run_fails_its_request_only(bundle: firmware.Bundle, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _lane_engine(bundle)
    worker = engine.workers["cpu"]
    lane_session = worker.lane.session
    streams = [_greedy(150, (Message("user", q),)) for q in QUESTIONS[:2]]
    real_forward = lane_session.forward

    def forward(cache, ids):  # type: ignore[no-untyped-def]
        if threading.current_thread().name.startswith("prefill-"):
            raise RuntimeError("injected lane failure")
        return real_forward(cache, ids)

    async def scenario() -> tuple[list[str], BaseException | None]:
        tasks = [asyncio.create_task(_collect(engine, r)) for r in streams]
        await _decoding(worker, 2)
        error = None
        try:
            await _collect(engine, _greedy(8, LONG))
        except GenerationFailed as exc:  # the API's in-stream error; the cause is in the log
            error = exc
        return [t for t, _, _ in await asyncio.gather(*tasks)], error

    try:
        solo = [_run(_collect(engine, r))[0] for r in [*streams, _greedy(8, LONG)]]
        monkeypatch.setattr(lane_session, "forward", forward)
        texts, error = _run(scenario())
        assert texts == solo[:2] and isinstance(error, GenerationFailed) and "injected" in str(error)
        monkeypatch.undo()
        assert _run(_collect(engine, _greedy(8, LONG)))[0] == solo[2]
        assert worker.depth == 0
    finally:
        engine.close()


def test_a_prefix_from_the_pool_is_carried_into_the_lane(bundle: firmware.Bundle,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from appliance.engine.generation import Generation

    system = Message("system", "You answer questions about Python loops, briefly and exactly. " * 12)
    warmup = _greedy(4, (system, Message("user", "What is a loop?")))
    long = _greedy(8, (system, *LONG))
    cold_engine = _lane_engine(bundle)
    try:
        cold = _run(_collect(cold_engine, long))[0]
    finally:
        cold_engine.close()
    engine = _lane_engine(bundle, prefix_cache_bytes=64 << 20, prefix_block_tokens=8)
    worker = engine.workers["cpu"]
    ids, kept = _prompt_ids(bundle, long.messages), []
    real_prefilled = Generation.prefilled

    def prefilled(gen, end, logits, **kw):  # type: ignore[no-untyped-def]
        if end == len(ids) and engine.prefix_cache is not None:
            hit = engine.prefix_cache.lookup(block_digests(ids, 8), len(ids))
            kept.append(hit.tokens if hit else 0)
        return real_prefilled(gen, end, logits, **kw)

    async def scenario() -> str:
        stream = engine.submit(_greedy(1500, (Message("user", "Hi."),)))  # decodes beside it to the end
        consumer = asyncio.create_task(_drain(stream))
        await _decoding(worker, 1)
        text, _, _ = await _collect(engine, long)
        stream.cancel()
        await consumer
        return text

    try:
        _run(_collect(engine, warmup))  # the system prompt's blocks go to the pool
        runs, _ = _lane_record(worker, monkeypatch)
        monkeypatch.setattr(Generation, "prefilled", prefilled)
        text = _run(scenario())
    finally:
        engine.close()
    assert text == cold
    assert runs and runs[0].start > 0  # the lane began after the reused prefix, copied into its row
    assert runs[-1].reached == runs[-1].end == len(ids)  # and ran the prompt to its end
    assert kept == [len(ids) // 8 * 8]  # once prefilled, the whole prompt is in the pool (the lane put it)


def test_a_scored_prompt_s_log_probabilities_are_transformers_own(bundle: firmware.Bundle, hf_model,  # type: ignore[no-untyped-def]
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A plain completion's prompt scored (the Completions API's echo with logprobs): each token
    after the first gets transformers' log-softmax at the position before it, with the top
    alternatives, however its ranges are cut: in pieces of 7 positions here, in chunks of the
    steps beside a decoding stream (never on the lane, never from the pool, which holds the
    prompt). Its answer is the unscored one's; with max_tokens 0 the scores are all there is."""
    from appliance.engine import generation
    from appliance.engine.request import PromptLogprobs, TokenLogprob

    monkeypatch.setattr(generation, "SCORE_LOGITS_BYTES", 7 * 4 * bundle.model.vocab_size)
    text = "Explain every loop statement, and when its else clause runs. " * 12
    engine = _lane_engine(bundle, prefix_cache_bytes=64 << 20, max_tokens_per_shard=64)
    worker = engine.workers["cpu"]
    lane_runs: list[int] = []
    real_run = worker.lane.run  # type: ignore[union-attr]
    monkeypatch.setattr(worker.lane, "run", lambda *a, **k: (lane_runs.append(a[3]), real_run(*a, **k)))

    async def beside_a_stream(request: GenerationRequest) -> list[object]:
        async with _a_stream_decoding(engine) as running:
            events = [e async for e in engine.submit(request)]
            assert running.finished is None  # it decoded all along
        return events

    try:
        plain, _, plain_events = _run(_collect(engine, GenerationRequest((), 6, temperature=0.0, raw_prompt=text,
                                                                         logprobs=3)))  # fmt: skip
        scored = GenerationRequest((), 6, temperature=0.0, raw_prompt=text, logprobs=3, prompt_logprobs=3)
        events = _run(beside_a_stream(scored))
        ids = engine.prepare(scored).ids
        only = _run(_collect(engine, GenerationRequest((), 0, raw_prompt=tuple(ids), prompt_logprobs=0)))[2]
    finally:
        engine.close()
    assert len(ids) > 300 and not lane_runs  # a prompt the lane would have taken
    scores = next(e for e in events if isinstance(e, PromptLogprobs))
    assert events.index(scores) == 0 and isinstance(events[1], Prefilled) and events[1].trace.reused_tokens == 0
    ref = _hf_logits(hf_model, ids).astype(np.float64)
    ref -= ref.max(axis=1, keepdims=True)
    ref -= np.log(np.exp(ref).sum(axis=1, keepdims=True))
    piece = engine.tokenizer.decode
    assert scores.first == piece(ids[:1]) and len(scores.tokens) == len(ids) - 1
    for position, (token, score) in enumerate(zip(ids[1:], scores.tokens, strict=True)):
        assert score.token == piece([token]) and abs(score.logprob - ref[position, token]) <= 1e-4
        best = np.argsort(-ref[position])[:3]
        assert [t for t, _ in score.top] == [piece([int(t)]) for t in best]
        assert np.allclose([lp for _, lp in score.top], ref[position, best], atol=1e-4)
    answer = [e for e in events if isinstance(e, TextDelta | TokenLogprob)]
    assert answer == [e for e in plain_events if isinstance(e, TextDelta | TokenLogprob)]
    assert "".join(e.text for e in answer if isinstance(e, TextDelta)) == plain
    assert [type(e) for e in only] == [PromptLogprobs, Prefilled, Finished]
    assert only[-1].stop_reason == "max_tokens" and only[-1].output_tokens == 0  # type: ignore[attr-defined]
    assert [s.logprob for s in only[0].tokens] == [s.logprob for s in scores.tokens]  # type: ignore[attr-defined]
    assert all(s.top == () for s in only[0].tokens)  # type: ignore[attr-defined]


def test_prefix_reuse_inside_a_batch_equals_cold(bundle: firmware.Bundle, engine: Engine) -> None:
    warm = Engine(bundle, EngineConfig(prefix_cache_bytes=64 << 20, prefix_block_tokens=8))
    follow_ups = [(*CONVERSATION, Message("assistant", "A loop."), Message("user", q)) for q in QUESTIONS[:4]]
    try:
        _run(_collect(warm, _greedy(4)))  # the shared conversation goes into the pool
        results = _run(_together(warm, [_greedy(12, m) for m in follow_ups]))
    finally:
        warm.close()
    cold = [_run(_collect(engine, _greedy(12, m)))[0] for m in follow_ups]
    assert [t for t, _, _ in results] == cold
    assert all(done.trace.reused_tokens >= 8 for _, done, _ in results)


def test_a_request_offers_its_prompt_to_the_pool_once_prefilled_not_only_at_its_end(bundle: firmware.Bundle) -> None:
    # The same conversation so far (an agent's system prompt and tools, say) from a second client
    # while the first answer is still being written must find the prompt in the pool. The first
    # request's decode steps wait until the pool has been looked at: it is mid-answer then.
    warm = Engine(bundle, EngineConfig(prefix_cache_bytes=64 << 20, prefix_block_tokens=8))
    session = warm.workers["cpu"].session
    real_decode, looked = session.decode, threading.Event()

    def held_decode(*args, **kwargs):  # type: ignore[no-untyped-def]
        looked.wait(10)
        return real_decode(*args, **kwargs)

    session.decode = held_decode  # type: ignore[method-assign]
    ids = _prompt_ids(bundle)

    async def look_when_prefilled() -> tuple[int, Finished]:
        tokens = 0
        async for event in warm.submit(_greedy(8)):
            if isinstance(event, Prefilled):
                assert warm.prefix_cache is not None
                hit = warm.prefix_cache.lookup(block_digests(ids, 8), len(ids) // 8)
                tokens = hit.tokens if hit is not None else 0
                looked.set()
            elif isinstance(event, Finished):
                return tokens, event
        raise AssertionError("no Finished event")

    try:
        in_pool, done = _run(look_when_prefilled())
    finally:
        looked.set()
        warm.close()
    assert done.output_tokens > 1  # it needed decode steps, which waited for the look: it was mid-answer
    assert in_pool == 8 * (len(ids) // 8)


def test_a_request_larger_than_the_kv_budget_is_refused_and_one_that_fits_waits(bundle: firmware.Bundle) -> None:
    session_bytes = ModelSession(bundle).kv_bytes_per_token
    small = Engine(bundle, EngineConfig(prefix_cache_bytes=0, kv_cache_bytes=300 * session_bytes))
    try:
        with pytest.raises(ContextOverflow, match="holds 300 per request"):
            _run(_in_loop(lambda: small.submit(_greedy(400))))
        # Two requests of ~200 positions each: the second waits for the first, then runs.
        reqs = [_greedy(160), _greedy(160)]
        results = _run(_together(small, reqs))
    finally:
        small.close()
    assert results[0][0] == results[1][0] and results[0][1].output_tokens >= 1


def test_cancel_mid_stream_frees_the_slot(engine: Engine) -> None:
    worker = engine.workers["cpu"]

    async def cancel_after_first_delta() -> Finished | None:
        stream = engine.submit(_greedy(1500, (Message("user", "Tell me everything about loops."),)))
        async for event in stream:
            if isinstance(event, TextDelta):
                break  # leaving the loop cancels the request (when the loop finalizes the iterator)
        deadline = time.monotonic() + 5
        while (worker.depth or not stream.cancelled) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return stream.finished

    assert _run(cancel_after_first_delta()) is None
    assert worker.depth == 0

    async def cancel_explicitly() -> tuple[int, Finished | None]:
        stream = engine.submit(_greedy(1500, (Message("user", "Tell me everything about loops."),)))
        count, at_cancel = 0, -1
        async for event in stream:
            count += isinstance(event, TextDelta)
            if count == 3 and at_cancel < 0:
                stream.cancel()  # what a transport does when its client goes away
                at_cancel = stream.trace.decode_tokens
        assert stream.finished is not None
        return stream.finished.trace.decode_tokens - at_cancel, stream.finished

    # The worker stops within the step it was running: at most one more token, then "cancelled".
    # Each decode step is slowed to 5 ms so the tiny model cannot reach its end of turn before the cancel lands.
    session, real_decode = worker.session, worker.session.decode

    def slow_decode(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(0.005)
        return real_decode(*args, **kwargs)

    session.decode = slow_decode  # type: ignore[method-assign]
    try:
        extra, done = _run(cancel_explicitly())
    finally:
        session.decode = real_decode  # type: ignore[method-assign]
    assert extra <= 1 and done is not None and done.stop_reason == "cancelled"
    assert worker.depth == 0
    _, done, _ = _run(_collect(engine, _greedy(4)))  # the worker serves on
    assert done.output_tokens >= 1


def test_seed_makes_sampling_repeatable(engine: Engine) -> None:
    def sample(seed: int) -> str:
        req = GenerationRequest(messages=CONVERSATION, max_tokens=24, temperature=1.0, top_p=0.95, seed=seed)
        return _run(_collect(engine, req))[0]

    assert sample(11) == sample(11)
    assert len({sample(s) for s in (1, 2, 3, 4)}) > 1


def test_stop_sequence_ends_the_stream_before_it(engine: Engine) -> None:
    full, _, _ = _run(_collect(engine, _greedy(24)))
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip()
    text, done, _ = _run(_collect(engine, _greedy(24, stop_sequences=(stop,))))
    assert done.stop_reason == "stop_sequence" and done.stop_sequence == stop
    assert text == full[: full.index(stop)]


@pytest.mark.parametrize(
    ("request_kwargs", "error", "param"),
    [
        ({"messages": ()}, InvalidRequest, "messages"),
        ({"max_tokens": 0}, InvalidRequest, "max_tokens"),
        ({"max_tokens": 10_000}, ContextOverflow, "max_tokens"),
        ({"temperature": 3.0}, InvalidRequest, "temperature"),
        ({"temperature": float("nan")}, InvalidRequest, "temperature"),
        ({"top_p": 0.0}, InvalidRequest, "top_p"),
        ({"top_k": -1}, InvalidRequest, "top_k"),
        ({"stop_sequences": ("",)}, InvalidRequest, "stop_sequences"),
        ({"messages": (Message("robot", "hi"),)}, InvalidRequest, "messages"),
        ({"seed": "x"}, InvalidRequest, "seed"),
        ({"logit_bias": ((5, 100.5),)}, InvalidRequest, "logit_bias"),
        ({"logit_bias": ((True, 1.0),)}, InvalidRequest, "logit_bias"),
        ({"logit_bias": ((-1, 1.0),)}, InvalidRequest, "logit_bias"),
        ({"logit_bias": ((10_000_000, 1.0),)}, InvalidRequest, "logit_bias"),  # past the vocabulary
        ({"logit_bias": tuple((i, 1.0) for i in range(1025))}, InvalidRequest, "logit_bias"),
        ({"messages": (), "raw_prompt": ()}, InvalidRequest, "prompt"),  # token ids: none
        ({"messages": (), "raw_prompt": (1, True)}, InvalidRequest, "prompt"),
        ({"messages": (), "raw_prompt": (1, 10_000_000)}, InvalidRequest, "prompt"),  # past the vocabulary
        ({"prompt_logprobs": 1}, InvalidRequest, "logprobs"),  # a chat's prompt is its template's
        ({"messages": (), "raw_prompt": "a", "prompt_logprobs": 21}, InvalidRequest, "logprobs"),
        ({"messages": (), "raw_prompt": "a", "max_tokens": 0}, InvalidRequest, "max_tokens"),  # nothing to do
    ],
)
def test_bad_requests_are_typed_errors(engine: Engine, request_kwargs: dict, error: type, param: str) -> None:  # type: ignore[type-arg]
    kwargs = {"messages": (Message("user", "hi"),), "max_tokens": 8, **request_kwargs}
    with pytest.raises(error) as info:
        engine.prepare(GenerationRequest(**kwargs))
    assert info.value.param == param


def test_fit_context_caps_the_answer_at_what_the_prompt_leaves_of_a_request_s_room(bundle: firmware.Bundle) -> None:
    """Ollama's num_predict -1: max_tokens is a cap, and where the context (here the device's KV
    room for one request, 300 positions) leaves fewer after the prompt, the answer gets those."""
    room = 300
    engine = Engine(bundle, EngineConfig(prefix_cache_bytes=0,
                                         kv_cache_bytes=room * ModelSession(bundle).kv_bytes_per_token))  # fmt: skip
    try:
        unbounded = _greedy(10**6, (Message("user", "Hi."),), fit_context=True)  # the tiny model's answer never ends
        prompt = len(engine.prepare(unbounded).ids)
        _, done, _ = _run(_collect(engine, unbounded))
        assert done.stop_reason == "max_tokens" and done.output_tokens == room - prompt
        with pytest.raises(ContextOverflow):
            engine.prepare(dataclasses.replace(unbounded, fit_context=False))
        with pytest.raises(ContextOverflow):  # a prompt that fills the room leaves no answer
            _run(_in_loop(lambda: engine.submit(_greedy(10**6, (Message("user", "loop " * 400),), fit_context=True))))
    finally:
        engine.close()


def test_huge_prompt_is_a_context_overflow_not_a_crash(engine: Engine) -> None:
    with pytest.raises(ContextOverflow, match="exceeds the model's context of 2048"):
        engine.prepare(_greedy(8, (Message("user", "loop " * 3000),)))


@pytest.mark.demo
def test_demo_firmware_decodes_eight_staggered_streams_exactly_as_alone(
    demo_bundle_path: Path, trusted_keys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes, _ = _alone_then_staggered(firmware.load(demo_bundle_path, trusted_keys), 12, 0.01, monkeypatch)
    assert max(sizes) >= 4


@pytest.mark.demo
def test_demo_firmware_answers_paris_from_the_cli(demo_bundle_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "generate", "What is the capital of France?", "--max-tokens", "40"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "[end_turn;" in result.stderr


def test_the_cli_refuses_a_parameter_out_of_range_in_one_line(tiny_bundle_path: Path, trusted_keys: Path) -> None:
    for flags, says in ((["--max-tokens", "100000"], "exceeds the model's context of"),
                        (["--temperature", "9"], "temperature must be between 0.0 and 2.0")):  # fmt: skip
        result = subprocess.run(
            [sys.executable, "-m", "appliance.cli", "generate", "Hi.", "--firmware", str(tiny_bundle_path),
             "--trusted-keys", str(trusted_keys), *flags], capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 2 and "zerolayer generate: " in result.stderr and says in result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.demo
def test_demo_firmware_prefills_in_any_planned_chunks_exactly_as_in_one_pass(demo_bundle_path: Path,
                                                                             trusted_keys: Path) -> None:  # fmt: skip
    """A prompt cut as the scheduler cuts it beside a decoding stream, at every chunk budget, gives
    the one-pass logits exactly. A lone last token did not (int8 MatMulNBits' M=1 kernels: logits
    1.2 off and another first token), so a request sent together with another answered otherwise."""
    from appliance.engine.scheduler import Scheduler

    bundle = firmware.load(demo_bundle_path, trusted_keys)
    ids = np.array(_prompt_ids(bundle, (Message("user", "What is the capital of France?"),)), dtype=np.int64)
    session = ModelSession(bundle)
    one = session.forward(session.new_cache(len(ids)), ids)
    for budget in range(2, 12):
        s: Scheduler[str] = Scheduler(2, 10_000, 4096, 8, 512)
        s.add("stream", 100, 0.0)
        (stream,) = s.admit()
        s.start(stream, [(0, 10)])
        s.plan()
        s.add("newcomer", 100, 1.0)
        (late,) = s.admit()
        s.start(late, [(0, len(ids))])
        s.budget.tokens = budget
        cache = session.new_cache(len(ids))
        while late.prefill:
            _, a, b = s.plan().prefill  # type: ignore[misc]
            logits = session.forward(cache, ids[a:b])
        assert np.array_equal(logits, one), budget
