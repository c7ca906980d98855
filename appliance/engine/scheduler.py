"""Who runs on a device this step: the waiting queue, the slots, admission, and the step plan.

Pure: no thread, no session, no clock (time is passed in). The worker asks `admit()` which
waiting requests get a slot now, starts them (prefix lookup, shard plan) and hands their prefill
ranges back with `start()`; then `plan()` says what one step runs: every decoding slot advances one
token in a single batched run, and at most one prompt chunk is prefilled beside it. A long
prompt is cut into chunks sized so that the running streams' inter-token latency grows by a
bounded share while a newcomer prefills (chunked prefill, as vLLM and llama.cpp do); a short
prompt runs whole when the step stays short (every run streams the weights once, so chunks cost
more than a whole prompt); with no stream decoding, a chunk is a whole shard. A device with a
prefill lane (the CPU: lane.py) runs a long prompt's shards there instead, beside the steps, one
prompt at a time. Admission is FIFO, so nothing starves: a request that does not fit the KV budget
yet waits at the head until running ones free enough.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from appliance.engine.errors import ContextOverflow, EngineBusy, EngineStopped

T = TypeVar("T")

# While streams decode, a prompt chunk may take this share of a decode step's time on top of it,
# so their inter-token latency grows to at most about (1 + share) times its usual value; or, where
# that is more, a step may last MIN_STEP_SECONDS in all (a few tokens a second more or less are
# unnoticeable to a reader, and a tiny chunk would make the newcomer wait far longer). 20 ms leaves
# a batch of 7-8 streams (10-15 ms a step on 2 cores) at twice its step while a long prompt chunks
# beside it (at 25-30 ms the floor set the step, 2.3-2.5x theirs, and its P99 passed 3x).
PREFILL_SHARE = 1.0
MIN_STEP_SECONDS = 0.020
# A lone token runs through other kernels than a prompt's (int8 MatMulNBits takes its M=1 path), so
# a prompt whose last chunk is one token gets other logits than in one pass (SmolLM2 int8: 1.2 off,
# a different first token). No chunk is one token unless the whole prompt left is.
MIN_CHUNK_TOKENS = 2
# A short prompt is prefilled in one run beside the decoding streams when that step lasts at most
# this long in all: every run streams the whole of the weights once, so cutting a 50-token prompt
# into chunks of a decode step's length pays that cost four or five times (SmolLM2 int8 on 2
# cores: 52 tokens in one run 37 ms, in chunks of 14 57 ms), and a 60 ms gap between two tokens
# is as unnoticeable as the 20 ms above. Longer prompts are still chunked; one that has begun
# chunking is not finished in one run.
SHORT_PROMPT_STEP_SECONDS = 0.060
PREFILL_HISTORY = 64  # prefill runs remembered for the cost fit
FIT_MAX_TOKENS = 128  # the longest run the fit learns from


@dataclass(eq=False)
class Ticket(Generic[T]):
    """The scheduler's view of one request; `job` is the worker's, never read here."""

    job: T
    kv_tokens: int  # KV positions reserved for it: prompt + max_tokens
    arrived: float
    slot: int | None = None
    prefill: collections.deque[tuple[int, int]] = field(default_factory=collections.deque)
    started: bool = False  # the worker has handed back its prefill ranges
    chunked: bool = False  # a part of its prompt has run
    cancelled: bool = False
    lane: tuple[int, int] | None = None  # the prompt range the prefill lane is running for it
    in_steps: bool = False  # its prompt runs in the steps only, never on the lane (a prompt's scoring)

    @property
    def decoding(self) -> bool:
        return self.started and not self.prefill and self.lane is None


@dataclass(frozen=True)
class StepPlan(Generic[T]):
    release: tuple[Ticket[T], ...]  # cancelled: end them and free their slots (slot None: never admitted)
    prefill: tuple[Ticket[T], int, int] | None  # (ticket, start, end): one prompt chunk to run
    decode: tuple[Ticket[T], ...]  # advance one token each, in one run over rows 0..rows-1
    rows: int  # the decode run's batch: slots above a decoding one that are not decoding run as padding
    lane: tuple[Ticket[T], int, int] | None = None  # (ticket, start, end): a prompt range for the prefill lane

    @property
    def empty(self) -> bool:
        return not (self.release or self.prefill or self.decode or self.lane)


class ChunkBudget:
    """Prompt tokens per chunk while streams decode, steered by what the last mixed steps cost; and
    whether a short prompt may run whole, from a line fitted to the device's recent prefill runs."""

    def __init__(self, max_tokens: int, share: float = PREFILL_SHARE, min_step: float = MIN_STEP_SECONDS,
                 start: int = 16, short_step: float = SHORT_PROMPT_STEP_SECONDS) -> None:  # fmt: skip
        self.max_tokens = max_tokens
        self.share = share
        self.min_step = min_step
        self.short_step = short_step
        self.tokens = max(MIN_CHUNK_TOKENS, min(start, max_tokens))
        self.decode_seconds = 0.0  # the last decode run
        self._runs: collections.deque[tuple[int, float]] = collections.deque(maxlen=PREFILL_HISTORY)
        self._fit: tuple[float, float] | None = None  # (fixed seconds, seconds per token), made on demand

    def ran_prefill(self, tokens: int, seconds: float) -> None:
        """A prompt chunk (or whole prompt) of `tokens` took `seconds`, with or without decoding
        beside it. Runs over FIT_MAX_TOKENS are left out: the fit decides about short prompts, and
        a long run adds attention within itself that a line in `tokens` does not follow."""
        if 0 < tokens <= FIT_MAX_TOKENS and seconds > 0:
            self._runs.append((tokens, seconds))
            self._fit = None

    def ran_decode(self, seconds: float) -> None:
        self.decode_seconds = seconds

    def prefill_seconds(self, tokens: int) -> float | None:
        """What a run of `tokens` prompt tokens should cost: a fixed part (the weights streamed once)
        plus a part per token, fitted to the runs remembered; None before two run sizes were seen."""
        if len({n for n, _ in self._runs}) < 2:
            return None
        if self._fit is None:
            self._fit = _robust_line(list(self._runs))
        fixed, per_token = self._fit
        return fixed + per_token * tokens

    def whole(self, tokens: int) -> bool:
        """Whether a prompt of `tokens` may run in one step beside the decoding streams."""
        cost = self.prefill_seconds(tokens)
        return cost is not None and self.decode_seconds + cost <= self.short_step

    def observe(self, decode_seconds: float, chunk_tokens: int, chunk_seconds: float) -> None:
        """One step ran `chunk_tokens` of prompt in `chunk_seconds` beside a decode of `decode_seconds`."""
        if decode_seconds <= 0 or chunk_seconds <= 0 or chunk_tokens <= 0:
            return
        target = max(self.share * decode_seconds, self.min_step - decode_seconds)
        scaled = chunk_tokens * target / chunk_seconds
        # Move at most 2x a step either way: one noisy step must not swing the next chunk.
        scaled = min(max(scaled, self.tokens / 2), self.tokens * 2)
        self.tokens = int(max(MIN_CHUNK_TOKENS, min(self.max_tokens, round(scaled))))


