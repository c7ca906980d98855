"""The engine: a verified bundle in, async streams of token events out.

Each device has one worker thread that owns its ONNX Runtime session and interleaves the active
requests step by step (a prefill shard or one decode token each turn), so every admitted request
makes progress and a cancelled one stops within a step. ONNX Runtime releases the GIL while it
runs, so the asyncio loop is never blocked by a model run.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from appliance.engine.chat import ChatTemplate, Prompt
from appliance.engine.errors import ContextOverflow, EngineBusy, EngineStopped, InvalidRequest
from appliance.engine.generation import Generation, ShardPolicy
from appliance.engine.prefix_cache import PrefixCache
from appliance.engine.request import Event, Finished, GenerationRequest, TextDelta
from appliance.engine.session import ModelSession
from appliance.engine.tokenizer import TextTokenizer
from appliance.engine.trace import Trace
from firmware import Bundle

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    max_tokens_per_shard: int | None = None  # None: the firmware's baked value; may only lower it
    prefix_cache_bytes: int = 256 << 20
    prefix_block_tokens: int = 32
    max_active_per_device: int = 4
    max_queued: int = 64
    intra_op_threads: int = 0  # 0: one per CPU

    def shard_policy(self, bundle: Bundle) -> ShardPolicy:
        baked = bundle.layer.max_tokens_per_shard
        size = baked if self.max_tokens_per_shard is None else self.max_tokens_per_shard
        if size > baked:
            raise ValueError(
                f"max_tokens_per_shard={size} exceeds the firmware's baked {baked}: config may only lower it"
            )
        if size < 1:
            raise ValueError("max_tokens_per_shard must be at least 1")
        return ShardPolicy(size, bundle.layer.split_algorithm)


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
        self._loop = loop
        self._queue: asyncio.Queue[Event | BaseException] = asyncio.Queue()

    def cancel(self) -> None:
        """Stop generating: the worker drops the request at its next step and frees its KV cache."""
        self.cancelled = True

    def _deliver(self, events: list[Event | BaseException]) -> None:
        # Called on the worker thread; the queue lives on the loop.
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._put_all, events)

    def _put_all(self, events: list[Event | BaseException]) -> None:
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


@dataclass
class _Job:
    stream: Stream
    generation: Generation


class DeviceWorker:
    """The thread that runs one session's requests, fairly interleaved."""

    def __init__(self, session: ModelSession, max_active: int, max_queued: int,
                 recover: Callable[[_Job, Exception], bool] | None = None) -> None:  # fmt: skip
        self.session = session
        self.recover = recover  # may take over a failed job (the OOM fallback); True if it did
        self.admitting: Callable[[], bool] = lambda: True  # False: new jobs wait (the shed policy)
        self.device = session.device
        self.max_active = max_active
        self.max_queued = max_queued
        self._pending: collections.deque[_Job] = collections.deque()
        self._active: list[_Job] = []
        self._cond = threading.Condition()
        self._stopping = False
        self.last_progress = time.monotonic()  # the watchdog reads this
        self._thread = threading.Thread(target=self._run, name=f"engine-{self.device}", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        return len(self._pending) + len(self._active)

    @property
    def queued(self) -> int:
        return len(self._pending)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: _Job, front: bool = False) -> None:
        """Queue a job; `front` (a job moved here mid-request) goes first and ignores the bound."""
        with self._cond:
            if self._stopping:
                raise EngineStopped("the engine is stopping")
            if front:
                self._pending.appendleft(job)
            elif len(self._pending) >= self.max_queued:
                raise EngineBusy(f"the queue for {self.device} is full ({self.max_queued} waiting)")
            else:
                self._pending.append(job)
            self._cond.notify()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._active and (not self._pending or not self.admitting()):
                    self.last_progress = time.monotonic()
                    self._cond.wait(0.05 if self._pending else 1.0)
                if self._stopping:
                    jobs = list(self._pending) + self._active
                    self._pending.clear()
                    self._active.clear()
                    break
                while self._pending and len(self._active) < self.max_active and self.admitting():
                    self._active.append(self._pending.popleft())
                turn = list(self._active)
            for job in turn:
                self._step(job)
            self.last_progress = time.monotonic()
        for job in jobs:
            job.generation.release()
            job.stream._deliver([EngineStopped("the engine stopped before this request finished")])

    def _step(self, job: _Job) -> None:
        gen = job.generation
        try:
            if job.stream.cancelled:
                events: list[Event | BaseException] = [gen.cancel()]
            else:
                events = list(gen.step())
        except Exception as exc:  # a failed run must end this request, never the worker
            with self._cond:
                self._active.remove(job)
            if self.recover is not None and self.recover(job, exc):
                return
            log.exception("request %s failed on %s", gen.request.request_id, self.device)
            gen.release()
            gen.done = True
            job.stream._deliver([exc])
            return
        if gen.done:
            with self._cond:
                self._active.remove(job)
        if events:
            job.stream._deliver(events)


