"""The engine's pure parts: shard planning, stop sequences, sampling, streaming detokenization,
the prefix pool. No model runs here."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from appliance.engine.prefix_cache import MAX_TAILS_PER_BLOCK, Export, PrefixCache, PrefixHit, block_digests
from appliance.engine.sampling import Sampler
from appliance.engine.shards import plan_shards
from appliance.engine.stops import StopMatcher
from appliance.engine.tokenizer import StreamDecoder, TextTokenizer


def _covers(shards: tuple[tuple[int, int], ...], start: int, total: int, limit: int) -> None:
    assert shards[0][0] == start and shards[-1][1] == total
    for (_, b), (c, _) in itertools.pairwise(shards):
        assert b == c
    assert all(0 < b - a <= limit for a, b in shards)


def test_short_prompt_is_one_shard() -> None:
    plan = plan_shards(0, 100, 128, "semantic", [10, 50])
    assert plan.shards == ((0, 100),) and plan.reason == "fits in one shard"


def test_fixed_cuts_at_the_limit() -> None:
    plan = plan_shards(0, 300, 128, "fixed", [10, 50, 200])
    assert plan.shards == ((0, 128), (128, 256), (256, 300))
    assert plan.reason.startswith("fixed")


def test_no_last_shard_is_a_lone_token() -> None:
    """Its logits would come from other kernels than a prompt's (scheduler.MIN_CHUNK_TOKENS)."""
    assert plan_shards(0, 257, 128, "fixed", []).shards == ((0, 128), (128, 255), (255, 257))
    assert plan_shards(0, 3, 1, "fixed", []).shards == ((0, 1), (1, 2), (2, 3))  # a shard of 1 token allows no other


def test_semantic_cuts_on_the_last_boundary_inside_each_shard() -> None:
    plan = plan_shards(0, 300, 128, "semantic", [10, 100, 200, 290])
    # 0..128 holds boundaries 10 and 100 -> cut at 100; 100..228 holds 200 -> cut at 200; rest fits.
    assert plan.shards == ((0, 100), (100, 200), (200, 300))
    assert "2 of 2 cuts on message boundaries" in plan.reason


def test_semantic_without_boundary_falls_back_to_the_limit() -> None:
    plan = plan_shards(0, 400, 128, "semantic", [5])
    _covers(plan.shards, 0, 400, 128)
    assert plan.shards[1] == (128, 256)


def test_plan_starts_after_reused_prefix() -> None:
    plan = plan_shards(64, 300, 100, "fixed", [])
    _covers(plan.shards, 64, 300, 100)


@pytest.mark.parametrize("pieces", [["Hello wor", "ld. STOP here"], ["a", "b", "S", "T", "O", "P", "c"]])
def test_stop_sequence_split_across_pushes(pieces: list[str]) -> None:
    m = StopMatcher(("STOP",))
    out, matched = "", None
    for p in pieces:
        text, matched = m.push(p)
        out += text
        if matched:
            break
    assert matched == "STOP"
    assert "S" not in out.replace("Hello", "")  # no part of the stop sequence leaked


def test_partial_stop_prefix_is_released_when_it_does_not_complete() -> None:
    m = StopMatcher(("</end>",))
    assert m.push("x </e") == ("x ", None)
    assert m.push("xtra") == ("</extra", None)
    assert m.flush() == ""
    m.push("tail </en")
    assert m.flush() == "</en"


def test_earliest_of_several_stop_sequences_wins() -> None:
    assert StopMatcher(("bb", "a")).push("xxabb") == ("xx", "a")


def test_what_followed_the_stop_sequence_is_kept_apart() -> None:
    m = StopMatcher(("\n[END]", "[END]"))
    assert m.push("thought\n[EN") == ("thought", None)
    assert m.push("D]\nThe answer") == ("", "\n[END]") and m.rest == "\nThe answer"