def _robust_line(runs: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed, per token) through runs of (tokens, seconds), robust to a few slow runs: the median
    of the slopes between pairs of runs of different sizes, then the median intercept (Theil-Sen).
    A least-squares line was not: prompts of 47-53 tokens and one run slowed to 41 ms gave it a
    steep slope and a negative fixed part, which, set to zero, charged 51 tokens 107 ms (they cost
    26), so no short prompt ran whole for the next 64 runs. Where the line has no rising slope or
    no fixed part to stand on, every token is charged the median rate seen instead."""
    slopes = sorted((t2 - t1) / (n2 - n1)
                    for i, (n1, t1) in enumerate(runs) for n2, t2 in runs[i + 1:] if n2 != n1)  # fmt: skip
    per_token = slopes[len(slopes) // 2]
    intercepts = sorted(t - per_token * n for n, t in runs)
    fixed = intercepts[len(intercepts) // 2]
    if per_token > 0 and fixed >= 0:
        return fixed, per_token
    rates = sorted(t / n for n, t in runs)
    return 0.0, rates[len(rates) // 2]


class Scheduler(Generic[T]):
    def __init__(self, slots: int, kv_tokens: int, slot_capacity: int, max_queued: int,
                 max_chunk_tokens: int, lane: bool = False) -> None:  # fmt: skip
        """`lane`: the device has a prefill lane, where a long prompt runs beside the decode steps."""
        if slots < 1:
            raise ValueError("a device needs at least one slot")
        self.slots = slots
        self.kv_tokens = kv_tokens  # the KV budget over all slots, in token positions
        self.slot_capacity = slot_capacity  # one slot's KV rows hold at most this many positions
        self.max_queued = max_queued
        self.budget = ChunkBudget(max_chunk_tokens)
        self.lane = lane
        self.waiting: collections.deque[Ticket[T]] = collections.deque()
        self.running: list[Ticket[T] | None] = [None] * slots  # by slot
        self.reserved = 0
        self.stopped = False

    # --- the request side ---------------------------------------------------------------------

    @property
    def room(self) -> int:
        """The most KV positions one request may fill."""
        return min(self.slot_capacity, self.kv_tokens)

    def check_fits(self, kv_tokens: int) -> None:
        """Refuse at once what could never be admitted, whatever else finishes."""
        room = self.room
        if kv_tokens > room:
            raise ContextOverflow(f"prompt + max_tokens needs {kv_tokens} KV positions; this device's KV cache holds "
                                  f"{room} per request (engine.kv_cache_mb)", "max_tokens")  # fmt: skip

    def add(self, job: T, kv_tokens: int, now: float, front: bool = False) -> Ticket[T]:
        """Queue a request; `front` (one moved here mid-request) goes first and ignores the bound."""
        if self.stopped:
            raise EngineStopped("the engine is stopping")
        self.check_fits(kv_tokens)
        if not front and len(self.waiting) >= self.max_queued:
            raise EngineBusy(f"the queue is full ({self.max_queued} waiting)")
        ticket = Ticket(job, kv_tokens, now)
        if front:
            self.waiting.appendleft(ticket)
        else:
            self.waiting.append(ticket)
        return ticket

    def set_max_queued(self, value: int) -> None:
        self.max_queued = value

    def stop(self) -> None:
        """Refuse new requests from now on; the worker drains the rest."""
        self.stopped = True

    def cancel(self, ticket: Ticket[T]) -> None:
        """The client went away: the next plan releases it (and its slot, if it has one)."""
        ticket.cancelled = True

    # --- the worker side ----------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return len(self.waiting)

    @property
    def active(self) -> int:
        return sum(t is not None for t in self.running)

    @property
    def lane_busy(self) -> bool:
        """A prompt range is out on the prefill lane (until `lane_done`)."""
        return any(t is not None and t.lane is not None for t in self.running)

    def has_work(self, admitting: bool) -> bool:
        return (self.active > 0 or any(t.cancelled for t in self.waiting)
                or (admitting and bool(self.waiting)))  # fmt: skip

    def admit(self, admitting: bool = True) -> list[Ticket[T]]:
        """Give free slots to the oldest waiting requests that fit the KV budget, in order.

        `admitting` False (the governor sheds load) admits nothing. The head of the queue is never
        passed over, so a large request waits for room rather than starving behind small ones.
        """
        admitted: list[Ticket[T]] = []
        while admitting and self.waiting and not self.waiting[0].cancelled:
            head = self.waiting[0]
            slot = next((i for i, t in enumerate(self.running) if t is None), None)
            if slot is None or self.reserved + head.kv_tokens > self.kv_tokens:
                break
            self.waiting.popleft()
            head.slot = slot
            self.running[slot] = head
            self.reserved += head.kv_tokens
            admitted.append(head)
        return admitted

    def start(self, ticket: Ticket[T], ranges: Iterable[tuple[int, int]], in_steps: bool = False) -> None:
        """The worker started an admitted request: these prompt ranges remain to prefill
        (`in_steps`: in the steps only, never on the lane)."""
        ticket.prefill.extend(ranges)
        ticket.started = True
        ticket.in_steps = in_steps

    def plan(self) -> StepPlan[T]:
        """What the next step runs. Assumes the worker runs all of it (or finishes what fails)."""
        release = [t for t in self.waiting if t.cancelled]
        for t in release:
            self.waiting.remove(t)
        for running in self.running:
            # A ticket out on the lane is released once the lane hands it back (its run stops early).
            if running is not None and running.cancelled and running.lane is None:
                release.append(running)
                self._free(running)
        decode = tuple(t for t in self.running if t is not None and t.decoding)
        chunk = lane = None
        prefilling = sorted((t for t in self.running if t is not None and t.started and t.prefill),
                            key=lambda t: t.arrived)  # fmt: skip
        if prefilling and not self.lane_busy:  # one prompt at a time, the oldest first
            ticket = prefilling[0]
            start, end = ticket.prefill[0]
            untouched = not ticket.chunked and len(ticket.prefill) == 1  # a short prompt may run whole
            whole = untouched and self.budget.whole(end - start)
            # Until the device's prefill cost is fitted, a short prompt is chunked in the steps: those
            # runs teach the fit (the lane's, on half the cores, would not), and then it runs whole.
            remaining = sum(b - a for a, b in ticket.prefill)
            learning = remaining <= FIT_MAX_TOKENS and self.budget.prefill_seconds(remaining) is None
            # Else a long prompt's whole range runs on the lane beside the steps (a scored one's in them).
            if decode and self.lane and not (whole or learning or ticket.in_steps):
                ticket.prefill.popleft()
                ticket.chunked = True
                ticket.lane = (start, end)
                lane = (ticket, start, end)
            else:
                if decode and not whole:
                    end = min(end, start + self.budget.tokens)
                    if ticket.prefill[0][1] - end < MIN_CHUNK_TOKENS:  # nor leave a lone token for the next chunk
                        end = ticket.prefill[0][1]
                ticket.chunked = True
                if end == ticket.prefill[0][1]:
                    ticket.prefill.popleft()
                else:
                    ticket.prefill[0] = (end, ticket.prefill[0][1])
                chunk = (ticket, start, end)
        rows = max((t.slot for t in decode if t.slot is not None), default=-1) + 1
        return StepPlan(tuple(release), chunk, decode, rows, lane)

    def lane_done(self, ticket: Ticket[T], reached: int) -> None:
        """The lane handed the ticket back with its prompt run up to `reached`; what it did not run
        (stopped early: a cancel, or no stream left to run beside) goes back to the front."""
        assert ticket.lane is not None
        start, end = ticket.lane
        ticket.lane = None
        if start <= reached < end:
            ticket.prefill.appendleft((reached, end))

    def finish(self, ticket: Ticket[T]) -> None:
        """The request ended (end of turn, a limit, an error, moved away): free its slot."""
        if ticket.slot is not None and self.running[ticket.slot] is ticket:
            self._free(ticket)
        elif ticket in self.waiting:
            self.waiting.remove(ticket)

    def drain(self) -> list[Ticket[T]]:
        """Stop: everything waiting or running, to be ended by the worker; later adds are refused."""
        self.stopped = True
        tickets = [*self.waiting, *(t for t in self.running if t is not None)]
        self.waiting.clear()
        self.running = [None] * self.slots
        self.reserved = 0
        return tickets

    def _free(self, ticket: Ticket[T]) -> None:
        assert ticket.slot is not None
        self.running[ticket.slot] = None
        self.reserved -= ticket.kv_tokens
