"""The one ASGI app behind every transport. It never touches a socket: transports call it, and
tag each scope with their name (`scope["extensions"]["zerolayer"]["transport"]`)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from appliance.api import anthropic, ollama
from appliance.api.anthropic import ANTHROPIC
from appliance.api.auth import ApiKey, KeyStore, presented_key
from appliance.api.completions import COMPLETIONS
from appliance.api.conversation_store import DEFAULT_PAGE, MAX_PAGE, ConversationStore, metadata_of
from appliance.api.dialect import Call, Dialect, ModelInfo, StreamEncoder
from appliance.api.errors import ApiError, not_served
from appliance.api.fields import get_str, parse_json_object, reject_unknown
from appliance.api.metrics import Metrics
from appliance.api.ollama import OLLAMA_CHAT, OLLAMA_GENERATE, served_name
from appliance.api.openai import OPENAI
from appliance.api.response_store import ResponseStore
from appliance.api.responses import RESPONSES, ResponsesCall, check_items, conversation_id
from appliance.api.responses import parse_request as parse_responses_request
from appliance.api.tokenize import detokenized, parse_detokenize, parse_tokenize, served_model, tokenized
from appliance.api.tools import Answer, CallOut
from appliance.asgi import ASGIApp, ASGIMessage, Receive, Scope, Send
from appliance.engine import (
    ContextOverflow,
    EngineBusy,
    EngineError,
    EngineStopped,
    Finished,
    GenerationRequest,
    InvalidRequest,
    Prefilled,
    Prompt,
    Stream,
    TextDelta,
)
from appliance.engine.request import Event, PromptLogprobs, ThoughtDelta, TokenLogprob
from appliance.engine.tools import CallArguments, CallStart
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
    metrics_require_auth: bool = True  # on the network listeners; the Unix socket is always open


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


class GenerationService(Protocol):
    """What the app needs of the engine, and nothing more."""

    model_name: str
    model_version: str
    default_device: str

    def prepare(self, request: GenerationRequest) -> Prompt: ...

    def submit(self, request: GenerationRequest, device: str | None = None, prompt: Prompt | None = None) -> Stream:
        ...

    def count_tokens(self, request: GenerationRequest) -> int: ...

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def tokenizer_info(self) -> dict[str, object]: ...

    @property
    def thinks(self) -> bool: ...

    @property
    def context_length(self) -> int: ...

    @property
    def devices(self) -> tuple[str, ...]: ...

    def alive(self) -> bool: ...

    @property
    def queued(self) -> int: ...


class ModelRoster(Protocol):
    """The models served, by the name clients ask for (appliance/served.py)."""

    def names(self) -> list[str]: ...

    def engine(self, name: str) -> GenerationService | None: ...

    def alive(self) -> bool: ...

    @property
    def queued(self) -> int: ...


def dialect_of(path: str, headers: list[tuple[bytes, bytes]]) -> Dialect:
    """The API a request speaks: by its path, else by an Anthropic client's version header."""
    if path.startswith("/v1/messages"):
        return ANTHROPIC
    if path.startswith("/v1/chat"):
        return OPENAI
    if path == "/v1/completions":
        return COMPLETIONS
    if path == "/v1/responses":
        return RESPONSES
    if path.startswith("/api/"):
        return OLLAMA_GENERATE if path == "/api/generate" else OLLAMA_CHAT
    return ANTHROPIC if any(k == b"anthropic-version" for k, _ in headers) else OPENAI


@dataclass(frozen=True)
class Route:
    methods: tuple[str, ...]
    handler: str  # the ApiApp method that serves it


ROUTES: dict[str, Route] = {
    "/v1/messages": Route(("POST",), "_generate"),
    "/v1/messages/count_tokens": Route(("POST",), "_count_tokens"),
    "/v1/chat/completions": Route(("POST",), "_generate"),
    "/v1/completions": Route(("POST",), "_generate"),
    "/v1/responses": Route(("POST",), "_generate"),
    "/v1/responses/{id}": Route(("GET", "POST", "DELETE"), "_stored_response"),  # and .../cancel, .../input_items
    "/v1/conversations": Route(("POST",), "_new_conversation"),
    "/v1/conversations/{id}": Route(("GET", "POST", "DELETE"), "_conversation"),  # and .../items[/{item_id}]
    "/tokenize": Route(("POST",), "_tokenize"),  # vLLM's and llama.cpp's tokenizer endpoints (tokenize.py)
    "/detokenize": Route(("POST",), "_detokenize"),
    "/tokenizer_info": Route(("GET",), "_tokenizer_info"),
    "/api/chat": Route(("POST",), "_generate"),  # Ollama's API (ollama.py)
    "/api/generate": Route(("POST",), "_generate"),
    "/api/tags": Route(("GET",), "_models"),
    "/api/show": Route(("POST",), "_ollama_show"),
    "/api/ps": Route(("GET",), "_ollama_running"),
    "/api/version": Route(("GET",), "_ollama_version"),
    "/v1/models": Route(("GET",), "_models"),
    "/v1/models/{id}": Route(("GET",), "_model"),
    "/healthz": Route(("GET", "HEAD"), "_healthz"),
    "/": Route(("GET", "HEAD"), "_root"),  # Ollama's CLI and libraries check that a server answers here
    "/readyz": Route(("GET", "HEAD"), "_readyz"),
    "/health": Route(("GET", "HEAD"), "_readyz"),  # llama.cpp's and vLLM's name: health checks written for them
    "/metrics": Route(("GET",), "_metrics"),
    "/status": Route(("GET",), "_status"),
}
MODEL_PATH = "/v1/models/"
RESPONSE_PATH = "/v1/responses/"
CONVERSATION_PATH = "/v1/conversations/"