def test_greedy_and_seeded_sampling() -> None:
    logits = np.random.default_rng(1).normal(size=1000).astype(np.float32)
    assert Sampler(0.0)(logits) == int(np.argmax(logits))
    a = [Sampler(1.0, top_k=50, top_p=0.9, seed=7)(logits) for _ in range(3)]
    s1, s2 = Sampler(1.0, top_p=0.9, seed=7), Sampler(1.0, top_p=0.9, seed=7)
    assert [s1(logits) for _ in range(20)] == [s2(logits) for _ in range(20)]
    assert len(set(a)) == 1  # a fresh sampler with the same seed makes the same first choice
    negative = [Sampler(1.0, seed=-1)(logits) for _ in range(3)]  # OpenAI's seed is any int64
    assert len(set(negative)) == 1 and negative[0] == Sampler(1.0, seed=2**64 - 1)(logits)


def test_top_k_and_top_p_restrict_the_candidates() -> None:
    logits = np.array([10.0, 9.0, 8.0, -5.0, -6.0], dtype=np.float32)
    picks = {Sampler(1.0, top_k=2, seed=i)(logits) for i in range(200)}
    assert picks <= {0, 1} and len(picks) == 2
    picks = {Sampler(1.0, top_p=0.5, seed=i)(logits) for i in range(200)}
    assert picks == {0}


