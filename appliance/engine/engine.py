"""The engine: a verified bundle in, async streams of token events out.

Each device has one worker thread that owns its ONNX Runtime session and KV slots. A pure
scheduler decides each step (which waiting requests get a slot, which prompt chunk runs, which
slots decode); the worker runs it: every decoding request advances one token in one batched run,
so N streams cost far less than N times one, and a cancelled request stops within a step. On the
CPU a long prompt prefills beside the steps on half the cores (the prefill lane, lane.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from appliance.engine.chat import ChatTemplate, Prompt, tool_use_template
from appliance.engine.constraint import Constraint, GrammarCompiler
from appliance.engine.errors import ContextOverflow, EngineError, EngineStopped, GenerationFailed, InvalidRequest
from appliance.engine.generation import Generation, ShardPolicy
from appliance.engine.lane import PrefillLane
from appliance.engine.prefix_cache import PrefixCache
from appliance.engine.reasoning import thought_format
from appliance.engine.request import Event, Finished, GenerationRequest, TextDelta
from appliance.engine.scheduler import Scheduler, StepPlan, Ticket
from appliance.engine.session import ModelSession
from appliance.engine.tokenizer import TextTokenizer
from appliance.engine.tools import CallFormat, OutputRules, ToolChoice, grammar
from appliance.engine.trace import Trace
from firmware import Bundle

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    max_tokens_per_shard: int | None = None  # None: the firmware's baked value (the plan checks config lowers it)
    prefix_cache_bytes: int = 256 << 20
    prefix_block_tokens: int = 16  # SmolLM2's template shares 24 tokens: blocks of 32 reused none of them
    max_active_per_device: int = 8  # the slots: requests a device decodes together
    kv_cache_bytes: int = 0  # KV budget per device; 0: room for every slot at the model's full context
    max_queued: int = 64
    intra_op_threads: int = 0  # 0: one per CPU
    tensorrt: bool = False  # GPU sessions through TensorRT (asked for, and loadable, or the daemon refuses)
    prefill_lane: bool = True  # CPU, 2+ threads: a long prompt prefills beside the decode steps (lane.py)


def config_for(bundle: Bundle, config: EngineConfig) -> EngineConfig:
    """The engine config as it applies to `bundle`: a hybrid model (recurrent layers) has no prefill
    lane, since a recurrent state sums up the whole sequence: it cannot be copied position by
    position from a staging row. (Its prefix pool keeps whole rows with their states instead.)"""
    if any(f is not None and f.state_names for f in (bundle.model, bundle.cuda_model)):
        return dataclasses.replace(config, prefill_lane=False)
    return config


def lane_threads(config: EngineConfig, device: str) -> tuple[int, int] | None:
    """The threads of a device's decode steps and of its prefill lane while the lane runs (half
    the cores each), or None where the device has no lane."""
    threads = config.intra_op_threads or os.cpu_count() or 1
    if device != "cpu" or not config.prefill_lane or threads < 2:
        return None
    return threads // 2, threads - threads // 2


def sessions_on(config: EngineConfig, device: str) -> int:
    """ONNX Runtime sessions a device holds, each with the model's weights: its own, and with a
    lane the halves' (one session serves both where each half is one thread)."""
    split = lane_threads(config, device)
    return 1 if split is None else 2 if split == (1, 1) else 3


