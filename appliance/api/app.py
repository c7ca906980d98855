"""The one ASGI app behind every transport. It never touches a socket: transports call it, and
tag each scope with their name (`scope["extensions"]["zerolayer"]["transport"]`)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from appliance.api import anthropic, openai
from appliance.api.auth import ApiKey, KeyStore, presented_key
from appliance.api.errors import ANTHROPIC, OPENAI, ApiError, busy_error
from appliance.api.fields import parse_json_object
from appliance.api.metrics import Metrics
from appliance.asgi import ASGIApp, Message, Receive, Scope, Send
from appliance.engine import (
    Engine,
    EngineBusy,
    EngineError,
    EngineStopped,
    Finished,
    GenerationRequest,
    InvalidRequest,
    Prefilled,
    Stream,
    TextDelta,
)
from appliance.flows import DigestTable, flow_of
from appliance.governor import Governor
from appliance.kernel import FlowKey

log = logging.getLogger(__name__)


NETWORK_TRANSPORTS = ("tcp", "http3")


@dataclass
class ApiSettings:
    """What the app may change live (reload replaces the object)."""

    keys: KeyStore
    auth_required: bool = True
    max_body_bytes: int = 1 << 20


def transport_of(scope: Scope) -> str:
    return str(scope.get("extensions", {}).get("zerolayer", {}).get("transport", "tcp"))


def tag_transport(app: ASGIApp, transport: str) -> ASGIApp:
    """Mark scopes from one listener (Hypercorn serves several listeners with one app)."""

    async def tagged(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            ext = scope.setdefault("extensions", {})
            ext.setdefault("zerolayer", {})["transport"] = transport
        await app(scope, receive, send)

    return tagged


def _dialect(path: str, headers: list[tuple[bytes, bytes]]) -> str:
    if path.startswith("/v1/messages"):
        return ANTHROPIC
    if path.startswith("/v1/chat"):
        return OPENAI
    return ANTHROPIC if any(k == b"anthropic-version" for k, _ in headers) else OPENAI


_ROUTES: dict[str, tuple[str, ...]] = {
    "/v1/messages": ("POST",),
    "/v1/messages/count_tokens": ("POST",),
    "/v1/chat/completions": ("POST",),
    "/v1/models": ("GET",),
    "/healthz": ("GET", "HEAD"),
    "/readyz": ("GET", "HEAD"),
    "/metrics": ("GET",),
    "/status": ("GET",),
}
DEBUG_HEADER = b"zerolayer-debug"


class ApiApp:
    def __init__(self, engine: Engine, settings: ApiSettings, metrics: Metrics | None = None,
                 governor: Governor | None = None, status: Callable[[], dict[str, Any]] | None = None,
                 flows: DigestTable | None = None, allowed: Callable[[str], bool] | None = None) -> None:  # fmt: skip
        """`status` answers /status; `allowed` is the source allowlist where the kernel cannot enforce
        it: checked on TCP before anything is parsed (HTTP/3 datagrams from outside it are dropped
        unread by the QUIC server itself)."""
        self.engine = engine
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.model_name = engine.bundle.name
        self.governor = governor
        self.status = status
        self.flows = flows
        self.allowed = allowed
        self.ready = False  # set once the engine is warm and every listener is bound
        self.created = int(time.time())

    def set_ready(self, ready: bool) -> None:
        """Ready to serve generations (/readyz says so), or not (starting, draining)."""
        self.ready = ready

    def reconfigure(self, settings: ApiSettings) -> None:
        """New keys and limits (a reload); requests in flight keep what they started with."""
        self.settings = settings

    @property
    def active_streams(self) -> int:
        return self.metrics.streams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        headers = list(scope.get("headers", []))
        dialect = _dialect(path, headers)
        api = dialect if path.startswith("/v1/") else "ops"
        transport = transport_of(scope)
        status = 500
        body_done = [method in ("GET", "HEAD")]

        async def tracking_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_done[0] = True
            return message

        try:
            client = scope.get("client")
            if self.allowed is not None and transport == "tcp" and client and not self.allowed(client[0]):
                raise ApiError(403, "source address not allowed")  # before anything of the request is parsed
            status = await self._handle(scope, tracking_receive, send, path, method, headers, dialect, transport)
        except ApiError as err:
            status = err.status
            headers_out = err.headers()
            if not body_done[0] and scope.get("http_version") in ("1.0", "1.1"):
                # Answered before the body was read: the server will not reuse this HTTP/1 connection,
                # so tell the client not to either (it would send its next request into a closing socket).
                headers_out.append((b"connection", b"close"))
            await _respond(send, err.status, err.body(dialect), headers_out)
        except Exception:
            # Never a traceback to a client: log it for the operator, answer a plain 500.
            log.exception("unhandled error on %s %s", method, path)
            internal = ApiError(500, "internal error: the server logged the details")
            await _respond(send, 500, internal.body(dialect), internal.headers())
        finally:
            self.metrics.requests.labels(api, transport, str(status)).inc()

    async def _handle(self, scope: Scope, receive: Receive, send: Send, path: str, method: str,
                      headers: list[tuple[bytes, bytes]], dialect: str, transport: str) -> int:  # fmt: skip
        allowed = _ROUTES.get(path)
        if allowed is None:
            raise ApiError(404, f"no such endpoint: {path}")
        if method not in allowed:
            raise ApiError(405, f"{path} takes {', '.join(allowed)}, not {method}", allow=", ".join(allowed))
        if path == "/healthz":
            return await _json(send, 200, {"status": "alive"})
        if path == "/readyz":
            ok = self.ready and self.engine.alive()
            return await _json(send, 200 if ok else 503, {"status": "ready" if ok else "not ready"})
        if path == "/metrics":
            self._refresh_gauges()
            await _respond(send, 200, self.metrics.render(), [(b"content-type", b"text/plain; version=0.0.4")])
            return 200
        key = self._authorize(transport, headers)
        # The decision trace only for callers who may see it: the local socket, or a debug key.
        may_debug = transport not in NETWORK_TRANSPORTS or (key is not None and key.debug)
        debug = may_debug and any(k == DEBUG_HEADER and v.strip() == b"1" for k, v in headers)
        if path == "/status":
            if not may_debug:
                raise ApiError(403, "status is for the local socket or a debug API key")
            return await _json(send, 200, self.status() if self.status else {})
        if not self.ready:
            raise ApiError(503, "the appliance is starting: firmware, engine or listeners not ready yet",
                           retry_after=1)  # fmt: skip
        if path == "/v1/models":
            return await _json(send, 200, self._models(dialect))
        body = await _read_body(receive, headers, self.settings.max_body_bytes)
        doc = parse_json_object(body)
        if path == "/v1/messages/count_tokens":
            request = anthropic.parse_count_tokens(doc, self.model_name)
            try:
                count = self.engine.count_tokens(request)
            except InvalidRequest as exc:
                raise ApiError(400, str(exc), param=exc.param) from None
            return await _json(send, 200, {"input_tokens": count})
        flow = flow_of(scope, transport) if self.flows is not None else None
        if path == "/v1/messages":
            request, stream = anthropic.parse_request(doc, self.model_name)
            return await self._generate(send, receive, dialect, request, stream, False, debug, flow)
        request, stream, include_usage = openai.parse_request(doc, self.model_name)
        return await self._generate(send, receive, dialect, request, stream, include_usage, debug, flow)

    def _authorize(self, transport: str, headers: list[tuple[bytes, bytes]]) -> ApiKey | None:
        presented = presented_key(headers)
        key = self.settings.keys.check(presented) if presented else None
        if transport not in NETWORK_TRANSPORTS or not self.settings.auth_required:
            return key  # the Unix socket is authorised by its file permissions
        if presented is None:
            raise ApiError(401, "missing API key: send it as x-api-key or Authorization: Bearer")
        if key is None:
            raise ApiError(401, "invalid API key")
        return key

    def _models(self, dialect: str) -> dict[str, Any]:
        name = self.model_name
        if dialect == ANTHROPIC:
            created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created))
            item = {"type": "model", "id": name, "display_name": f"{name} {self.engine.bundle.version}",
                    "created_at": created}  # fmt: skip
            return {"data": [item], "has_more": False, "first_id": name, "last_id": name}
        model: dict[str, Any] = {"id": name, "object": "model", "created": self.created, "owned_by": "zerolayer"}
        return {"object": "list", "data": [model]}

    def _refresh_gauges(self) -> None:
        self.metrics.queue_depth.set(self.engine.queued)

    def _submit(self, dialect: str, request: GenerationRequest) -> Stream:
        device = self.governor.place() if self.governor else self.engine.default_device
        try:
            handle = self.engine.submit(request, device)
        except InvalidRequest as exc:
            raise ApiError(400, str(exc), param=exc.param) from None
        except EngineBusy as exc:
            raise busy_error(dialect, f"{exc}; retry shortly") from None
        except EngineStopped as exc:
            raise ApiError(503, str(exc), retry_after=1) from None
        self.metrics.placed.labels(device).inc()
        if self.governor is not None:
            handle.trace.notes.append(f"Placement: {self.governor.describe()} -> {device}")
        return handle

    async def _generate(self, send: Send, receive: Receive, dialect: str, request: GenerationRequest,
                        stream: bool, include_usage: bool, debug: bool = False,
                        flow: FlowKey | None = None) -> int:  # fmt: skip
        started = time.monotonic()
        if flow is not None and self.flows is not None:
            # What this connection sent last: the engine says how much of it the new prompt shares.
            request = dataclasses.replace(request, prior_digests=self.flows.get(flow))
        handle = self._submit(dialect, request)
        if flow is not None:
            handle.trace.notes.insert(0, f"Flow: {flow.proto_name} {flow}")
        watcher = asyncio.create_task(_cancel_on_disconnect(receive, handle))
        self.metrics.stream_opened()
        try:
            if stream:
                await self._stream(send, dialect, handle, started, include_usage, debug)
            else:
                await self._complete(send, dialect, handle, started, debug)
            return 200
        finally:
            self.metrics.stream_closed()
            watcher.cancel()
            handle.cancel()  # no-op when finished; frees the slot if we leave early
            done, trace = handle.finished, handle.trace
            if flow is not None and self.flows is not None and trace.digests:
                self.flows.put(flow, trace.digests)
            log.info("request %s %s on %s: %s, %d in + %d out tokens, prefill %.0f ms, %.1f ms/token",
                     trace.request_id, dialect, trace.device, done.stop_reason if done else "aborted",
                     handle.input_tokens, done.output_tokens if done else 0, trace.prefill_ms, trace.ms_per_token,
                     extra={"request_id": trace.request_id, "device": trace.device})  # fmt: skip

    def _observe(self, started: float, last: float | None, now: float) -> float:
        if last is None:
            self.metrics.ttft.observe(now - started)
        else:
            self.metrics.inter_token.observe(now - last)
        return now

    def _count(self, done: Finished) -> None:
        self.metrics.tokens.labels("input").inc(done.input_tokens)
        self.metrics.tokens.labels("output").inc(done.output_tokens)

    async def _complete(self, send: Send, dialect: str, handle: Stream, started: float, debug: bool) -> None:
        parts: list[str] = []
        last: float | None = None
        try:
            async for event in handle:
                if isinstance(event, TextDelta):
                    last = self._observe(started, last, time.monotonic())
                    parts.append(event.text)
        except EngineError as exc:
            raise ApiError(503 if isinstance(exc, EngineStopped) else 500, f"generation failed: {exc}") from None
        done = handle.finished
        assert done is not None
        self._count(done)
        text = "".join(parts)
        if dialect == ANTHROPIC:
            doc = anthropic.response(anthropic.new_message_id(), self.model_name, text, done)
        else:
            doc = openai.response(openai.new_completion_id(), self.model_name, text, done)
        extra = [(b"zerolayer-trace", json.dumps(done.trace.lines()).encode())] if debug else []
        await _respond(send, 200, json.dumps(doc, ensure_ascii=False).encode(),
                       [(b"content-type", b"application/json"), *extra])  # fmt: skip

    async def _stream(self, send: Send, dialect: str, handle: Stream, started: float, include_usage: bool,
                      debug: bool) -> None:  # fmt: skip
        encoder: anthropic.StreamEncoder | openai.StreamEncoder
        if dialect == ANTHROPIC:
            encoder = anthropic.StreamEncoder(anthropic.new_message_id(), self.model_name, handle.input_tokens)
        else:
            encoder = openai.StreamEncoder(openai.new_completion_id(), self.model_name, include_usage)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]})  # fmt: skip
        await _chunk(send, encoder.start())
        last: float | None = None
        try:
            async for event in handle:
                if isinstance(event, TextDelta):
                    last = self._observe(started, last, time.monotonic())
                    await _chunk(send, encoder.delta(event.text))
                elif isinstance(event, Prefilled) and debug:  # before the first delta
                    await _chunk(send, encoder.debug(event.trace.lines()[:2] + event.trace.lines()[3:]))
                elif isinstance(event, Finished):
                    self._count(event)
                    if debug:
                        await _chunk(send, encoder.debug(event.trace.lines()[2:3]))
                    if event.stop_reason != "cancelled":
                        await _chunk(send, encoder.finish(event))
        except EngineError as exc:
            # Headers are gone: the failure travels as the dialect's in-stream error.
            log.error("generation %s failed mid-stream: %s", handle.request.request_id, exc)
            await _chunk(send, encoder.error(ApiError(500, f"generation failed: {exc}")))
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _cancel_on_disconnect(receive: Receive, handle: Stream) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            handle.cancel()
            return


async def _read_body(receive: Receive, headers: list[tuple[bytes, bytes]], limit: int) -> bytes:
    for name, value in headers:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise ApiError(413, f"request body of {int(value)} bytes is over the limit of {limit} bytes")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError("client went away")
        body = message.get("body", b"")
        size += len(body)
        if size > limit:
            raise ApiError(413, f"request body is over the limit of {limit} bytes")
        chunks.append(body)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _json(send: Send, status: int, doc: dict[str, Any]) -> int:
    await _respond(send, status, json.dumps(doc, ensure_ascii=False).encode(), [(b"content-type", b"application/json")])
    return status


async def _chunk(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
