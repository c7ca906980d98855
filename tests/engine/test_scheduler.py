"""The scheduler without a model: admission, the KV budget, the step plan, chunked prefill, cancels."""

from __future__ import annotations

import itertools

import pytest

from appliance.engine.errors import ContextOverflow, EngineBusy, EngineStopped
from appliance.engine.scheduler import ChunkBudget, Scheduler, Ticket


def _scheduler(slots: int = 4, kv_tokens: int = 10_000, capacity: int = 4096, max_queued: int = 8,
               chunk: int = 512, lane: bool = False) -> Scheduler[str]:  # fmt: skip
    return Scheduler(slots, kv_tokens, capacity, max_queued, chunk, lane=lane)


def _start_all(s: Scheduler[str], prompt: int = 10) -> list[Ticket[str]]:
    admitted = s.admit()
    for t in admitted:
        s.start(t, [(0, prompt)])
    return admitted


def _decode_until_prefilled(s: Scheduler[str]) -> None:
    while any(t is not None and t.prefill for t in s.running):
        s.plan()


def test_admits_in_arrival_order_into_the_lowest_free_slots() -> None:
    s = _scheduler(slots=2)
    for name in "abc":
        s.add(name, 100, now=0.0)
    admitted = s.admit()
    assert [(t.job, t.slot) for t in admitted] == [("a", 0), ("b", 1)]
    assert s.queued == 1 and s.active == 2
    s.finish(admitted[0])
    assert [(t.job, t.slot) for t in s.admit()] == [("c", 0)]


def test_a_full_queue_refuses_but_a_moved_request_goes_first() -> None:
    s = _scheduler(slots=1, max_queued=2)
    s.add("a", 10, 0.0)
    s.add("b", 10, 0.0)
    with pytest.raises(EngineBusy, match="2 waiting"):
        s.add("c", 10, 0.0)
    s.add("moved", 10, 0.0, front=True)
    assert [t.job for t in s.admit()] == ["moved"]


def test_the_kv_budget_holds_back_the_head_without_passing_it_over() -> None:
    s = _scheduler(slots=4, kv_tokens=1000)
    s.add("big0", 600, 0.0)
    s.add("big1", 600, 0.0)
    s.add("small", 10, 0.0)
    first = s.admit()
    assert [t.job for t in first] == ["big0"]
    assert s.admit() == []  # big1 does not fit yet, and small must not starve it by jumping ahead
    s.finish(first[0])
    assert [t.job for t in s.admit()] == ["big1", "small"]


def test_a_request_that_can_never_fit_is_refused_at_once() -> None:
    s = _scheduler(kv_tokens=1000, capacity=800)
    with pytest.raises(ContextOverflow, match="holds 800 per request") as info:
        s.add("huge", 900, 0.0)
    assert info.value.param == "max_tokens"


def test_shedding_admits_nothing_but_still_runs_what_runs() -> None:
    s = _scheduler()
    s.add("a", 10, 0.0)
    assert s.admit(admitting=False) == [] and not s.has_work(admitting=False)
    assert s.has_work(admitting=True)
    _start_all(s)
    s.add("b", 10, 0.0)
    assert s.has_work(admitting=False)  # "a" still has work; "b" waits
    assert s.admit(admitting=False) == []


def test_every_decoding_slot_advances_in_each_step_while_a_long_prompt_prefills() -> None:
    s = _scheduler(slots=8, chunk=512)
    for i in range(7):
        s.add(f"stream{i}", 100, 0.0)
    _start_all(s)
    _decode_until_prefilled(s)  # nothing else decodes yet: whole shards, one per step
    s.add("long", 2100, 1.0)
    (long,) = s.admit()
    s.start(long, [(0, 512), (512, 1024), (1024, 1536), (1536, 2000)])
    s.budget.tokens = 64
    covered, steps = [], 0
    while long.prefill:
        plan = s.plan()
        steps += 1
        assert {t.job for t in plan.decode} == {f"stream{i}" for i in range(7)}  # nobody stalls
        assert plan.prefill is not None and plan.prefill[0] is long
        _, a, b = plan.prefill
        assert 0 < b - a <= 64
        covered.append((a, b))
    assert covered[0][0] == 0 and covered[-1][1] == 2000
    assert all(x[1] == y[0] for x, y in itertools.pairwise(covered))  # contiguous, in order
    assert steps == len(covered) >= 2000 // 64
    plan = s.plan()
    assert long in plan.decode and plan.prefill is None  # decoding with the rest from the next step