def kv_positions(config: EngineConfig, context_length: int, bytes_per_position: int) -> int:
    """The KV positions one device may hold for running requests: every slot at the full context,
    unless `kv_cache_bytes` caps it lower."""
    full = config.max_active_per_device * context_length
    if not config.kv_cache_bytes:
        return full
    return max(1, min(full, config.kv_cache_bytes // bytes_per_position))


class Stream:
    """One request's events, consumed with `async for`. Leaving the loop early cancels it."""

    def __init__(self, request: GenerationRequest, prompt: Prompt, trace: Trace,
                 loop: asyncio.AbstractEventLoop) -> None:  # fmt: skip
        self.request = request
        self.prompt = prompt
        self.trace = trace
        self.input_tokens = len(prompt.ids)
        self.cancelled = False
        self.finished: Finished | None = None
        self.loop = loop
        self._queue: asyncio.Queue[Event | BaseException] = asyncio.Queue()

    def cancel(self) -> None:
        """Stop generating: the worker drops the request at its next step and frees its KV cache."""
        self.cancelled = True

    def put(self, events: list[Event | BaseException]) -> None:
        """Queue events for the consumer; called on the stream's own loop."""
        for e in events:
            self._queue.put_nowait(e)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        try:
            while True:
                item = await self._queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, Finished):
                    self.finished = item
                    return
        finally:
            if self.finished is None:
                self.cancel()


Delivery = tuple[Stream, list[Event | BaseException]]


def deliver(items: list[Delivery]) -> None:
    """Hand events to their streams from a worker thread: one wake-up of each event loop for all
    of them (a batched step produces a token for every stream at once)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Delivery]] = {}
    for stream, events in items:
        by_loop.setdefault(stream.loop, []).append((stream, events))
    for loop, batch in by_loop.items():
        if not loop.is_closed():
            loop.call_soon_threadsafe(_put_batch, batch)


def _put_batch(batch: list[Delivery]) -> None:
    for stream, events in batch:
        stream.put(events)


@dataclass(eq=False)
class Job:
    """A request on a device: its stream, its generation, and the scheduler's ticket for it."""

    stream: Stream
    generation: Generation
    ticket: Ticket[Job] | None = None


class DeviceWorker:
    """The thread that owns one device's session and KV slots and runs the scheduler's plans.

    Each step it releases what was cancelled, starts newly admitted requests in their slots, runs
    the planned prompt chunk and then one batched decode of every decoding slot, and delivers
    each stream's events. ONNX Runtime releases the GIL while it runs, so the event loop is never
    blocked by a model run.
    """

    def __init__(self, session: ModelSession, slots: int, kv_tokens: int, max_queued: int,
                 max_chunk_tokens: int, recover: Callable[[Job, Exception], bool] | None = None,
                 admitting: Callable[[], bool] | None = None,
                 halves: tuple[ModelSession, ModelSession] | None = None) -> None:  # fmt: skip
        """`halves`: the sessions of the decode steps and of the prefill lane while the lane runs
        (the same one where each has one thread); None: no lane."""
        self.session = session
        self.recover = recover  # may take over a failed job (the OOM fallback); True if it did
        self.admitting: Callable[[], bool] = admitting or (lambda: True)  # False: new jobs wait (shed policy)
        self.device = session.device
        # A CPU row commits memory only where it is written, so one request may use the whole budget;
        # a device buffer is allocated whole, so there each slot gets an equal share of it.
        share = kv_tokens if session.ort_device == "cpu" else kv_tokens // slots
        capacity = max(1, min(session.facts.context_length, share))
        self.kv = session.new_slots(slots, capacity)
        self._cond = threading.Condition()
        self.decode_half: ModelSession | None = None
        self.lane: PrefillLane | None = None
        if halves is not None:
            self.decode_half = halves[0]
            self.lane = PrefillLane(halves[1], capacity, self._wake, f"prefill-{self.device}")
        self.scheduler: Scheduler[Job] = Scheduler(slots, kv_tokens, capacity, max_queued, max_chunk_tokens,
                                                   lane=self.lane is not None)  # fmt: skip
        self._outbox: list[Delivery] = []  # events not yet delivered: they go before the next model run
        self._masks = ThreadPoolExecutor(1, thread_name_prefix=f"masks-{self.device}")  # grammar masks
        self.last_progress = time.monotonic()  # the watchdog reads this
        self._thread = threading.Thread(target=self._run, name=f"engine-{self.device}", daemon=True)
        self._thread.start()

    def set_max_queued(self, value: int) -> None:
        with self._cond:
            self.scheduler.set_max_queued(value)

    @property
    def depth(self) -> int:
        return self.scheduler.queued + self.scheduler.active

    @property
    def queued(self) -> int:
        return self.scheduler.queued

    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: Job, front: bool = False) -> None:
        """Queue a job; `front` (a job moved here mid-request) goes first and ignores the bound."""
        with self._cond:
            job.ticket = self.scheduler.add(job, job.generation.kv_tokens, time.monotonic(), front)
            self._cond.notify()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self.scheduler.stop()
            self._cond.notify()
        self._thread.join(timeout)
        self._masks.shutdown(wait=False)

    def warm(self) -> None:
        """A prompt and a decode step through slot 0 on each session, before the thread has anything to run."""
        sessions = [self.session, self.decode_half, self.lane.session if self.lane is not None else None]
        for session in dict.fromkeys(s for s in sessions if s is not None):
            cache = self.kv.row(0)
            session.forward(cache, np.array([0, 1], dtype=np.int64))
            session.decode(self.kv, np.zeros(1, dtype=np.int64), np.array([cache.length]))
        self.kv.release(0)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _run(self) -> None:
        sched = self.scheduler
        while True:
            with self._cond:
                while not sched.stopped:
                    self._note_cancels()
                    if sched.has_work(self.admitting()):
                        break
                    self._deliver()
                    self.last_progress = time.monotonic()
                    self._cond.wait(0.05 if sched.queued or sched.active else 1.0)
                if sched.stopped:
                    leftover = sched.drain()
                    break
                admitted = sched.admit(self.admitting())
            if admitted:
                self._deliver()  # a prefix import can take a few milliseconds
            for ticket in admitted:
                self._start(ticket)
            self._take_lane()
            with self._cond:
                self._note_cancels()
                plan = sched.plan()
            if plan.empty and sched.lane_busy:
                self._wait_for_lane()
                continue
            self._execute(plan)
            self.last_progress = time.monotonic()
        if self.lane is not None:
            self.lane.stop()
        self._deliver()
        for ticket in leftover:
            ticket.job.generation.release()
        deliver([(t.job.stream, [EngineStopped("the engine stopped before this request finished")])
                 for t in leftover])  # fmt: skip

    def _deliver(self) -> None:
        """Hand the events gathered so far to their streams. Called just before a model run (and
        before idling): ONNX Runtime releases the GIL at once, so the event loop's work for them
        runs beside the model instead of the worker waiting for the GIL the loop took on waking;
        and a newcomer's first token leaves when its prefill ends, not after the decode beside it."""
        if self._outbox:
            deliver(self._outbox)
            self._outbox = []

    def _note_cancels(self) -> None:
        for ticket in (*self.scheduler.waiting, *(t for t in self.scheduler.running if t is not None)):
            if ticket.job.stream.cancelled and not ticket.cancelled:
                self.scheduler.cancel(ticket)

    def _start(self, ticket: Ticket[Job]) -> None:
        assert ticket.slot is not None
        job = ticket.job
        try:
            ranges = job.generation.start(self.kv.row(ticket.slot))
        except Exception as exc:
            self._fail([job], exc)
            return
        with self._cond:
            self.scheduler.start(ticket, ranges, in_steps=job.generation.scoring)

    def _to_lane(self, ticket: Ticket[Job], start: int, end: int) -> None:
        """Start a prompt range on the lane; the steps go on beside it."""
        assert self.lane is not None
        job, stream = ticket.job, ticket.job.stream
        gen = job.generation
        whole = gen.remember_prompt if end == gen.prompt_end else None
        try:
            assert gen.cache is not None
            self.lane.run(job, gen.cache, gen.prompt_ids(start, end), start, end, lambda: stream.cancelled, whole)
        except Exception as exc:
            with self._cond:
                self.scheduler.lane_done(ticket, start)
            self._fail([job], exc)

    def _take_lane(self) -> None:
        """Ranges the lane finished go into their slot rows (no step runs now); a whole prompt
        chooses its first token."""
        if self.lane is None:
            return
        for run in self.lane.take():
            job = run.owner
            assert isinstance(job, Job) and job.ticket is not None
            ticket, gen = job.ticket, job.generation
            if gen.cache is not None:
                self.lane.restore(gen.cache, run.reached)
            with self._cond:
                self.scheduler.lane_done(ticket, run.reached)
            if run.error is not None or ticket.cancelled or not ticket.prefill:
                self.lane.finished(job)
            if run.error is not None:
                self._fail([job], run.error)
            elif run.logits is not None and not ticket.cancelled:
                self._emit(job, gen.prefilled(run.end, run.logits, remembered=True))
            self.last_progress = time.monotonic()

    def _wait_for_lane(self) -> None:
        """Only the lane has work: with no step beside it, the rest of its range runs here on all
        the cores instead (it stops after its run in progress); wait for it."""
        assert self.lane is not None
        self._deliver()
        self.lane.recall()
        with self._cond:
            if not self.lane.has_results():
                self._cond.wait(0.05)

    def _execute(self, plan: StepPlan[Job]) -> None:
        for ticket in plan.release:
            self._end(ticket.job, [ticket.job.generation.cancel()])
        if plan.lane is not None:
            self._to_lane(*plan.lane)
        chunk_seconds = 0.0
        if plan.prefill is not None:
            ticket, start, end = plan.prefill
            job = ticket.job
            self._deliver()
            t0 = time.perf_counter()
            try:
                events = job.generation.prefill(start, end)
            except Exception as exc:
                self._fail([job], exc)
            else:
                # (A prompt's scoring runs the LM head on every position: not what the fit prices.)
                chunk_seconds = 0.0 if job.generation.scoring else time.perf_counter() - t0
                if chunk_seconds:
                    with self._cond:
                        self.scheduler.budget.ran_prefill(end - start, chunk_seconds)
                self._emit(job, events)
        decode = [t for t in plan.decode if t.slot is not None and self.scheduler.running[t.slot] is t]
        if not decode:
            self._deliver()  # no model run follows in this step
            return
        tokens = np.zeros(plan.rows, dtype=np.int64)
        lengths = np.zeros(plan.rows, dtype=np.int64)
        # While the lane runs, the steps take the other half of the cores.
        session = self.decode_half if self.decode_half is not None and self.scheduler.lane_busy else self.session
        beside_lane = session is not self.session
        for t in self.scheduler.running[: plan.rows]:
            # Padding rows keep their own length; one out on the lane pads at 0 (lane.py restores it).
            if t is not None and t.job.generation.cache is not None and t.lane is None:
                assert t.slot is not None
                lengths[t.slot] = t.job.generation.cache.length
        for t in decode:
            assert t.slot is not None
            tokens[t.slot] = t.job.generation.decode_input
        # A recurrent state advances in any run over its row: a row padded along keeps its own.
        keep = [t.slot for t in self.scheduler.running[: plan.rows]
                if t is not None and t.slot is not None and t not in decode] if self.kv.state_specs else []  # fmt: skip
        t0 = time.perf_counter()
        masks = self._fill_masks([t.job.generation.constraint for t in decode])
        self._deliver()
        try:
            logits = session.decode(self.kv, tokens, lengths, keep)
        except Exception as exc:  # the whole batch failed: each request ends or moves
            self._fail([t.job for t in decode], exc)
            return
        finally:
            if masks is not None:
                masks.result()
        seconds = time.perf_counter() - t0
        with self._cond:
            budget = self.scheduler.budget
            if not beside_lane:  # the budget prices steps on all the cores
                budget.ran_decode(seconds)
            if chunk_seconds and plan.prefill is not None:
                budget.observe(seconds, plan.prefill[2] - plan.prefill[1], chunk_seconds)
        for t in decode:
            assert t.slot is not None
            job = t.job
            try:
                events = job.generation.decoded(logits[t.slot], seconds * 1000)
            except Exception as exc:  # a sampler or detokenizer failure ends this request only
                self._fail([job], exc)
                continue
            self._emit(job, events)

    def _fill_masks(self, constraints: list[Constraint | None]) -> Future[None] | None:
        """Grammar masks for this step's tokens, computed while the model runs (ONNX Runtime
        releases the GIL), so a constrained row costs the batch next to nothing."""
        pending = [c for c in constraints if c is not None]
        if not pending:
            return None
        return self._masks.submit(_fill_all, pending)

    def _emit(self, job: Job, events: list[Event]) -> None:
        if job.generation.done:
            self._end(job, events)
        elif events:
            self._outbox.append((job.stream, list(events)))

    def _end(self, job: Job, events: Sequence[Event | BaseException]) -> None:
        """The request is over here: free its slot and row, then tell its stream."""
        ticket = job.ticket
        with self._cond:
            if ticket is not None:
                self.scheduler.finish(ticket)
        if ticket is not None and ticket.slot is not None:
            self.kv.release(ticket.slot)
        if events:
            self._outbox.append((job.stream, list(events)))

    def _fail(self, jobs: list[Job], exc: Exception) -> None:
        """A failed run must end its requests (or hand them to `recover`), never the worker."""
        for job in jobs:
            gen = job.generation
            self._end(job, [])
            if self.recover is not None and self.recover(job, exc):
                continue
            if isinstance(exc, InvalidRequest):  # the client's own input (a schema too costly to follow)
                log.warning("request %s ended on %s: %s", gen.request.request_id, self.device, exc)
            else:
                log.error("request %s failed on %s: %s", gen.request.request_id, self.device, exc,
                          exc_info=exc)  # fmt: skip
            gen.abort()
            # The stream's reader (the API) knows engine errors; anything else is the server's fault.
            failure = exc if isinstance(exc, EngineError) else GenerationFailed(f"{type(exc).__name__}: {exc}")
            self._outbox.append((job.stream, [failure]))


