"""Concurrent streaming clients against an OpenAI-style chat endpoint, as a user's clients see it.

Each of N clients runs a closed loop (send, read the stream to its end, send the next) over its
own prompts; every content chunk's arrival time is kept, so one run gives the aggregate tokens/s,
each stream's inter-token latency, time to first token and whole-request latency. Used by
bench/engine.py (our daemon over its Unix socket) and bench/peers.py (ours and llama.cpp's server).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

# Every concurrency measurement (bench/engine.py, bench/peers.py; bench/step_profile.py's bound
# assumes the same): each client a closed loop of ROUNDS requests for ANSWER_TOKENS new tokens.
ROUNDS = 3
ANSWER_TOKENS = 64

TOPICS = (
    "a lighthouse keeper who finds a message in a bottle", "the first expedition to a frozen moon",
    "a baker who can taste memories", "a robot learning to paint the sea", "two rival clockmakers",
    "a library that rearranges itself at night", "a cat that guards a mountain pass",
    "a violinist lost in a desert town", "the last train across a flooded valley", "a gardener on a space station",
    "a map that redraws its own borders", "a fisherman who catches a fallen star", "an orchestra of old radios",
    "a detective who solves crimes by smell", "a kite that never lands", "a city built on the back of a whale",
)  # fmt: skip


NARRATORS = (
    "an old sailor", "a child", "a retired spy", "a talking crow", "a nervous poet", "a cheerful ghost",
    "a tired nurse", "a young queen", "a lost robot", "a village baker", "a street musician", "a grumpy wizard",
    "a curious student", "a deep-sea diver", "a mountain guide", "a night watchman", "a circus acrobat",
    "a museum guard", "a lighthouse cat", "a time traveller", "a shy librarian", "a famous chef",
    "a desert nomad", "a bored dragon",
)  # fmt: skip
ENDINGS = ("Describe every scene carefully.", "Give every character a voice of their own.",
           "Let the weather change with the mood.", "End with a surprise.")  # fmt: skip


def story_prompt(n: int) -> str:
    """Request n's prompt, asking for a long answer. Numbered first, so no two share more than the
    chat template's own system part and a word or two: a server's prefix cache reuses that (as it
    would for any two users' questions), never an earlier request's topic or whole prompt."""
    topic = TOPICS[n % len(TOPICS)]
    narrator = NARRATORS[n // len(TOPICS) % len(NARRATORS)]
    ending = ENDINGS[n // (len(TOPICS) * len(NARRATORS)) % len(ENDINGS)]
    return f"Story {n}: write a long, detailed story about {topic}, told by {narrator}. {ending}"


@dataclass
class RequestTiming:
    sent: float
    chunks: list[float] = field(default_factory=list)  # arrival of each content chunk
    tokens: int = 0  # completion tokens (usage when the server gives it, else content chunks)
    prompt_tokens: int = 0
    done: float = 0.0

    @property
    def ttft(self) -> float:
        return self.chunks[0] - self.sent if self.chunks else self.done - self.sent

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.chunks, self.chunks[1:], strict=False)]


@dataclass
class LoadResult:
    clients: int
    wall: float
    requests: list[RequestTiming]

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.requests)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall

    def itl(self, q: float) -> float:
        gaps = sorted(g for r in self.requests for g in r.gaps)
        return gaps[min(len(gaps) - 1, int(q * len(gaps)))] if gaps else 0.0

    def latency(self, q: float) -> float:
        values = sorted(r.done - r.sent for r in self.requests)
        return values[min(len(values) - 1, int(q * len(values)))]

    @property
    def ttft_median(self) -> float:
        return statistics.median(r.ttft for r in self.requests)


def median_run(results: list[LoadResult]) -> LoadResult:
    """The run with the median aggregate tokens/s (its latencies are shown with it)."""
    return sorted(results, key=lambda r: r.tokens_per_s)[len(results) // 2]


class PromptSerials:
    """Hands out story_prompt numbers, so no prompt reaches one server twice."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, count: int) -> int:
        first, self.next = self.next, self.next + count
        return first


@dataclass(frozen=True)
class Endpoint:
    """Where a server's chat completions are: a base URL, and a Unix socket or None for TCP."""

    name: str
    base_url: str
    uds: str | None = None
    model: str = "default"
    extra: dict[str, object] = field(default_factory=dict)  # server-specific request fields

    def client(self) -> httpx.AsyncClient:
        # A new connection per request: a server may close an idle keep-alive connection just as the
        # next request goes out on it (llama-server's HTTP library caps requests per connection).
        transport = httpx.AsyncHTTPTransport(uds=self.uds, limits=httpx.Limits(max_keepalive_connections=0))
        return httpx.AsyncClient(base_url=self.base_url, transport=transport, timeout=600)


async def one_request(http: httpx.AsyncClient, endpoint: Endpoint, prompt: str, max_tokens: int,
                      seen: list[RequestTiming] | None = None) -> RequestTiming:  # fmt: skip
    """One streamed request; `seen` gets its timing as soon as it is sent (to watch it live)."""
    body = {"model": endpoint.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **endpoint.extra}  # fmt: skip
    timing = RequestTiming(time.perf_counter())
    if seen is not None:
        seen.append(timing)
    chunks = 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{endpoint.name}: {response.status_code} {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    timing.chunks.append(time.perf_counter())
                    chunks += 1
            usage = event.get("usage")
            if usage:
                timing.tokens = int(usage.get("completion_tokens") or 0)
                timing.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    timing.done = time.perf_counter()
    timing.tokens = timing.tokens or chunks
    return timing


async def run_load(endpoint: Endpoint, clients: int, rounds: int, max_tokens: int, first: int = 0) -> LoadResult:
    """`clients` closed loops of `rounds` requests each, all started together; the requests take
    prompts `first` to `first + clients * rounds - 1` (story_prompt)."""
    async with endpoint.client() as http:
        async def client(i: int) -> list[RequestTiming]:
            return [await one_request(http, endpoint, story_prompt(first + r * clients + i), max_tokens)
                    for r in range(rounds)]  # fmt: skip

        start = time.perf_counter()
        results = await asyncio.gather(*(client(i) for i in range(clients)))
        wall = time.perf_counter() - start
    return LoadResult(clients, wall, [t for per_client in results for t in per_client])



def wait_ready(proc: subprocess.Popen[bytes], log: Path, endpoint: Endpoint, path: str,
               timeout: float = 300.0) -> None:  # fmt: skip
    transport = httpx.HTTPTransport(uds=endpoint.uds) if endpoint.uds else None
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=endpoint.base_url, transport=transport, timeout=5) as http:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{endpoint.name} exited: {log.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if http.get(path).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{endpoint.name} not ready after {timeout:.0f} s")
            time.sleep(0.3)


@contextlib.contextmanager
def zerolayer_daemon(work: Path, slots: int, threads: int, prefix_pool: bool = False) -> Iterator[Endpoint]:
    """Our daemon serving the demo firmware on a Unix socket only, as its own process, as a client
    would find it; `prefix_pool` False turns the prefix cache off (every prefill runs), True leaves
    it at its default size."""
    from appliance.devsetup import write_dev_config
    from firmware.toolchain.demo import DEMO_NAME, demo_bundle
    from firmware.toolchain.devkit import dev_trusted_keys

    work.mkdir(parents=True, exist_ok=True)
    pool = "" if prefix_pool else "prefix_cache_mb = 0\n"
    extra = (f"[limits]\nmax_active_per_device = {slots}\nmax_queued = 512\n\n"
             f"[engine]\nthreads = {threads}\n{pool}\n[log]\nlevel = \"warning\"\n")  # fmt: skip
    setup = write_dev_config(work / "zerolayer", demo_bundle(), dev_trusted_keys(), tcp="", quic="", extra=extra)
    log = work / "zerolayer.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("zerolayer")), "serve", "--config",
                                 str(setup.root)], stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    endpoint = Endpoint("zerolayer", "http://localhost", str(setup.unix_socket), DEMO_NAME)
    with serving(proc, log, endpoint, "/readyz"):
        yield endpoint


@contextlib.contextmanager
def serving(proc: subprocess.Popen[bytes], log: Path, endpoint: Endpoint, ready_path: str) -> Iterator[None]:
    """A server process we started: ready before the body runs, stopped after it (killed if it hangs)."""
    try:
        wait_ready(proc, log, endpoint, ready_path)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