def test_without_decoders_a_chunk_is_a_whole_shard() -> None:
    s = _scheduler(chunk=512)
    s.add("a", 3000, 0.0)
    (a,) = s.admit()
    s.start(a, [(0, 512), (512, 900)])
    s.budget.tokens = 8
    assert s.plan().prefill == (a, 0, 512)
    assert s.plan().prefill == (a, 512, 900)


def test_prompts_prefill_in_arrival_order() -> None:
    s = _scheduler()
    s.add("first", 100, 0.0)
    s.add("second", 100, 1.0)
    first, second = s.admit()
    s.start(second, [(0, 20)])
    s.start(first, [(0, 20)])
    s.budget.tokens = 64
    assert s.plan().prefill == (first, 0, 20)
    plan = s.plan()
    assert plan.prefill == (second, 0, 20) and plan.decode == (first,)


def test_cancels_are_released_and_free_their_slots() -> None:
    s = _scheduler(slots=3)
    for name in "abcd":
        s.add(name, 100, 0.0)
    a, b, c = _start_all(s)
    _decode_until_prefilled(s)
    waiting = s.waiting[0]
    s.cancel(b)
    s.cancel(waiting)
    plan = s.plan()
    assert set(plan.release) == {b, waiting} and waiting.slot is None
    assert plan.decode == (a, c) and plan.rows == 3  # slot 1 is free: it runs as padding
    assert s.active == 2 and s.queued == 0 and s.reserved == 200
    s.finish(c)
    assert s.plan().rows == 1


def test_rows_cover_only_up_to_the_highest_decoding_slot() -> None:
    s = _scheduler(slots=4)
    for name in "ab":
        s.add(name, 100, 0.0)
    a, b = s.admit()
    s.start(a, [(0, 5)])
    s.plan()
    s.start(b, [(0, 5)])
    plan = s.plan()
    assert plan.decode == (a,) and plan.rows == 1 and plan.prefill == (b, 0, 5)


def test_drain_ends_everything_and_refuses_more() -> None:
    s = _scheduler(slots=1)
    s.add("a", 10, 0.0)
    s.add("b", 10, 0.0)
    s.admit()
    assert {t.job for t in s.drain()} == {"a", "b"}
    assert s.active == 0 and s.reserved == 0
    with pytest.raises(EngineStopped):
        s.add("c", 10, 0.0)


def test_chunk_budget_settles_where_a_chunk_costs_its_share_of_a_decode_step() -> None:
    budget = ChunkBudget(max_tokens=2048, share=1.0, min_step=0.0, start=16)
    decode_s, overhead_s, per_token_s = 0.030, 0.008, 0.0016  # a chunk of n tokens: 8 ms + 1.6 ms each
    for _ in range(30):
        n = budget.tokens
        budget.observe(decode_s, n, overhead_s + per_token_s * n)
    chunk_s = overhead_s + per_token_s * budget.tokens
    assert abs(chunk_s - decode_s) <= per_token_s * 2  # within a couple of tokens of the target
    budget.observe(decode_s, budget.tokens, 10.0)  # one pathological step moves it at most 2x
    assert budget.tokens >= 6


def test_chunk_budget_allows_a_whole_short_step_when_decode_steps_are_fast() -> None:
    budget = ChunkBudget(max_tokens=2048, share=1.5, min_step=0.040, start=16)
    decode_s, per_token_s = 0.008, 0.002
    for _ in range(30):
        budget.observe(decode_s, budget.tokens, per_token_s * budget.tokens)
    assert abs(decode_s + per_token_s * budget.tokens - 0.040) <= per_token_s * 2  # the step: 40 ms in all


def test_chunk_budget_never_exceeds_the_shard_or_drops_below_two() -> None:
    budget = ChunkBudget(max_tokens=32, share=1.0, min_step=0.0, start=16)
    for _ in range(10):
        budget.observe(1.0, budget.tokens, 1e-6)
    assert budget.tokens == 32
    for _ in range(20):
        budget.observe(1e-6, budget.tokens, 1.0)
    assert budget.tokens == 2  # a lone token's logits differ from a prompt's (scheduler.MIN_CHUNK_TOKENS)