def _fill_all(constraints: list[Constraint]) -> None:
    for constraint in constraints:
        constraint.fill()


class Engine:
    def __init__(self, bundle: Bundle, config: EngineConfig | None = None, devices: tuple[str, ...] = ("cpu",),
                 cuda_options: dict[str, str] | None = None, on_fallback: Callable[[str], None] | None = None,
                 admitting: Callable[[str], bool] | None = None) -> None:  # fmt: skip
        """`admitting(device)` False holds new requests for that device in its queue (the shed policy)."""
        self.bundle = bundle
        self.model_name, self.model_version = bundle.name, bundle.version
        config = config or EngineConfig()
        self.config = config_for(bundle, config)
        if self.config != config:
            log.info("%s is a hybrid model (recurrent layers): no prefill lane for it", bundle.name)
        shard = self.config.max_tokens_per_shard or bundle.layer.max_tokens_per_shard
        if shard < 1:
            raise ValueError("max_tokens_per_shard must be at least 1")
        self.shard_policy = ShardPolicy(shard, bundle.layer.split_algorithm)
        self.tokenizer = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
        self.template = ChatTemplate(bundle.chat_template, self.tokenizer)
        # The model's template for conversations with tools, where it has one of its own (Hermes 2 Pro's):
        # transformers renders with it when tools are given; here also where earlier turns hold calls.
        self.tool_template = tool_use_template(bundle.tool_use_template, self.tokenizer)
        self.thought_format = thought_format(self.tokenizer, self.template.spelled, self.template.generation_prompt)
        self.prefix_cache = (
            PrefixCache(self.config.prefix_cache_bytes, self.config.prefix_block_tokens)
            if self.config.prefix_cache_bytes > 0
            else None
        )
        self._grammars: GrammarCompiler | None = None  # built on first use (0.3 s for a 49k vocabulary)
        self._grammars_lock = threading.Lock()
        self.workers: dict[str, DeviceWorker] = {}
        self.on_fallback = on_fallback
        for device in devices:
            session = ModelSession(bundle, device, intra_op_threads=self.config.intra_op_threads,
                                   cuda_options=cuda_options if device.startswith("cuda") else None,
                                   tensorrt=self.config.tensorrt)  # fmt: skip
            halves = None
            split = lane_threads(self.config, device)
            if split is not None:
                decode_half = ModelSession(bundle, device, intra_op_threads=split[0])
                lane_half = decode_half if split == (1, 1) else ModelSession(bundle, device, intra_op_threads=split[1])
                halves = (decode_half, lane_half)
                log.info("prefill lane on %s: long prompts on %d thread(s) beside decode steps on %d (the weights "
                         "held %d times)", device, split[1], split[0], sessions_on(self.config, device))  # fmt: skip
            self.workers[device] = DeviceWorker(
                session, self.config.max_active_per_device, self.kv_tokens(session), self.config.max_queued,
                self.shard_policy.max_tokens_per_shard, recover=self._recover,
                admitting=functools.partial(admitting, device) if admitting is not None else None, halves=halves,
            )
        self.default_device = devices[0]
        self.cpu_device = next((d for d in reversed(devices) if d == "cpu"), None)

    def kv_tokens(self, session: ModelSession) -> int:
        """The KV budget of a device in token positions (what admission counts)."""
        return kv_positions(self.config, self.context_length, session.kv_bytes_per_token)

    def _recover(self, job: Job, exc: Exception) -> bool:
        """A GPU run that failed to allocate is re-run on the CPU from where it was (runs on the
        failed device's worker thread)."""
        from appliance.governor import is_allocation_failure

        device = job.generation.session.device
        if self.cpu_device is None or device == self.cpu_device or not is_allocation_failure(exc):
            return False
        log.warning("request %s: %s ran out of memory; continuing it on %s", job.generation.request.request_id,
                    device, self.cpu_device)  # fmt: skip
        target = self.workers[self.cpu_device]
        job.generation.migrate(target.session, f"{device} out of memory")
        try:
            target.submit(job, front=True)
        except EngineStopped:
            return False
        if self.on_fallback is not None:
            self.on_fallback("oom")
        return True

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self.workers)

    @property
    def context_length(self) -> int:
        return self.bundle.model.context_length

    @property
    def thinks(self) -> bool:
        """Whether the model writes a thought before its answer (its template opens one)."""
        return self.thought_format is not None

    def prepare(self, request: GenerationRequest) -> Prompt:
        """Validate, render and tokenize (pure CPU work: callers on an event loop run it in a
        thread); raises InvalidRequest before anything is queued."""
        request.validate()
        self._in_vocabulary("logit_bias", [token for token, _ in request.logit_bias])
        self._in_vocabulary("prompt", request.raw_prompt if isinstance(request.raw_prompt, tuple) else ())
        prompt = self._render(request)
        if not prompt.ids:
            raise InvalidRequest("the prompt is empty after rendering", "messages")
        max_tokens = self._fitted(request, len(prompt.ids), self.context_length)
        need = len(prompt.ids) + max_tokens
        if need > self.context_length:
            raise ContextOverflow(
                f"prompt ({len(prompt.ids)} tokens) + max_tokens ({max_tokens}) = {need} exceeds the "
                f"model's context of {self.context_length} tokens",
                "max_tokens", len(prompt.ids), max_tokens, self.context_length,
            )
        rules, fmt = request.output, prompt.call_format
        if fmt.channel and rules.calls_allowed:  # harmony: a call is a message of its own, the text answer another
            only = "tool" if rules.choice.mode == "tool" else "required"
            only_calls = dataclasses.replace(rules.choice, mode=only, parallel=False)
            calls = dataclasses.replace(rules, choice=only_calls, json_schema=None)
            prompt = dataclasses.replace(prompt, call_constraint=self._constraint(calls, fmt))
            rules = dataclasses.replace(rules, tools=())
        # It holds the answer; a thought before it runs free (reasoning.Gate).
        prompt = dataclasses.replace(prompt, constraint=self._constraint(rules, fmt))
        if self.thought_format is not None and request.raw_prompt is None:
            prompt = dataclasses.replace(prompt, thought_format=self.thought_format)
        return prompt

    @staticmethod
    def _fitted(request: GenerationRequest, prompt_tokens: int, room: int) -> int:
        """The answer's limit: max_tokens, or where it fits the room (fit_context) what the prompt
        leaves of it, one token at least (a prompt that fills the room overflows)."""
        if not request.fit_context:
            return request.max_tokens
        return max(1, min(request.max_tokens, room - prompt_tokens))

    def _constraint(self, rules: OutputRules, fmt: CallFormat) -> Constraint | None:
        lark = grammar(rules, fmt)
        if lark is None:
            return None
        try:
            return self.grammars().constraint(lark, "tools" if rules.tools else rules.schema_field)
        except InvalidRequest:
            if rules.tools:
                self._blame(rules, fmt)
            raise

    def _blame(self, rules: OutputRules, fmt: CallFormat) -> None:
        """Raise the error of the schema at fault in a grammar of several that did not compile,
        named as the client knows it (a tool's, or the answer's format). Only on that error path:
        each schema is compiled alone."""
        grammars = self.grammars()
        if rules.json_schema is not None or rules.answer_rule is not None:
            answer = OutputRules(json_schema=rules.json_schema, schema_strict=rules.schema_strict,
                                 answer_rule=rules.answer_rule)  # fmt: skip
            grammars.constraint(grammar(answer, fmt) or "", rules.schema_field)
        for tool in rules.tools:
            alone = grammar(OutputRules((tool,), ToolChoice("tool", tool.name)), fmt)
            grammars.constraint(alone or "", "tools", f"the schema of tool {tool.name!r}")

    def grammars(self) -> GrammarCompiler:
        """The bundle's grammar compiler (its tokenizer trie), made by the first request that needs it."""
        with self._grammars_lock:
            if self._grammars is None:
                model = self.bundle.model
                self._grammars = GrammarCompiler(self.bundle.tokenizer_path, model.vocab_size, model.eos_token_ids)
            return self._grammars

    def _render(self, request: GenerationRequest) -> Prompt:
        if isinstance(request.raw_prompt, tuple):  # a plain completion of the client's own tokens, as they are
            ids = list(request.raw_prompt)
            return Prompt(ids=ids, message_starts=[], text=self.tokenizer.decode(ids))
        if request.raw_prompt is not None:  # a plain completion: the text as it is, with the tokenizer's BOS
            ids, _ = self.tokenizer.encode(request.raw_prompt, add_special_tokens=True)
            return Prompt(ids=ids, message_starts=[], text=request.raw_prompt)
        with_tools = request.output.tools or any(m.calls or m.results for m in request.messages)
        template = self.tool_template if with_tools and self.tool_template is not None else self.template
        return template.prompt(request.messages, request.system, request.output, request.thinking,
                               request.reasoning_effort, request.thinking_budget,
                               dict(request.template_variables))  # fmt: skip

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        """The model's token ids for a text (its BOS where `add_special_tokens` and it has one)."""
        return self.tokenizer.encode(text, add_special_tokens)[0]

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of token ids, special tokens left out (as answers are written)."""
        self._in_vocabulary("tokens", tokens)
        return self.tokenizer.decode(list(tokens))

    def _in_vocabulary(self, param: str, tokens: Sequence[int]) -> None:
        vocab = self.bundle.model.vocab_size
        beyond = next((token for token in tokens if token >= vocab), None)
        if beyond is not None:
            raise InvalidRequest(f"{param}: token {beyond} is not in the model's vocabulary ({vocab} tokens)", param)

    def tokenizer_info(self) -> dict[str, object]:
        """What vLLM's /tokenizer_info tells of the tokenizer: its special tokens, chat template and context."""
        tok = self.tokenizer
        return {"eos_token": tok.eos_token, "bos_token": tok.bos_token, "chat_template": self.bundle.chat_template,
                "model_max_length": self.context_length, "vocab_size": self.bundle.model.vocab_size}  # fmt: skip

    def count_tokens(self, request: GenerationRequest) -> int:
        """Prompt tokens as the engine would see them; no context check (counting a long prompt is no error)."""
        request.validate()
        return len(self._render(request).ids)

    def submit(self, request: GenerationRequest, device: str | None = None, prompt: Prompt | None = None) -> Stream:
        """Queue a request on a device (default: the first). Must be called on the event loop;
        `prompt`: what prepare() made of it already (off the loop), else it is prepared here."""
        prompt = prompt if prompt is not None else self.prepare(request)
        device = device or self.default_device
        worker = self.workers.get(device)
        if worker is None:
            raise ValueError(f"no engine session on {device}")
        if request.prompt_logprobs is not None and not worker.session.scores_prompts:
            raise InvalidRequest(f"a prompt's log probabilities are not computed on {device} (a TensorRT session's "
                                 "graph gives the last position's logits only)", "logprobs")  # fmt: skip
        if request.fit_context:
            room = min(self.context_length, worker.scheduler.room)
            request = dataclasses.replace(request, max_tokens=self._fitted(request, len(prompt.ids), room))
        trace = Trace(request_id=request.request_id, device=device, input_tokens=len(prompt.ids))
        stream = Stream(request, prompt, trace, asyncio.get_running_loop())
        gen = Generation(request, prompt, worker.session, self.tokenizer, self.prefix_cache,
                         self.shard_policy, trace)  # fmt: skip
        worker.submit(Job(stream, gen))
        return stream

    async def complete(self, request: GenerationRequest, device: str | None = None) -> tuple[str, Finished]:
        """The whole answer at once."""
        parts: list[str] = []
        stream = self.submit(request, device)
        async for event in stream:
            if isinstance(event, TextDelta):
                parts.append(event.text)
        assert stream.finished is not None
        return "".join(parts), stream.finished

    def warm(self) -> None:
        """One short forward pass per session, so the first request does not pay for lazy init."""
        for worker in self.workers.values():
            worker.warm()

    def alive(self) -> bool:
        return all(w.alive() for w in self.workers.values())

    def healthy(self, stall_limit: float, now: float) -> bool:
        """Every worker alive and, if it has work, progressing within `stall_limit` seconds."""
        return all(w.alive() and (not w.depth or now - w.last_progress < stall_limit) for w in self.workers.values())

    @property
    def queued(self) -> int:
        return sum(w.queued for w in self.workers.values())

    @property
    def in_flight(self) -> int:
        """Requests running or waiting on any device (a retired engine closes when this reaches 0)."""
        return sum(w.depth for w in self.workers.values())

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Per device: requests in slots, waiting, whether its worker runs, and its KV in positions."""
        return {d: {"active": w.depth - w.queued, "queued": w.queued, "alive": w.alive(), "slots": w.scheduler.slots,
                    "kv_reserved": w.scheduler.reserved, "kv_budget": w.scheduler.kv_tokens}
                for d, w in self.workers.items()}  # fmt: skip

    def prefix_stats(self) -> dict[str, int]:
        """The prefix pool's lookups, hits, tokens reused and bytes held (zeros when it is off)."""
        pool = self.prefix_cache
        if pool is None:
            return {"lookups": 0, "hits": 0, "reused_tokens": 0, "bytes": 0}
        return {"lookups": pool.lookups, "hits": pool.hits, "reused_tokens": pool.reused_tokens, "bytes": pool.nbytes}

    def set_max_queued(self, value: int) -> None:
        for worker in self.workers.values():
            worker.set_max_queued(value)

    def close(self) -> None:
        for w in self.workers.values():
            w.stop()

