"""The request paths the benchmark compares, as a client sees them: each one request at a time on
its own connection(s), so a worker per concurrent client owns one instance.

Every path sends the same streaming Anthropic Messages request (the engine path: the same
GenerationRequest) and times the first text delta (TTFT) and the end of the stream (TTLT) from
the moment the client starts, connection set-up included.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass
from typing import Any, Protocol

import httpx2 as httpx  # the official anthropic and openai clients' HTTP library

from bench.protocol.h3 import FIRST_TOKEN, H3Client, client_configuration, open_connection

PROMPT = "What is the capital of France?"

# name -> what it is, in the report's words; the order is the report's.
PATHS: dict[str, str] = {
    "layered-new": "layered: nginx TLS gateway -> layer service (Redis) -> 302 -> model, new connections per request",
    "layered-reuse": "layered, connections reused (gateway and model)",
    "tcp-new": "Zerolayer HTTPS/TCP (HTTP/1.1), new connection per request",
    "tcp-reuse": "Zerolayer HTTPS/TCP (HTTP/1.1), connection reused",
    "h3-cold": "Zerolayer HTTP/3, cold: full handshake per request",
    "h3-resumed": "Zerolayer HTTP/3, resumed with a session ticket (1-RTT)",
    "h3-0rtt": "Zerolayer HTTP/3, 0-RTT: a GET in early data, the POST after (held to the handshake)",
    "h3-warm": "Zerolayer HTTP/3, warm connection",
    "h3-0rtt-get": "Zerolayer HTTP/3, 0-RTT: only a GET /v1/models in early data (a small answer)",
    "unix": "Zerolayer over the Unix socket (HTTP/1.1), connection reused",
    "engine": "the engine alone, in process (the floor)",
}


@dataclass(frozen=True)
class Target:
    """Where the servers are, as the client sees them."""

    host: str
    tcp_port: int
    quic_port: int
    gateway_port: int
    unix_socket: str
    ca_file: str
    api_key: str
    model: str
    bundle: str  # for the in-process engine


@dataclass
class Sample:
    ttft: float  # seconds from the start of the request to the first text delta
    ttlt: float  # to the end of the stream
    sent_wall: float  # time.time() when the model request was handed to the transport
    extra: float = 0.0  # h3-0rtt: the early-data GET's time to its whole answer
    start_wall: float = 0.0  # time.time() at the start (set by the runner, for the captures)


class Path(Protocol):
    async def open(self) -> None: ...

    async def request(self, max_tokens: int) -> Sample: ...

    async def close(self) -> None: ...


def body(target: Target, max_tokens: int) -> bytes:
    return json.dumps({"model": target.model, "max_tokens": max_tokens, "stream": True,
                       "messages": [{"role": "user", "content": PROMPT}]}).encode()  # fmt: skip


class HttpsPath:
    """HTTPS over TCP with httpx2, straight to the model server or through the layered gateway.

    New connections: one client whose pool keeps nothing (an SDK without pooling; its TLS
    context, like an SDK's, is made once). The layered flow: POST /v1/layer/negotiate to the
    gateway, which answers 302 with the model endpoint; the client posts the request there."""

    def __init__(self, target: Target, *, reuse: bool, layered: bool, tls: ssl.SSLContext) -> None:
        self.target, self.reuse, self.layered, self.tls = target, reuse, layered, tls
        self.client: httpx.AsyncClient | None = None
        self.headers = {"x-api-key": target.api_key, "content-type": "application/json"}

    async def open(self) -> None:
        limits = httpx.Limits(max_connections=4, max_keepalive_connections=4 if self.reuse else 0)
        self.client = httpx.AsyncClient(verify=self.tls, limits=limits, timeout=120)

    async def request(self, max_tokens: int) -> Sample:
        assert self.client is not None
        t = self.target
        data = body(t, max_tokens)
        started = time.perf_counter()
        url = f"https://{_host(t.host)}:{t.tcp_port}/v1/messages"
        if self.layered:
            negotiate = f"https://{_host(t.host)}:{t.gateway_port}/v1/layer/negotiate"
            r = await self.client.post(negotiate, content=json.dumps({"model": t.model}).encode(), headers=self.headers)
            if r.status_code != 302:
                raise RuntimeError(f"negotiate answered {r.status_code}: {r.text[:200]}")
            url = r.headers["location"]
        return await _stream(self.client, url, data, self.headers, started)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()


class UnixPath:
    def __init__(self, target: Target) -> None:
        self.target = target
        self.client: httpx.AsyncClient | None = None

    async def open(self) -> None:
        transport = httpx.AsyncHTTPTransport(uds=self.target.unix_socket)
        self.client = httpx.AsyncClient(transport=transport, timeout=120)

    async def request(self, max_tokens: int) -> Sample:
        assert self.client is not None
        started = time.perf_counter()
        return await _stream(self.client, "http://localhost/v1/messages", body(self.target, max_tokens),
                             {"content-type": "application/json"}, started)  # fmt: skip

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()


async def _stream(client: httpx.AsyncClient, url: str, data: bytes, headers: dict[str, str],
                  started: float) -> Sample:  # fmt: skip
    sent = [0.0]

    async def trace(name: str, info: dict[str, Any]) -> None:
        if name.endswith("send_request_headers.started"):
            sent[0] = time.time()

    first = 0.0
    async with client.stream("POST", url, content=data, headers=headers, extensions={"trace": trace}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url} answered {r.status_code}: {(await r.aread())[:200]!r}")
        async for chunk in r.aiter_raw():
            if not first and FIRST_TOKEN in chunk:
                first = time.perf_counter()
    end = time.perf_counter()
    if not first:
        raise RuntimeError(f"{url}: the stream ended without a text delta")
    return Sample(first - started, end - started, sent[0])


class Http3Path:
    """kind: cold (full handshake per request), resumed (a ticket, 1-RTT), 0rtt (a ticket and early
    data: GET /v1/models in early data, then the POST, which the server holds to the handshake),
    0rtt-get (only the GET in early data: the small answer), warm (one connection kept)."""

    def __init__(self, target: Target, kind: str, ca_pem: bytes) -> None:
        self.target, self.kind, self.ca_pem = target, kind, ca_pem
        self.conn: H3Client | None = None
        self.ticket: Any = None
        self.headers = [(b"x-api-key", target.api_key.encode()), (b"content-type", b"application/json")]
        self.early_rejected = 0  # 0-RTT attempts whose early data the server refused
        self.full_handshakes = 0  # resumed/0-RTT attempts that fell back to a full handshake

    @property
    def authority(self) -> str:
        return f"{_host(self.target.host)}:{self.target.quic_port}"

    async def _connect(self, ticket: Any, wait: bool) -> H3Client:
        # The dev certificate names localhost and the benchmark's addresses; SNI is the name.
        config = client_configuration(self.ca_pem, "localhost", ticket)
        return await open_connection(self.target.host, self.target.quic_port, config, wait_connected=wait)

    async def open(self) -> None:
        if self.kind == "warm":
            self.conn = await self._connect(None, True)
        elif self.kind in ("resumed", "0rtt", "0rtt-get"):
            conn = await self._connect(None, True)
            await self._post(conn, 1, time.perf_counter())
            self.ticket = await _ticket(conn)
            conn.close_now()

    async def _post(self, conn: H3Client, max_tokens: int, started: float) -> Sample:
        payload = body(self.target, max_tokens)
        ex = await conn.reply(conn.start("POST", "/v1/messages", payload,
                                         [*self.headers, (b"content-length", str(len(payload)).encode())],
                                         authority=self.authority, started=started))  # fmt: skip
        if ex.status != 200 or not ex.first_token:
            raise RuntimeError(f"HTTP/3 POST answered {ex.status}: {bytes(ex.body[:200])!r}")
        return Sample(ex.first_token - started, ex.done - started, ex.sent_wall)

    async def request(self, max_tokens: int) -> Sample:
        started = time.perf_counter()
        if self.kind == "warm":
            assert self.conn is not None
            return await self._post(self.conn, max_tokens, started)
        early = self.kind.startswith("0rtt")
        conn = await self._connect(self.ticket if self.kind != "cold" else None, wait=not early)
        try:
            get = None
            if early:
                get = conn.start("GET", "/v1/models", b"", self.headers[:1], authority=self.authority, started=started)
            if self.kind == "0rtt-get":
                assert get is not None
                await conn.reply(get)
                if get.status != 200:
                    raise RuntimeError(f"HTTP/3 GET answered {get.status}")
                sample = Sample(get.done - started, get.done - started, get.sent_wall)
            else:
                sample = await self._post(conn, max_tokens, started)
            if get is not None and self.kind == "0rtt":
                await conn.reply(get)
                sample.extra = get.done - started
            if self.kind != "cold":
                hs = conn.handshake
                if hs is None or not hs.session_resumed:
                    self.full_handshakes += 1
                elif early and not hs.early_data_accepted:
                    self.early_rejected += 1
                self.ticket = await _ticket(conn)
            return sample
        finally:
            conn.close_now()

    async def close(self) -> None:
        if self.conn is not None:
            self.conn.close_now()


async def _ticket(conn: H3Client, timeout: float = 2.0) -> Any:
    """The newest session ticket the server issued on this connection (tickets are single use)."""
    deadline = time.monotonic() + timeout
    while not conn.tickets:
        if time.monotonic() > deadline:
            raise RuntimeError("the server issued no session ticket")
        await asyncio.sleep(0.001)
    return conn.tickets[-1]


class EnginePath:
    """The engine in this process: submit to the first text delta and to Finished."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def open(self) -> None:
        pass

    async def request(self, max_tokens: int) -> Sample:
        from appliance.engine import GenerationRequest, Message, TextDelta

        started = time.perf_counter()
        first = 0.0
        stream = self.engine.submit(GenerationRequest(messages=(Message("user", PROMPT),), max_tokens=max_tokens))
        async for event in stream:
            if not first and isinstance(event, TextDelta):
                first = time.perf_counter()
        return Sample(first - started, time.perf_counter() - started, 0.0)

    async def close(self) -> None:
        pass


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