def test_prefill_cost_is_fitted_as_a_fixed_part_and_a_part_per_token() -> None:
    budget = ChunkBudget(max_tokens=2048)
    assert budget.prefill_seconds(50) is None  # nothing seen yet
    budget.ran_prefill(12, 0.006 + 12 * 0.0007)
    assert budget.prefill_seconds(50) is None  # one size says nothing of the fixed part
    for n in (11, 14, 9, 52, 13):
        budget.ran_prefill(n, 0.006 + n * 0.0007)  # every run streams the weights once: 6 ms
    assert budget.prefill_seconds(50) == pytest.approx(0.006 + 50 * 0.0007)
    budget.ran_prefill(512, 0.6)  # a whole shard: attention within it bends the line; not learnt from
    assert budget.prefill_seconds(50) == pytest.approx(0.006 + 50 * 0.0007)
    noisy = ChunkBudget(max_tokens=2048)
    noisy.ran_prefill(10, 0.020)
    noisy.ran_prefill(20, 0.010)  # the larger run was quicker: no slope to trust
    assert noisy.prefill_seconds(30) == pytest.approx(30 * 0.002)  # no rising slope: the median rate


def test_one_slow_run_among_prompts_of_like_sizes_does_not_price_them_out_of_running_whole() -> None:
    # From a step log of 8 closed-loop clients: ~50-token prompts, the first slowed to 41 ms. A
    # least-squares line through them charged 51 tokens 107 ms, and the next prompt was chunked.
    budget = ChunkBudget(max_tokens=2048)
    for n, ms in zip((53, 50, 49, 50, 47, 51, 50, 51), (40.6, 24.2, 23.5, 25.3, 26.5, 25.6, 25.1, 26.6), strict=True):
        budget.ran_prefill(n, ms / 1000)
    assert budget.prefill_seconds(51) == pytest.approx(0.026, rel=0.1)
    budget.ran_decode(0.020)
    assert budget.whole(51)


def _beside_a_decoding_stream(s: Scheduler[str], ranges: list[tuple[int, int]]) -> Ticket[str]:
    s.add("stream", 100, 0.0)
    _start_all(s)
    _decode_until_prefilled(s)
    s.add("newcomer", 3000, 1.0)
    (late,) = s.admit()
    s.start(late, ranges)
    s.budget.tokens = 12
    for n in (10, 12, 14):
        s.budget.ran_prefill(n, 0.006 + n * 0.0007)
    return late


def test_a_short_prompt_runs_whole_beside_decoding_streams_when_the_step_stays_short() -> None:
    s = _scheduler()
    late = _beside_a_decoding_stream(s, [(0, 52)])
    s.budget.ran_decode(0.015)  # 15 ms + 6 ms + 52 * 0.7 ms = 57 ms: within SHORT_PROMPT_STEP_SECONDS
    plan = s.plan()
    assert plan.prefill == (late, 0, 52) and [t.job for t in plan.decode] == ["stream"]


def test_a_prompt_is_chunked_when_whole_it_would_stretch_the_step() -> None:
    s = _scheduler()
    late = _beside_a_decoding_stream(s, [(0, 52)])
    s.budget.ran_decode(0.030)  # 30 + 42 ms: over the limit, so chunks of the budget
    assert s.plan().prefill == (late, 0, 12)
    s.budget.ran_decode(0.001)  # decode got quick, but a prompt that began chunking keeps chunking
    assert s.plan().prefill == (late, 12, 24)


def test_a_prompt_of_several_shards_is_always_chunked_beside_decoding_streams() -> None:
    s = _scheduler()
    late = _beside_a_decoding_stream(s, [(0, 20), (20, 40)])
    s.budget.ran_decode(0.001)
    assert s.plan().prefill == (late, 0, 12)


@pytest.mark.parametrize("budget", range(2, 12))
def test_no_chunk_is_a_lone_token_nor_leaves_one(budget: int) -> None:
    """Chunks of a 37-token prompt beside a decoding stream, whatever the budget: none of one token."""
    s = _scheduler(chunk=512)
    s.add("stream", 100, 0.0)
    _start_all(s)
    _decode_until_prefilled(s)
    s.add("newcomer", 100, 1.0)
    (late,) = s.admit()
    s.start(late, [(0, 37)])
    s.budget.tokens = budget
    chunks = []
    while late.prefill:
        _, a, b = s.plan().prefill  # type: ignore[misc]
        chunks.append(b - a)
    assert sum(chunks) == 37 and min(chunks) >= 2 and max(chunks) <= budget + 1


# --- the prefill lane (lane.py): a long prompt's ranges beside the steps -------------------------