def route_of(path: str) -> Route | None:
    for prefix in (MODEL_PATH, RESPONSE_PATH, CONVERSATION_PATH):
        if path.startswith(prefix) and len(path) > len(prefix):
            return ROUTES[prefix + "{id}"]
    return ROUTES.get(path)


DEBUG_HEADER = b"zerolayer-debug"
CLIENT_CLOSED = 499  # the metrics' code for a request whose client went away (as nginx counts it)


class ClientGone(Exception):
    """Sending failed because the client is gone: the request ends quietly, counted as 499."""


@dataclass
class Exchange:
    """One request as the handlers see it."""

    scope: Scope
    receive: Receive
    send: Send
    path: str
    headers: list[tuple[bytes, bytes]]
    dialect: Dialect
    transport: str


class ApiApp:
    def __init__(self, models: ModelRoster, settings: ApiSettings, metrics: Metrics | None = None,
                 governor: Governor | None = None, status: Callable[[], dict[str, Any]] | None = None,
                 flows: DigestTable | None = None, allowed: Callable[[str], bool] | None = None) -> None:  # fmt: skip
        """`status` answers /status; `allowed` is the source allowlist where the kernel cannot enforce
        it: checked on TCP before anything is parsed (HTTP/3 datagrams from outside it are dropped
        unread by the QUIC server itself)."""
        self.models = models
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.governor = governor
        self.status = status
        self.flows = flows
        self.allowed = allowed
        self.ready = False  # set once the engine is warm and every listener is bound
        self.created = int(time.time())
        self.responses = ResponseStore()  # the Responses API's stored responses
        self.conversations = ConversationStore()  # the Conversations API's

    def set_ready(self, ready: bool) -> None:
        """Ready to serve generations (/readyz says so), or not (starting, draining)."""
        self.ready = ready

    def reconfigure(self, settings: ApiSettings) -> None:
        """New keys and limits (a reload); requests in flight keep what they started with."""
        self.settings = settings

    @property
    def active_streams(self) -> int:
        return self.metrics.streams

    def refusal(self, scope: Scope, status: int, message: str) -> bytes:
        """The error body for a request a transport refuses before the app sees it, in its dialect."""
        return dialect_of(scope["path"], list(scope.get("headers", []))).error_body(ApiError(status, message))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        headers = list(scope.get("headers", []))
        dialect = dialect_of(path, headers)
        api = dialect.name if path.startswith("/v1/") else "ops"
        transport = transport_of(scope)
        status = 500
        body_done = [method in ("GET", "HEAD")]

        async def tracking_receive() -> ASGIMessage:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_done[0] = True
            return message

        async def guarded_send(message: ASGIMessage) -> None:
            try:
                await send(message)
            except OSError as exc:  # the transport says the client is gone (a reset stream, a closed socket)
                raise ClientGone(str(exc)) from None

        ex = Exchange(scope, tracking_receive, guarded_send, path, headers, dialect, transport)
        try:
            client = scope.get("client")
            if self.allowed is not None and transport == "tcp" and client and not self.allowed(client[0]):
                raise ApiError(403, "source address not allowed")  # before anything of the request is parsed
            route = route_of(path)
            if route is None:
                raise ApiError(404, f"no such endpoint: {path}")
            if method not in route.methods:
                raise ApiError(405, f"{path} takes {', '.join(route.methods)}, not {method}",
                               allow=", ".join(route.methods))  # fmt: skip
            status = await getattr(self, route.handler)(ex)
        except ClientGone as gone:
            # The client left: neither a server error nor a success; nginx's 499, logged for debugging only.
            status = CLIENT_CLOSED
            log.debug("client went away during %s %s: %s", method, path, gone)
        except ApiError as err:
            status = err.status
            headers_out = err.headers()
            if not body_done[0] and scope.get("http_version") in ("1.0", "1.1"):
                # Answered before the body was read: the server will not reuse this HTTP/1 connection,
                # so tell the client not to either (it would send its next request into a closing socket).
                headers_out.append((b"connection", b"close"))
            await _respond_quietly(guarded_send, err.status, dialect.error_body(err), headers_out)
        except Exception:
            # Never a traceback to a client: log it for the operator, answer a plain 500.
            log.exception("unhandled error on %s %s", method, path)
            internal = ApiError(500, "internal error: the server logged the details")
            await _respond_quietly(guarded_send, 500, dialect.error_body(internal), internal.headers())
        finally:
            self.metrics.requests.labels(api, transport, str(status)).inc()

    # --- ops endpoints -------------------------------------------------------------------------

    async def _healthz(self, ex: Exchange) -> int:
        return await _json(ex.send, 200, {"status": "alive"})

    async def _root(self, ex: Exchange) -> int:
        await _respond(ex.send, 200, b"Zerolayer is running", [(b"content-type", b"text/plain; charset=utf-8")])
        return 200

    async def _readyz(self, ex: Exchange) -> int:
        ok = self.ready and self.models.alive()
        return await _json(ex.send, 200 if ok else 503, {"status": "ready" if ok else "not ready"})

    async def _metrics(self, ex: Exchange) -> int:
        if self.settings.metrics_require_auth:
            self._authorize(ex)
        self.metrics.queue_depth.set(self.models.queued)
        await _respond(ex.send, 200, self.metrics.render(), [(b"content-type", b"text/plain; version=0.0.4")])
        return 200

    async def _status(self, ex: Exchange) -> int:
        key = self._authorize(ex)
        if not self._may_debug(ex, key):
            raise ApiError(403, "status is for the local socket or a debug API key")
        return await _json(ex.send, 200, self.status() if self.status else {})

    # --- the API -------------------------------------------------------------------------------

    def _authorize(self, ex: Exchange) -> ApiKey | None:
        presented = presented_key(ex.headers)
        key = self.settings.keys.check(presented) if presented else None
        if ex.transport not in NETWORK_TRANSPORTS or not self.settings.auth_required:
            return key  # the Unix socket is authorised by its file permissions
        if presented is None:
            raise ApiError(401, "missing API key: send it as x-api-key or Authorization: Bearer")
        if key is None:
            raise ApiError(401, "invalid API key")
        return key

    @staticmethod
    def _may_debug(ex: Exchange, key: ApiKey | None) -> bool:
        """The decision trace only for callers who may see it: the local socket, or a debug key."""
        return ex.transport not in NETWORK_TRANSPORTS or (key is not None and key.debug)

    def _admit(self, ex: Exchange) -> ApiKey | None:
        key = self._authorize(ex)
        if not self.ready:
            raise ApiError(503, "the appliance is starting: firmware, engine or listeners not ready yet",
                           retry_after=1)  # fmt: skip
        return key

    def _info(self, name: str) -> ModelInfo | None:
        engine = self.models.engine(name)
        return ModelInfo(name, engine.model_version, self.created) if engine is not None else None

    async def _models(self, ex: Exchange) -> int:
        self._admit(ex)
        infos = [info for info in map(self._info, self.models.names()) if info is not None]
        return await _json(ex.send, 200, ex.dialect.models(infos))

    async def _ollama_show(self, ex: Exchange) -> int:
        self._admit(ex)
        doc = parse_json_object(await _read_body(ex.receive, ex.headers, self.settings.max_body_bytes))
        reject_unknown(doc, {"model", "name", "verbose"}, {})
        name = served_name({"model": doc.get("model", doc.get("name"))}, self.models.names())
        engine, info = self._engine(name), self._info(name)
        assert info is not None
        template = str(engine.tokenizer_info().get("chat_template") or "")
        capabilities = ["completion", "tools", *(["thinking"] if engine.thinks else [])]
        return await _json(ex.send, 200, ollama.show(info, template, engine.context_length, capabilities))

    async def _ollama_running(self, ex: Exchange) -> int:
        self._admit(ex)
        infos = [info for info in map(self._info, self.models.names()) if info is not None]
        contexts = {info.name: self._engine(info.name).context_length for info in infos}
        return await _json(ex.send, 200, ollama.running(infos, contexts))

    async def _ollama_version(self, ex: Exchange) -> int:
        self._admit(ex)
        return await _json(ex.send, 200, ollama.version())

    async def _model(self, ex: Exchange) -> int:
        self._admit(ex)
        name = ex.path[len(MODEL_PATH) :]
        info = self._info(name)
        if info is None:
            raise ApiError(404, not_served(name, self.models.names()))
        return await _json(ex.send, 200, ex.dialect.model(info))

    async def _stored_response(self, ex: Exchange) -> int:
        """GET a stored response or its input items, DELETE it; background responses (cancel) do not exist here."""
        owner = _owner(self._admit(ex))
        response_id, _, rest = ex.path[len(RESPONSE_PATH) :].partition("/")
        method = ex.scope["method"]
        if (method, rest) not in (("GET", ""), ("GET", "input_items"), ("DELETE", "")):
            raise ApiError(404, f"{method} {ex.path}: not served here (background responses, and so their cancel, "
                           "are not supported)", param="response_id")  # fmt: skip
        kept = self.responses.get(response_id, owner)
        if kept is None:
            raise ApiError(404, f"no stored response {response_id!r}: responses are kept (up to "
                           f"{self.responses.max_responses}, least recently used dropped first) unless a request "
                           "sets store: false", param="response_id")  # fmt: skip
        if method == "DELETE":
            self.responses.delete(response_id, owner)
            return await _json(ex.send, 200, {"id": response_id, "object": "response", "deleted": True})
        if rest == "input_items":
            items = kept.input_items
            ends = {"first_id": _item_id(items[0]), "last_id": _item_id(items[-1])}
            return await _json(ex.send, 200, {"object": "list", "data": items, "has_more": False, **ends})
        return await _json(ex.send, 200, kept.response)

    async def _new_conversation(self, ex: Exchange) -> int:
        owner = _owner(self._admit(ex))
        doc = parse_json_object(await _read_body(ex.receive, ex.headers, self.settings.max_body_bytes))
        reject_unknown(doc, {"items", "metadata", "safety_identifier"}, {})
        items = check_items(doc.get("items") or [])
        conversation = self.conversations.create(items, metadata_of(doc.get("metadata")), owner, int(time.time()))
        return await _json(ex.send, 200, conversation.as_object())

    async def _conversation(self, ex: Exchange) -> int:
        """A conversation: GET, POST (its metadata), DELETE; its items: GET (a page), POST (more of
        them); one item: GET, DELETE."""
        owner = _owner(self._admit(ex))
        conversation_id, _, rest = ex.path[len(CONVERSATION_PATH) :].partition("/")
        method, store = ex.scope["method"], self.conversations
        if (method, rest) == ("GET", ""):
            return await _json(ex.send, 200, store.get(conversation_id, owner).as_object())
        if (method, rest) == ("POST", ""):
            doc = parse_json_object(await _read_body(ex.receive, ex.headers, self.settings.max_body_bytes))
            reject_unknown(doc, {"metadata"}, {})
            conversation = store.get(conversation_id, owner)
            conversation.metadata = metadata_of(doc.get("metadata"))
            return await _json(ex.send, 200, conversation.as_object())
        if (method, rest) == ("DELETE", ""):
            store.delete(conversation_id, owner)
            return await _json(ex.send, 200, {"id": conversation_id, "object": "conversation.deleted", "deleted": True})
        if (method, rest) == ("GET", "items"):
            query = urllib.parse.parse_qs(ex.scope.get("query_string", b"").decode("latin-1"))
            after, limit, order = (query.get(k, [None])[-1] for k in ("after", "limit", "order"))
            if limit is not None and not (limit.isdigit() and 1 <= int(limit) <= MAX_PAGE):
                raise ApiError(400, f"limit: must be an integer from 1 to {MAX_PAGE}", param="limit")
            if order not in (None, "asc", "desc"):
                raise ApiError(400, "order: must be 'asc' or 'desc'", param="order")
            page = store.page(conversation_id, owner, after, int(limit) if limit else DEFAULT_PAGE, order or "desc")
            return await _json(ex.send, 200, page)
        if (method, rest) == ("POST", "items"):
            doc = parse_json_object(await _read_body(ex.receive, ex.headers, self.settings.max_body_bytes))
            reject_unknown(doc, {"items"}, {})
            added = store.add(conversation_id, check_items(doc.get("items")), owner)
            return await _json(ex.send, 200, {"object": "list", "data": added, "has_more": False,
                                              "first_id": _item_id(added[0]) if added else None,
                                              "last_id": _item_id(added[-1]) if added else None})  # fmt: skip
        item_id = rest.removeprefix("items/")
        if item_id != rest and item_id and method == "GET":
            return await _json(ex.send, 200, store.item(conversation_id, item_id, owner))
        if item_id != rest and item_id and method == "DELETE":
            return await _json(ex.send, 200, store.delete_item(conversation_id, item_id, owner).as_object())
        raise ApiError(404, f"{method} {ex.path}: not served here", param="conversation_id")

    def _engine(self, name: str) -> GenerationService:
        """The engine of a model the dialect's parse found served (gone since only if a reload retired it)."""
        engine = self.models.engine(name)
        if engine is None:
            raise ApiError(404, not_served(name, self.models.names()), param="model")
        return engine

    async def _count_tokens(self, ex: Exchange) -> int:
        self._admit(ex)
        doc = parse_json_object(await _read_body(ex.receive, ex.headers, self.settings.max_body_bytes))
        model, request = anthropic.parse_count_tokens(doc, self.models.names())
        engine = self._engine(model)
        try:
            count = await asyncio.to_thread(engine.count_tokens, request)  # templating and tokenizing
        except InvalidRequest as exc:
            raise ApiError(400, str(exc), param=exc.param) from None
        return await _json(ex.send, 200, {"input_tokens": count})

    async def _tokenize(self, ex: Exchange) -> int:
        self._admit(ex)
        ask = parse_tokenize(parse_json_object(await _read_body(ex.receive, ex.headers, self.settings.max_body_bytes)),
                             self.models.names())  # fmt: skip
        engine = self._engine(ask.model)
        tokens = await asyncio.to_thread(engine.tokenize, ask.text, ask.add_special_tokens)
        return await _json(ex.send, 200, tokenized(tokens, engine.context_length))

    async def _detokenize(self, ex: Exchange) -> int:
        self._admit(ex)
        doc = parse_json_object(await _read_body(ex.receive, ex.headers, self.settings.max_body_bytes))
        model, tokens = parse_detokenize(doc, self.models.names())
        try:
            text = await asyncio.to_thread(self._engine(model).detokenize, tokens)
        except InvalidRequest as exc:
            raise ApiError(400, str(exc), param=exc.param) from None
        return await _json(ex.send, 200, detokenized(text))

    async def _tokenizer_info(self, ex: Exchange) -> int:
        self._admit(ex)
        return await _json(ex.send, 200, self._engine(served_model({}, self.models.names())).tokenizer_info())

    async def _generate(self, ex: Exchange) -> int:
        key = self._admit(ex)
        debug = self._may_debug(ex, key) and any(k == DEBUG_HEADER and v.strip() == b"1" for k, v in ex.headers)
        doc = parse_json_object(await _read_body(ex.receive, ex.headers, self.settings.max_body_bytes))
        if isinstance(ex.dialect, ollama.OllamaDialect):
            loaded = ollama.preload(doc, self.models.names(), ex.dialect.chat)
            if loaded is not None:
                return await _json(ex.send, 200, loaded)
        previous = get_str(doc, "previous_response_id") if ex.dialect is RESPONSES else None
        conversation = conversation_id(doc) if ex.dialect is RESPONSES else None
        if previous is not None:
            history = self.responses.conversation(previous, _owner(key))
            call: Call = parse_responses_request(doc, self.models.names(), history)
        elif conversation is not None:
            history = list(self.conversations.get(conversation, _owner(key)).items)
            call = parse_responses_request(doc, self.models.names(), history)
        else:
            call = ex.dialect.parse(doc, self.models.names())
        flow = flow_of(ex.scope, ex.transport) if self.flows is not None else None
        return await self._run(ex, call, debug, flow, _owner(key))

    async def _submit(self, dialect: Dialect, model: str, request: GenerationRequest) -> Stream:
        engine = self._engine(model)
        try:
            # Rendering and tokenizing a long conversation is CPU work: never on the event loop.
            if request.prepares_quickly():
                prompt = engine.prepare(request)
            else:
                prompt = await asyncio.to_thread(engine.prepare, request)
        except ContextOverflow as exc:
            raise dialect.overflow(exc) from None
        except InvalidRequest as exc:
            raise ApiError(400, str(exc), param=exc.param) from None
        device = self.governor.place() if self.governor else engine.default_device
        if device not in engine.devices:  # a bundle built for the CPU only, while the governor places on a GPU
            device = engine.default_device
        try:
            handle = engine.submit(request, device, prompt)
        except InvalidRequest as exc:
            raise ApiError(400, str(exc), param=exc.param) from None
        except EngineBusy as exc:
            raise ApiError(dialect.busy_status, f"{exc}; retry shortly", retry_after=1) from None
        except EngineStopped as exc:
            raise ApiError(503, str(exc), retry_after=1) from None
        self.metrics.placed.labels(device).inc()
        if self.governor is not None:
            handle.trace.notes.append(f"Placement: {self.governor.describe()} -> {device}")
        return handle

    async def _run(self, ex: Exchange, call: Call, debug: bool, flow: FlowKey | None, owner: str | None) -> int:
        started = time.monotonic()
        request = call.request
        if flow is not None and self.flows is not None:
            # What this connection sent last: the engine says how much of it the new prompt shares.
            request = dataclasses.replace(request, prior_digests=self.flows.get(flow))
        choices = _Choices(call.n, len(call.requests))
        try:  # each prompt's first choice (the others join once it is prefilled)
            for prompt, each in enumerate((request, *call.more_prompts)):
                choices.add(prompt * call.n, await self._submit(ex.dialect, call.model, each))
        except BaseException:
            choices.cancel()
            raise
        first = choices.streams[0]
        if call.echo:  # each prompt as the model read it (a prompt of token ids, decoded)
            texts = tuple(choices.streams[prompt * call.n].prompt.text for prompt in range(len(call.requests)))
            call = dataclasses.replace(call, echo_texts=texts)
        if flow is not None:
            first.trace.notes.insert(0, f"Flow: {flow.proto_name} {flow}")
        self.metrics.stream_opened()
        model = call.model
        sink: Sink = (StreamSink(ex.send, ex.dialect.stream(model, first.input_tokens, call), call.choices, debug)
                      if call.stream else WholeSink(ex.send, ex.dialect, model, call, debug))  # fmt: skip
        gone = asyncio.Event()  # the client disconnected before its answer was complete
        watcher = asyncio.create_task(_cancel_on_disconnect(ex.receive, choices, gone, sink))
        try:
            await self._pump(ex.dialect, call, choices, sink, started)
            cancelled = any(h.finished is not None and h.finished.stop_reason == "cancelled"
                            for h in choices.streams.values())  # fmt: skip
            if cancelled or gone.is_set():
                return CLIENT_CLOSED  # the client hung up before the end
            if isinstance(call, ResponsesCall) and call.store and sink.result is not None:
                self.responses.put(sink.result, call.previous, call.input_items, owner)
            if isinstance(call, ResponsesCall) and call.conversation is not None and sink.result is not None:
                self._add_turn(call.conversation, call.input_items + list(sink.result.get("output") or []), owner)
            return 200
        finally:
            self.metrics.stream_closed()
            watcher.cancel()
            choices.cancel()  # no-op for those finished; frees the slots if we leave early
            if flow is not None and self.flows is not None and first.trace.digests:
                self.flows.put(flow, first.trace.digests)
            for handle in choices.streams.values():
                done, trace = handle.finished, handle.trace
                log.info("request %s %s on %s: %s, %d in + %d out tokens, prefill %.0f ms, %.1f ms/token",
                         trace.request_id, ex.dialect.name, trace.device, done.stop_reason if done else "aborted",
                         handle.input_tokens, done.output_tokens if done else 0, trace.prefill_ms, trace.ms_per_token,
                         extra={"request_id": trace.request_id, "device": trace.device})  # fmt: skip

    async def _pump(self, dialect: Dialect, call: Call, choices: _Choices, sink: Sink, started: float) -> None:
        """The one loop from engine events to a sink: a whole response or a stream, of one choice
        or several. A prompt's other choices are submitted once its first one is prefilled: its
        blocks are in the prefix pool then, so they prefill only what it does not hold. The
        headers wait until every choice is queued (a full queue is still an answer's status);
        what comes meanwhile is held."""
        n = call.n
        pending = set(range(len(call.requests))) if n > 1 else set()  # prompts whose other choices are to come
        held: list[tuple[int, Event]] = []
        last: dict[int, float] = {}
        calls: dict[int, list[CallOut]] = {}

        async def deliver(index: int, event: Event) -> None:
            if isinstance(event, ThoughtDelta):
                await sink.thought(index, event.text)
            elif isinstance(event, TextDelta):
                await sink.delta(index, event.text)
            elif isinstance(event, CallStart):
                call_out = dialect.new_call(event.name)
                calls.setdefault(index, []).append(call_out)
                await sink.call_start(index, call_out)
            elif isinstance(event, CallArguments):
                call_out = calls[index][event.index]
                call_out.arguments += event.json
                await sink.call_arguments(index, call_out, event.json)
            elif isinstance(event, TokenLogprob):
                await sink.logprob(index, event)
            elif isinstance(event, PromptLogprobs):
                await sink.prompt_logprobs(index, event)
            elif isinstance(event, Prefilled) and index == 0:  # before the first delta
                await sink.prefilled(event.trace.lines())
            elif isinstance(event, Finished):
                if index % n == 0:
                    self.metrics.tokens.labels("input").inc(event.input_tokens)
                self.metrics.tokens.labels("output").inc(event.output_tokens)
                await sink.finished(index, event)

        try:
            async for index, event in choices:
                if isinstance(event, TextDelta | ThoughtDelta):
                    now = time.monotonic()
                    if index not in last:
                        if index == 0:
                            self.metrics.ttft.observe(now - started)
                    else:
                        self.metrics.inter_token.observe(now - last[index])
                    last[index] = now
                elif isinstance(event, Prefilled) and index // n in pending:
                    for i in range(1, n):
                        request = _nth_choice(call.requests[index // n], i)
                        choices.add(index + i, await self._submit(dialect, call.model, request))
                    pending.discard(index // n)
                elif isinstance(event, Finished) and index % n == 0 and index // n in pending:
                    pending.discard(index // n)  # it ended before its prompt was in (cancelled): none follow
                    choices.expect_fewer(n - 1)
                if not sink.started:
                    if pending:
                        held.append((index, event))
                        continue
                    await sink.open()
                    for early in held:
                        await deliver(*early)
                    held.clear()
                await deliver(index, event)
        except EngineError as exc:
            status = 503 if isinstance(exc, EngineStopped) else 400 if isinstance(exc, InvalidRequest) else 500
            if not sink.started:
                param = exc.param if isinstance(exc, InvalidRequest) else None
                raise ApiError(status, f"generation failed: {exc}", param=param) from None
            # Headers are gone: the failure travels as the dialect's in-stream error.
            log.error("generation %s failed mid-stream: %s", call.request.request_id, exc)
            await sink.error(ApiError(status, f"generation failed: {exc}"))
        if not sink.started:  # cancelled before every choice was queued: an answer all the same
            await sink.open()
            for early in held:
                await deliver(*early)
        await sink.close()

    def _add_turn(self, conversation: str, items: list[dict[str, Any]], owner: str | None) -> None:
        """A response's input and output, added to the conversation it continued (once it is sent:
        a conversation deleted or grown too large meanwhile is told in the log)."""
        try:
            self.conversations.add(conversation, items, owner)
        except ApiError as exc:
            log.warning("conversation %s: this turn's items were not added: %s", conversation, exc.message)


def _owner(key: ApiKey | None) -> str | None:
    """Whose stored responses a request sees: its API key's (all of them where no keys are set)."""
    return key.name if key is not None else None


def _item_id(item: dict[str, Any]) -> str | None:
    item_id = item.get("id")
    return item_id if isinstance(item_id, str) else None


def _nth_choice(request: GenerationRequest, index: int) -> GenerationRequest:
    """Choice `index` of a request with n > 1: its own id and, when the client seeded it, its own
    seed (seed + index), so each choice is reproducible and they differ from each other."""
    seed = None if request.seed is None else request.seed + index
    return dataclasses.replace(request, seed=seed, request_id=f"{request.request_id}-{index}")


class _Choices:
    """The events of a request's choices as one sequence of (index, event), in arrival order; it
    ends once every choice has finished. Choices join while it is read: choice p * n, the first of
    prompt p, then the others of that prompt."""

    def __init__(self, n: int, prompts: int) -> None:
        self.expected = n * prompts  # how many choices will have finished at the end
        self.streams: dict[int, Stream] = {}  # by choice index
        self._queue: asyncio.Queue[tuple[int, Event | BaseException]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self.cancelled = False

    def add(self, index: int, stream: Stream) -> None:
        self.streams[index] = stream
        if self.cancelled:
            stream.cancel()
        if self.expected > 1:
            self._tasks.append(asyncio.create_task(self._forward(index, stream)))

    def expect_fewer(self, count: int) -> None:
        """`count` choices will not join after all (their prompt's first ended before it was in)."""
        self.expected -= count

    def cancel(self) -> None:
        self.cancelled = True
        for stream in self.streams.values():
            stream.cancel()

    async def _forward(self, index: int, stream: Stream) -> None:
        try:
            async for event in stream:
                self._queue.put_nowait((index, event))
        except Exception as exc:  # an engine error ends the whole answer, as with one choice
            self._queue.put_nowait((index, exc))

    async def __aiter__(self) -> AsyncIterator[tuple[int, Event]]:
        if self.expected == 1:  # one choice: read it directly (a queue hop per token is for nothing)
            async for event in self.streams[0]:
                yield 0, event
            return
        try:
            ended = 0
            while ended < self.expected:
                index, item = await self._queue.get()
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Finished):
                    ended += 1
                yield index, item
        finally:
            for task in self._tasks:
                task.cancel()


class Sink(Protocol):
    started: bool  # response headers sent
    closing: bool  # the last of the answer is being sent

    async def open(self) -> None: ...

    async def prefilled(self, trace: list[str]) -> None: ...

    async def delta(self, index: int, text: str) -> None: ...

    async def thought(self, index: int, text: str) -> None: ...

    async def call_start(self, index: int, call: CallOut) -> None: ...

    async def call_arguments(self, index: int, call: CallOut, piece: str) -> None: ...

    async def logprob(self, index: int, token: TokenLogprob) -> None: ...

    async def prompt_logprobs(self, index: int, scores: PromptLogprobs) -> None: ...

    async def finished(self, index: int, done: Finished) -> None: ...

    async def error(self, err: ApiError) -> None: ...

    async def close(self) -> None: ...

    @property
    def result(self) -> dict[str, Any] | None:
        """The whole answer as the dialect renders it, once sent (the Responses API's final response)."""


class WholeSink:
    """The answer as one JSON document once it is complete (every choice of it)."""

    def __init__(self, send: Send, dialect: Dialect, model: str, call: Call, debug: bool) -> None:
        self.send, self.dialect, self.model, self.call, self.debug = send, dialect, model, call, debug
        self.started = self.closing = False
        n = call.choices
        self.parts: list[list[str]] = [[] for _ in range(n)]
        self.thoughts: list[list[str]] = [[] for _ in range(n)]
        self.calls: list[list[CallOut]] = [[] for _ in range(n)]
        self.logprobs: list[list[TokenLogprob] | None] = [[] if call.request.logprobs is not None else None
                                                          for _ in range(n)]  # fmt: skip
        self.prompts: list[PromptLogprobs | None] = [None] * n
        self.done: list[Finished | None] = [None] * n
        self.doc: dict[str, Any] | None = None

    @property
    def result(self) -> dict[str, Any] | None:
        return self.doc

    async def open(self) -> None:
        pass

    async def prefilled(self, trace: list[str]) -> None:
        pass

    async def delta(self, index: int, text: str) -> None:
        self.parts[index].append(text)

    async def thought(self, index: int, text: str) -> None:
        self.thoughts[index].append(text)

    async def call_start(self, index: int, call: CallOut) -> None:
        self.calls[index].append(call)  # its arguments fill in as they arrive

    async def call_arguments(self, index: int, call: CallOut, piece: str) -> None:
        pass

    async def logprob(self, index: int, token: TokenLogprob) -> None:
        logprobs = self.logprobs[index]
        if logprobs is not None:
            logprobs.append(token)

    async def prompt_logprobs(self, index: int, scores: PromptLogprobs) -> None:
        self.prompts[index] = scores

    async def finished(self, index: int, done: Finished) -> None:
        self.done[index] = done

    async def error(self, err: ApiError) -> None:
        raise err

    async def close(self) -> None:
        self.closing = True
        # Every choice, or with n > 1 cancelled before the others began, the first alone.
        kept = zip(self.parts, self.calls, self.logprobs, self.thoughts, self.prompts, self.done, strict=True)
        choices = [(Answer("".join(parts), calls, logprobs, "".join(thought), prompt), done)
                   for parts, calls, logprobs, thought, prompt, done in kept if done is not None]  # fmt: skip
        doc = self.doc = self.dialect.response(self.model, self.call, choices)
        extra = [(b"zerolayer-trace", json.dumps(choices[0][1].trace.lines()).encode())] if self.debug else []
        self.started = True
        await _respond(self.send, 200, json.dumps(doc, ensure_ascii=False).encode(),
                       [(b"content-type", b"application/json"), *extra])  # fmt: skip


class StreamSink:
    """Server-sent events in the dialect's shape, as the engine produces tokens; with n > 1 each
    choice's events carry its index, and the end (usage, `[DONE]`) follows the last choice's."""

    def __init__(self, send: Send, encoder: StreamEncoder, n: int, debug: bool) -> None:
        self.send, self.debug = send, debug
        self.encoders = [encoder.choice(i) for i in range(n)]
        self.done: list[Finished | None] = [None] * n
        self.started = self.closing = False

    @property
    def result(self) -> dict[str, Any] | None:
        final = getattr(self.encoders[0], "final", None)  # the encoders that render a whole answer at the end
        return final if isinstance(final, dict) else None

    async def open(self) -> None:
        await self.send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", self.encoders[0].content_type), (b"cache-control", b"no-cache")]})  # fmt: skip
        self.started = True
        await _chunk(self.send, b"".join(e.start() for e in self.encoders))

    async def prefilled(self, trace: list[str]) -> None:
        if self.debug:  # the shard and cache decisions now; the run's figures at the end
            await _chunk(self.send, self.encoders[0].debug(trace[:2] + trace[3:]))

    async def delta(self, index: int, text: str) -> None:
        await _chunk(self.send, self.encoders[index].delta(text))

    async def thought(self, index: int, text: str) -> None:
        await _chunk(self.send, self.encoders[index].thought(text))

    async def call_start(self, index: int, call: CallOut) -> None:
        await _chunk(self.send, self.encoders[index].call_start(call))

    async def call_arguments(self, index: int, call: CallOut, piece: str) -> None:
        await _chunk(self.send, self.encoders[index].call_arguments(call, piece))

    async def logprob(self, index: int, token: TokenLogprob) -> None:
        await _chunk(self.send, self.encoders[index].logprob(token))

    async def prompt_logprobs(self, index: int, scores: PromptLogprobs) -> None:
        await _chunk(self.send, self.encoders[index].prompt_logprobs(scores))

    async def finished(self, index: int, done: Finished) -> None:
        self.done[index] = done
        if self.debug and index == 0:
            await _chunk(self.send, self.encoders[0].debug(done.trace.lines()[2:3]))
        if done.stop_reason == "cancelled":
            return
        out = self.encoders[index].finish_choice(done)
        ended = [d for d in self.done if d is not None]
        if len(ended) == len(self.done):
            out += self.encoders[0].end(*ended)
        await _chunk(self.send, out)

    async def error(self, err: ApiError) -> None:
        await _chunk(self.send, self.encoders[0].error(err))

    async def close(self) -> None:
        self.closing = True
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})


async def _cancel_on_disconnect(receive: Receive, choices: _Choices, gone: asyncio.Event, sink: Sink) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not sink.closing:  # a transport may report the disconnect that follows a complete answer
                gone.set()
            choices.cancel()
            return


async def _read_body(receive: Receive, headers: list[tuple[bytes, bytes]], limit: int) -> bytes:
    for name, value in headers:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise ApiError(413, f"request body of {int(value)} bytes is over the limit of {limit} bytes")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone("the client went away while sending the body")
        body = message.get("body", b"")
        size += len(body)
        if size > limit:
            raise ApiError(413, f"request body is over the limit of {limit} bytes")
        chunks.append(body)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _respond_quietly(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """An error answer to a client that may already be gone (it was refused before its body was
    read, and kept sending, or hung up): its leaving is no error of ours."""
    try:
        await _respond(send, status, body, headers)
    except ClientGone as gone:
        log.debug("client went away before its %d answer was sent: %s", status, gone)


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