def test_stream_decoder_never_emits_half_a_character(tiny_bundle_path: Path) -> None:
    tok = TextTokenizer(tiny_bundle_path / "tokenizer.json", tiny_bundle_path / "tokenizer_config.json")
    text = "naïve café — 東京 🚀 Zürich ∑x²"
    ids, _ = tok.encode(text)
    assert len(ids) > len(text) / 2  # the tiny vocabulary splits these into byte tokens
    dec = StreamDecoder(tok)
    deltas = [dec.push(i) for i in ids]
    deltas.append(dec.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text
    # Some token really was a fragment of a character, or this test proves nothing.
    assert any(d == "" for d in deltas[:-1])


def test_block_digests_chain() -> None:
    a = block_digests(list(range(100)), 32)
    b = block_digests([*range(64), 999, *range(65, 100)], 32)
    assert len(a) == 3
    assert a[:2] == b[:2] and a[2] != b[2]  # a digest names the whole prefix up to it


def _row(tokens: int, fill: float = 1.0) -> tuple[Export, list[tuple[int, int]]]:
    """An export of a one-layer row whose position i holds fill + i, and the spans asked of it."""
    asked: list[tuple[int, int]] = []
    key = np.broadcast_to(fill + np.arange(tokens, dtype=np.float32)[None, :, None], (2, tokens, 4))

    def export(start: int, end: int) -> list[tuple[np.ndarray, np.ndarray]]:
        asked.append((start, end))
        return [(key[:, start:end], key[:, start:end])]

    return export, asked


def _joined(hit: PrefixHit) -> np.ndarray:
    """The hit's keys of its one layer, its segments put end to end at their positions."""
    out = np.full((2, hit.tokens, 4), np.nan, np.float32)
    for start, kv in hit.segments:
        out[:, start : start + kv[0][0].shape[1]] = kv[0][0]
    return out


def test_prefix_cache_longest_match_partial_reuse_and_byte_bound() -> None:
    per_block = 2 * (2 * 8 * 4 * 4)  # key + value bytes of one 8-token block
    pool = PrefixCache(max_bytes=per_block * 5, block_tokens=8)
    d1 = block_digests(list(range(32)), 8)  # 4 blocks
    assert pool.store(d1, _row(32, 1.0)[0])
    hit = pool.lookup(block_digests([*range(24), 7, 7, 7, 7, 7, 7, 7, 7, 7], 8), max_blocks=4)
    assert hit is not None and hit.tokens == 24  # the shared 3 blocks of a 4-block entry
    assert np.array_equal(_joined(hit)[0, :, 0], 1.0 + np.arange(24))
    d2 = block_digests(list(range(100, 116)), 8)  # 2 more blocks: 6 > 5, so the LRU entry goes
    assert pool.store(d2, _row(16, 2.0)[0])
    assert pool.nbytes <= pool.max_bytes
    assert pool.lookup(d1, 4) is None
    assert pool.lookup(d2, 2) is not None
    assert not pool.store(block_digests(list(range(48)), 8), _row(48)[0])  # larger than the pool: refused


def test_prefix_cache_extends_an_entry_by_copying_only_the_new_positions() -> None:
    per_token = 2 * (2 * 4 * 4)  # key + value bytes of one position
    pool = PrefixCache(max_bytes=1 << 20, block_tokens=8)
    ids = list(range(40))
    turn1, asked1 = _row(16)
    pool.store(block_digests(ids[:16], 8), turn1)
    turn2, asked2 = _row(40)  # the same row, later: the conversation's next turn
    pool.store(block_digests(ids, 8), turn2)
    assert asked1 == [(0, 16)] and asked2 == [(16, 40)]  # the second store exported its 24 new positions only
    assert len(pool) == 1 and pool.nbytes == 40 * per_token  # the first entry was replaced; its segment lives on
    hit = pool.lookup(block_digests(ids, 8), 5)
    assert hit is not None and hit.tokens == 40
    assert np.array_equal(_joined(hit)[0, :, 0], 1.0 + np.arange(40))
    shorter = pool.lookup(block_digests(ids, 8), 3)  # a prefix ending inside the second segment
    assert shorter is not None and shorter.tokens == 24
    assert np.array_equal(_joined(shorter)[0, :, 0], 1.0 + np.arange(24))


def test_prefix_cache_branches_share_their_common_segment_and_count_it_once() -> None:
    per_token = 2 * (2 * 4 * 4)
    pool = PrefixCache(max_bytes=1 << 20, block_tokens=8)
    common = list(range(24))
    pool.store(block_digests(common, 8), _row(24)[0])
    a, b = [*common, *range(100, 116)], [*common, *range(200, 216)]
    pool.store(block_digests(a, 8), _row(40, 1.0)[0])
    export_b, asked_b = _row(40, 1.0)
    pool.store(block_digests(b, 8), export_b)
    assert asked_b == [(24, 40)] and len(pool) == 2
    assert pool.nbytes == (24 + 16 + 16) * per_token  # the common 24 positions once
    hit = pool.lookup(block_digests(b, 8), 5)
    assert hit is not None and hit.tokens == 40
    pool._remove(next(iter(pool._entries)))  # the least recently used branch goes; the common part stays
    assert pool.nbytes == (24 + 16) * per_token
    hit = pool.lookup(block_digests(b, 8), 5)
    assert hit is not None and np.array_equal(_joined(hit)[0, :, 0], 1.0 + np.arange(40))
    pool.clear()
    assert pool.nbytes == 0 and pool.lookup(block_digests(b, 8), 5) is None


def test_prefix_cache_keeps_a_hybrid_model_s_rows_whole_with_their_states() -> None:
    """An entry with states (a hybrid model's) holds its tail past the last full block and is
    reused only whole, where the prompt goes on with that tail; a longer entry does not replace
    it; its states count in the pool's bytes and go with it."""
    per_token = 2 * (2 * 4 * 4)
    pool = PrefixCache(max_bytes=1 << 20, block_tokens=8)
    ids = list(range(60))
    state = [np.full((3,), 5.0, np.float32)]
    export1, asked1 = _row(20)
    assert pool.store(block_digests(ids[:20], 8), export1, ids[16:20], state)  # 2 blocks and a 4-token tail
    state[0][:] = 0.0  # the slot's next run: the pool kept a copy
    assert asked1 == [(0, 20)] and pool.nbytes == 20 * per_token + 12
    hit = pool.lookup_with_states(block_digests(ids, 8), ids, 58)
    assert hit is not None and hit.tokens == 20 and hit.states is not None and float(hit.states[0][0]) == 5.0
    assert np.array_equal(_joined(hit)[0, :, 0], 1.0 + np.arange(20))
    assert pool.lookup_with_states(block_digests(ids, 8), ids, 19) is None  # never a part of it
    other = [*ids[:18], 99, *ids[19:]]  # the same blocks, another tail
    assert pool.lookup_with_states(block_digests(other, 8), other, 58) is None
    export2, asked2 = _row(41)
    assert pool.store(block_digests(ids[:41], 8), export2, ids[40:41], [np.ones(3, np.float32)])
    assert asked2 == [(16, 41)] and len(pool) == 2  # its blocks shared, the shorter entry kept
    longest = pool.lookup_with_states(block_digests(ids, 8), ids, 58)
    assert longest is not None and longest.tokens == 41
    export3, asked3 = _row(41)
    assert pool.store(block_digests(ids[:41], 8), export3, ids[40:41], [np.ones(3, np.float32)])
    assert asked3 == [] and len(pool) == 2  # the same entry again: held already
    pool._remove(next(iter(pool._entries)))
    assert pool.lookup_with_states(block_digests(ids, 8), ids, 30) is None and pool._ends.keys() == {
        block_digests(ids[:41], 8)[-1]}  # fmt: skip
    pool.clear()
    assert pool.nbytes == 0 and not pool._ends
    for question in range(MAX_TAILS_PER_BLOCK + 5):  # one system prompt's blocks, short questions after
        asked = [*ids[:16], 1000 + question]
        pool.store(block_digests(asked, 8), _row(17)[0], asked[16:], [np.ones(3, np.float32)])
    assert len(pool) == MAX_TAILS_PER_BLOCK and len(pool._ends[block_digests(ids[:16], 8)[-1]]) == MAX_TAILS_PER_BLOCK
    last = [*ids[:16], 1000 + MAX_TAILS_PER_BLOCK + 4, 5, 5]
    assert pool.lookup_with_states(block_digests(last, 8), last, 17) is not None  # the newest kept
    first = [*ids[:16], 1000, 5, 5]
    assert pool.lookup_with_states(block_digests(first, 8), first, 17) is None  # the oldest gone


def test_only_a_short_plain_request_is_prepared_on_the_event_loop() -> None:
    from appliance.engine.request import GenerationRequest, Message
    from appliance.engine.tools import OutputRules

    short = GenerationRequest((Message("user", "What is the capital of France?"),))
    assert short.prepares_quickly()
    assert not GenerationRequest((Message("user", "x" * 3000),)).prepares_quickly()
    assert not GenerationRequest(tuple(Message("user", "hi") for _ in range(5))).prepares_quickly()
    schema = OutputRules(json_schema={"type": "object"})
    assert not GenerationRequest((Message("user", "hi"),), output=schema).prepares_quickly()  # a grammar to compile
    assert not GenerationRequest((), raw_prompt="y" * 4000).prepares_quickly()


def test_prefix_cache_keeps_a_copy_even_of_a_single_kv_head_row() -> None:
    """A model with one KV head (Phi-3 tiny, Gemma 3 270M): a row's view [1, t, head] counts as
    contiguous whatever its stride, so a pool that stored "contiguous" arrays as they came kept a
    view on the slot, and served the next request's keys as the cached prefix."""
    row = np.ones((1, 64, 4), dtype=np.float32)  # one layer's key (and value) row of one slot
    pool = PrefixCache(max_bytes=1 << 20, block_tokens=8)
    digests = block_digests(list(range(16)), 8)
    assert pool.store(digests, lambda start, end: [(row[:, start:end], row[:, start:end])])
    row[:] = 7.0  # the slot's next request writes its own keys
    hit = pool.lookup(digests, 2)
    assert hit is not None and float(_joined(hit).max()) == 1.0