class Engine:
    def __init__(self, bundle: Bundle, config: EngineConfig | None = None, devices: tuple[str, ...] = ("cpu",),
                 cuda_options: dict[str, str] | None = None,
                 on_fallback: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self.bundle = bundle
        self.config = config or EngineConfig()
        self.shard_policy = self.config.shard_policy(bundle)
        self.tokenizer = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
        self.template = ChatTemplate(bundle.chat_template, self.tokenizer)
        self.prefix_cache = (
            PrefixCache(self.config.prefix_cache_bytes, self.config.prefix_block_tokens)
            if self.config.prefix_cache_bytes > 0
            else None
        )
        self.workers: dict[str, DeviceWorker] = {}
        self.on_fallback = on_fallback
        for device in devices:
            session = ModelSession(bundle, device, intra_op_threads=self.config.intra_op_threads,
                                   cuda_options=cuda_options if device.startswith("cuda") else None)  # fmt: skip
            self.workers[device] = DeviceWorker(
                session, self.config.max_active_per_device, self.config.max_queued, recover=self._recover
            )
        self.default_device = devices[0]
        self.cpu_device = next((d for d in reversed(devices) if d == "cpu"), None)

    def _recover(self, job: _Job, exc: Exception) -> bool:
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
    def context_length(self) -> int:
        return self.bundle.model.context_length

    def prepare(self, request: GenerationRequest) -> Prompt:
        """Validate and tokenize; raises InvalidRequest before anything is queued."""
        request.validate()
        prompt = self.template.prompt(request.messages, request.system)
        if not prompt.ids:
            raise InvalidRequest("the prompt is empty after rendering", "messages")
        need = len(prompt.ids) + request.max_tokens
        if need > self.context_length:
            raise ContextOverflow(
                f"prompt ({len(prompt.ids)} tokens) + max_tokens ({request.max_tokens}) = {need} exceeds the "
                f"model's context of {self.context_length} tokens",
                "max_tokens",
            )
        return prompt

    def count_tokens(self, request: GenerationRequest) -> int:
        """Prompt tokens as the engine would see them; no context check (counting a long prompt is no error)."""
        request.validate()
        return len(self.template.prompt(request.messages, request.system).ids)

    def submit(self, request: GenerationRequest, device: str | None = None) -> Stream:
        """Queue a request on a device (default: the first). Must be called on the event loop."""
        prompt = self.prepare(request)
        device = device or self.default_device
        worker = self.workers.get(device)
        if worker is None:
            raise ValueError(f"no engine session on {device}")
        trace = Trace(request_id=request.request_id, device=device, input_tokens=len(prompt.ids))
        stream = Stream(request, prompt, trace, asyncio.get_running_loop())
        gen = Generation(request, prompt, worker.session, self.tokenizer, self.prefix_cache,
                         self.shard_policy, trace)  # fmt: skip
        worker.submit(_Job(stream, gen))
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
        import numpy as np

        for worker in self.workers.values():
            cache = worker.session.new_cache(4)
            worker.session.forward(cache, np.array([0, 1], dtype=np.int64))

    def alive(self) -> bool:
        return all(w.alive() for w in self.workers.values())

    def close(self) -> None:
        for w in self.workers.values():
            w.stop()