def test_with_a_lane_a_long_prompt_runs_beside_the_steps_a_range_at_a_time() -> None:
    s = _scheduler(slots=8, lane=True)
    late = _beside_a_decoding_stream(s, [(0, 512), (512, 900)])
    plan = s.plan()
    assert plan.lane == (late, 0, 512) and plan.prefill is None and [t.job for t in plan.decode] == ["stream"]
    assert s.lane_busy and not late.decoding
    for _ in range(3):  # while the lane runs, the stream steps alone and nothing else prefills
        plan = s.plan()
        assert plan.lane is None and plan.prefill is None and [t.job for t in plan.decode] == ["stream"]
    s.lane_done(late, 512)
    assert not s.lane_busy and s.plan().lane == (late, 512, 900)
    s.lane_done(late, 900)
    plan = s.plan()
    assert late in plan.decode and plan.lane is None and not s.lane_busy


def test_a_range_the_lane_hands_back_early_is_run_from_where_it_stopped() -> None:
    s = _scheduler(slots=8, lane=True)
    late = _beside_a_decoding_stream(s, [(0, 512)])
    assert s.plan().lane == (late, 0, 512)
    s.lane_done(late, 192)  # recalled: the stream ended, or failed after 192
    assert list(late.prefill) == [(192, 512)]
    s.finish(s.running[0])  # the stream is gone: the rest is a whole shard in a step, on all the cores
    plan = s.plan()
    assert plan.lane is None and plan.prefill == (late, 192, 512)


def test_a_short_prompt_still_runs_whole_in_a_step_beside_the_streams() -> None:
    s = _scheduler(lane=True)
    late = _beside_a_decoding_stream(s, [(0, 52)])
    s.budget.ran_decode(0.015)
    plan = s.plan()
    assert plan.prefill == (late, 0, 52) and plan.lane is None


def test_the_lane_takes_one_prompt_at_a_time_in_arrival_order() -> None:
    s = _scheduler(slots=8, lane=True)
    first = _beside_a_decoding_stream(s, [(0, 300)])
    s.add("second", 500, 2.0)
    (second,) = s.admit()
    s.start(second, [(0, 300)])
    assert s.plan().lane == (first, 0, 300)
    plan = s.plan()
    assert plan.lane is None and plan.prefill is None  # the second waits for the lane, not in the steps
    s.lane_done(first, 300)
    plan = s.plan()
    assert plan.lane == (second, 0, 300) and first in plan.decode


def test_a_cancelled_request_on_the_lane_is_released_only_once_the_lane_hands_it_back() -> None:
    s = _scheduler(slots=8, lane=True)
    late = _beside_a_decoding_stream(s, [(0, 512)])
    assert s.plan().lane == (late, 0, 512)
    s.cancel(late)
    plan = s.plan()
    assert plan.release == () and s.running[late.slot or 0] is late  # the lane still writes for it
    s.lane_done(late, 64)
    plan = s.plan()
    assert plan.release == (late,) and plan.lane is None and s.active == 1


def test_without_a_lane_or_without_streams_prompts_run_in_the_steps_as_before() -> None:
    s = _scheduler(slots=8, lane=False)
    late = _beside_a_decoding_stream(s, [(0, 512)])
    plan = s.plan()
    assert plan.lane is None and plan.prefill == (late, 0, 12)
    alone = _scheduler(lane=True)
    alone.add("a", 3000, 0.0)
    (a,) = alone.admit()
    alone.start(a, [(0, 512)])
    plan = alone.plan()
    assert plan.lane is None and plan.prefill == (a, 0, 512)  # nothing to run beside: all the cores


def test_with_a_lane_a_short_prompt_is_chunked_in_the_steps_until_the_prefill_cost_is_fitted() -> None:
    s = _scheduler(slots=8, lane=True)
    s.add("stream", 100, 0.0)
    _start_all(s)
    _decode_until_prefilled(s)  # one whole-prompt run of 10 tokens: one size, no fit yet
    s.add("short", 200, 1.0)
    (short,) = s.admit()
    s.start(short, [(0, 52)])
    s.budget.tokens = 12
    plan = s.plan()
    assert plan.lane is None and plan.prefill == (short, 0, 12)  # its chunks teach the fit
    s.add("long", 900, 2.0)
    (long,) = s.admit()
    s.start(long, [(0, 512), (512, 700)])
    while short.prefill:
        s.plan()
    assert s.plan().lane == (long, 0, 512)  # a long prompt takes the lane, fit or not
