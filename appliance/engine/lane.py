"""The prefill lane: on the CPU, a long prompt prefills on half the cores in a thread of its own
while the decoding streams keep stepping on the other half.

Run between the streams' steps instead, each chunk of the prompt delays every stream's next token
by its own time, so chunks must stay small; late in a long prompt the smallest chunk costs as much
as a decode step (a 2-token chunk after 1950 positions: 14 ms, against 10 ms for 7 streams' step),
the prompt crawls along at a few tokens a step, and the streams grow long histories meanwhile
(SmolLM2 int8 on 2 cores: a 2000-token prompt beside 7 streams took 8.8 s to its first token, and
their step grew to 2.6-3x its usual length). On one core each, the streams' step takes 1.7x its
two-core time (15.5 against 9.2 ms) and is not stretched by the prompt at all, and the prompt runs
in efficient chunks (2048 tokens in 2.6 s on one core).

ONNX Runtime's intra-op pool does not share out well between two runs at once (two runs on one
2-thread session: decode steps at 2-3x their time, and erratic), so each half of the cores has a
session of its own: with one core a half, a single one-thread session serves both, since a run on
it uses only the thread that calls it. Each session holds the model's weights once more.

The lane computes a prompt in a staging row of its own, never in the request's slot row, whose
position 0 the decode steps write while the lane runs (a batch pads along every slot below its
highest decoding one, and the worker pads a row out on the lane at length 0). After each range the
lane copies what it computed into the slot row, all but position 0, which the worker puts back
between its steps; and after a whole prompt, the lane also offers it to the prefix pool: that copy
(90 MB for 2000 positions of the demo model) stalled every stream for 85 ms on the worker's thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from appliance.engine.scheduler import MIN_CHUNK_TOKENS
from appliance.engine.session import KVCache, ModelSession

log = logging.getLogger(__name__)

# The lane runs a range in runs of this many tokens and looks for a cancel or a recall between them.
# On one core, 2048 tokens take 2.65 s in runs of 64 and 2.56 s in runs of 512 (the longest, 0.8 s).
LANE_CHUNK_TOKENS = 64


@dataclass
class LaneRun:
    """What the lane did with one prompt range [start, end) of `owner`'s: it ran [start, reached),
    with the last position's logits when it reached the end, or it failed."""

    owner: object
    start: int
    reached: int
    end: int
    logits: np.ndarray | None = None
    error: Exception | None = None


@dataclass
class _Work:
    owner: object
    row: KVCache  # the owner's slot row
    ids: np.ndarray  # the prompt's tokens [start, end)
    start: int
    end: int
    stop: Callable[[], bool]  # the owner went away
    whole: Callable[[KVCache], None] | None  # given the staging row once the range ends the prompt


class PrefillLane:
    def __init__(self, session: ModelSession, capacity: int, notify: Callable[[], None], name: str) -> None:
        """`session`: the lane's half of the cores; `notify`: wakes the worker when a range is done."""
        self.session = session
        self.staging = session.new_slots(1, capacity).row(0)
        self._owner: object | None = None  # whose prompt the staging row holds
        self._notify = notify
        self._cond = threading.Condition()
        self._work: _Work | None = None
        self._done: list[LaneRun] = []
        self._recall = False
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def run(self, owner: object, row: KVCache, ids: np.ndarray, start: int, end: int, stop: Callable[[], bool],
            whole: Callable[[KVCache], None] | None = None) -> None:  # fmt: skip
        """Prefill prompt positions [start, end) (`ids`) of `owner`, whose first `start` positions
        are in `row` (its slot row), and copy them there; `whole`: what to do with the staging row
        if the range ends the prompt. From the worker thread, between its model runs: the staging
        row takes what it lacks of the first positions here, while no step writes the slot row."""
        if self._owner is not owner or self.staging.length > start:
            self.staging.length = 0
            self.staging.slots.release(0)
            self._owner = owner
        if self.staging.length < start:
            self.session.copy_span(row, self.staging, self.staging.length, start)
            self.staging.length = start
        with self._cond:
            assert self._work is None, "one range at a time"
            self._work = _Work(owner, row, ids, start, end, stop, whole)
            self._recall = False
            self._cond.notify()

    def recall(self) -> None:
        """Hand the range back after the run in progress: nothing runs beside it any more."""
        with self._cond:
            self._recall = True

    def has_results(self) -> bool:
        with self._cond:
            return bool(self._done)

    def take(self) -> list[LaneRun]:
        """The ranges finished (or stopped) since the last call."""
        with self._cond:
            done, self._done = self._done, []
        return done

    def restore(self, row: KVCache, reached: int) -> None:
        """Between steps: put position 0 back into the owner's slot row (the steps' padding wrote
        it; the lane copied the rest), which then holds `reached` positions."""
        self.session.copy_span(self.staging, row, 0, min(1, reached))
        row.length = reached

    def finished(self, owner: object) -> None:
        """The owner's prompt is all in its slot row: the staging pages go back."""
        if self._owner is owner:
            self._owner = None
            self.staging.length = 0
            self.staging.slots.release(0)

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._work is None and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                work = self._work
            assert work is not None
            result = LaneRun(work.owner, work.start, work.start, work.end)
            try:
                while result.reached < work.end and not (work.stop() or self._recall or self._stopped):
                    n = min(LANE_CHUNK_TOKENS, work.end - result.reached)
                    if work.end - result.reached - n < MIN_CHUNK_TOKENS:  # no lone token left for later
                        n = work.end - result.reached
                    offset = result.reached - work.start
                    result.logits = self.session.forward(self.staging, work.ids[offset : offset + n])
                    result.reached += n
            except Exception as exc:  # the worker ends the request; the lane goes on with the next
                log.debug("prefill lane run failed", exc_info=exc)
                result.error = exc
            try:  # the steps write only position 0 of the slot row: the rest is the lane's to fill
                self.session.copy_span(self.staging, work.row, max(work.start, 1), result.reached)
                if result.reached == work.end and result.error is None and work.whole is not None:
                    work.whole(self.staging)
            except Exception as exc:
                log.debug("prefill lane copy failed", exc_info=exc)
                result.error = result.error or exc
            if result.reached < work.end:
                result.logits = None
            with self._cond:
                self._work = None
                self._done.append(result)
            self._notify()
