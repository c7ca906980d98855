"""The Anthropic Messages API: JSON -> GenerationRequest, engine events -> JSON and SSE bytes."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from appliance.api.dialect import Call, ModelInfo
from appliance.api.errors import ApiError
from appliance.api.fields import get_bool, get_int, get_number, get_str, reject_unknown, text_content
from appliance.engine import Finished, GenerationRequest, Message

# status -> the Messages API's error type
_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 413: "request_too_large", 425: "invalid_request_error", 429: "rate_limit_error",
    500: "api_error", 503: "api_error", 529: "overloaded_error",
}  # fmt: skip

_KNOWN = {"model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k",
          "metadata", "stream"}  # fmt: skip
_UNSUPPORTED = {
    "tools": "tool use is not supported by this server",
    "tool_choice": "tool use is not supported by this server",
    "thinking": "extended thinking is not supported by this server",
    "mcp_servers": "MCP servers are not supported by this server",
    "container": "containers are not supported by this server",
    "service_tier": "service tiers are not supported by this server",
}
_COUNT_KNOWN = {"model", "messages", "system"}


def _messages(doc: dict[str, Any]) -> tuple[Message, ...]:
    raw = doc.get("messages")
    if raw is None:
        raise ApiError(400, "messages: field required", param="messages")
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "messages: must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where}: must be an object", param="messages")
        reject_unknown(m, {"role", "content"}, {}, where=f"{where}.")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise ApiError(400, f"{where}.role: must be 'user' or 'assistant'", param="messages")
        expected = "user" if i % 2 == 0 else "assistant"
        if role != expected:
            raise ApiError(400, f"{where}.role: roles must alternate, starting with 'user'", param="messages")
        if "content" not in m:
            raise ApiError(400, f"{where}.content: field required", param="messages")
        out.append(Message(role, text_content(m["content"], f"{where}.content")))
    return tuple(out)


def _system(doc: dict[str, Any]) -> str | None:
    system = doc.get("system")
    return None if system is None else text_content(system, "system")


def check_model(doc: dict[str, Any], served: str) -> None:
    model = get_str(doc, "model", required=True)
    if model != served:
        raise ApiError(404, f"model: {model!r} is not served here; this appliance serves {served!r}", param="model")


def parse_request(doc: dict[str, Any], served_model: str) -> tuple[GenerationRequest, bool]:
    reject_unknown(doc, _KNOWN, _UNSUPPORTED)
    check_model(doc, served_model)
    messages = _messages(doc)
    max_tokens = get_int(doc, "max_tokens", required=True, minimum=1)
    assert max_tokens is not None
    stops = doc.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, "stop_sequences: must be a list of strings", param="stop_sequences")
    metadata = doc.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise ApiError(400, "metadata: must be an object", param="metadata")
    request = GenerationRequest(
        messages=messages,
        system=_system(doc),
        max_tokens=max_tokens,
        temperature=get_number(doc, "temperature", 0.0, 1.0),
        top_p=get_number(doc, "top_p", 0.0, 1.0),
        top_k=get_int(doc, "top_k", minimum=0),
        stop_sequences=tuple(stops),
    )
    return request, get_bool(doc, "stream")


def parse_count_tokens(doc: dict[str, Any], served_model: str) -> GenerationRequest:
    reject_unknown(doc, _COUNT_KNOWN, _UNSUPPORTED)
    check_model(doc, served_model)
    return GenerationRequest(messages=_messages(doc), system=_system(doc), max_tokens=1)


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def response(message_id: str, model: str, text: str, done: Finished) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": done.stop_reason,
        "stop_sequence": done.stop_sequence,
        "usage": {"input_tokens": done.input_tokens, "output_tokens": done.output_tokens},
    }


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class StreamEncoder:
    """Engine events -> the Messages API's SSE event sequence."""

    def __init__(self, message_id: str, model: str, input_tokens: int) -> None:
        self.message_id, self.model, self.input_tokens = message_id, model, input_tokens
        self.started = time.monotonic()

    def start(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.message_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }  # fmt: skip
        return (
            sse("message_start", {"type": "message_start", "message": message})
            + sse("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}})
            + sse("ping", {"type": "ping"})
        )

    def delta(self, text: str) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "text_delta", "text": text}})  # fmt: skip

    def debug(self, lines: list[str]) -> bytes:
        """The decision trace, for callers allowed to see it (not part of the Messages API)."""
        return sse("zerolayer_debug", {"type": "zerolayer_debug", "lines": lines})

    def finish(self, done: Finished) -> bytes:
        return (
            sse("content_block_stop", {"type": "content_block_stop", "index": 0})
            + sse("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": done.stop_reason, "stop_sequence": done.stop_sequence},
                                    "usage": {"output_tokens": done.output_tokens}})
            + sse("message_stop", {"type": "message_stop"})
        )

    def error(self, err: ApiError) -> bytes:
        return f"event: error\ndata: {error_body(err).decode()}\n\n".encode()


def error_body(err: ApiError) -> bytes:
    kind = _ERROR_TYPES.get(err.status, "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": err.message}}).encode()


class AnthropicDialect:
    """The Messages API (`/v1/messages`, `/v1/messages/count_tokens`, `anthropic-version` clients)."""

    name = "anthropic"
    busy_status = 529

    def parse(self, doc: dict[str, Any], served_model: str) -> Call:
        request, stream = parse_request(doc, served_model)
        return Call(request, stream)

    def response(self, model: str, text: str, done: Finished) -> dict[str, Any]:
        return response(new_message_id(), model, text, done)

    def stream(self, model: str, input_tokens: int, call: Call) -> StreamEncoder:
        return StreamEncoder(new_message_id(), model, input_tokens)

    def error_body(self, err: ApiError) -> bytes:
        return error_body(err)

    def models(self, model: ModelInfo) -> dict[str, Any]:
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(model.created))
        item = {"type": "model", "id": model.name, "display_name": f"{model.name} {model.version}",
                "created_at": created}  # fmt: skip
        return {"data": [item], "has_more": False, "first_id": model.name, "last_id": model.name}


ANTHROPIC = AnthropicDialect()
