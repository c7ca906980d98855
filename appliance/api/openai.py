"""OpenAI Chat Completions: JSON -> GenerationRequest, engine events -> JSON and SSE chunks."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from appliance.api.dialect import Call, ModelInfo
from appliance.api.errors import ApiError
from appliance.api.fields import get_bool, get_int, get_number, get_str, reject_unknown, text_content
from appliance.engine import Finished, GenerationRequest, Message

# status -> (OpenAI error type, code)
_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None), 401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "permission_denied"), 404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"), 413: ("invalid_request_error", "request_too_large"),
    425: ("invalid_request_error", "too_early"), 429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", None), 503: ("server_error", "not_ready"), 529: ("server_error", "overloaded"),
}  # fmt: skip

_KNOWN = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed", "n",
          "stream", "stream_options", "user", "frequency_penalty", "presence_penalty", "logprobs", "metadata",
          "store"}  # fmt: skip
_UNSUPPORTED = {
    "tools": "tool calls are not supported by this server",
    "tool_choice": "tool calls are not supported by this server",
    "functions": "function calls are not supported by this server",
    "function_call": "function calls are not supported by this server",
    "response_format": "structured output is not supported by this server",
    "logit_bias": "logit_bias is not supported by this server",
    "top_logprobs": "logprobs are not supported by this server",
    "audio": "audio output is not supported by this server",
    "modalities": "only text output is supported by this server",
    "prediction": "predicted outputs are not supported by this server",
    "web_search_options": "web search is not supported by this server",
    "reasoning_effort": "reasoning effort is not supported by this server",
    "parallel_tool_calls": "tool calls are not supported by this server",
}
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
DEFAULT_MAX_TOKENS = 1024


def _messages(doc: dict[str, Any]) -> tuple[str | None, tuple[Message, ...]]:
    raw = doc.get("messages")
    if raw is None:
        raise ApiError(400, "messages: field required", param="messages")
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "messages: must be a non-empty list", param="messages")
    system_parts: list[str] = []
    out: list[Message] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where}: must be an object", param="messages")
        role = m.get("role")
        if role == "tool" or "tool_calls" in m:
            raise ApiError(400, f"{where}: tool messages are not supported by this server", param="messages")
        if role not in _ROLES:
            raise ApiError(400, f"{where}.role: must be one of {', '.join(_ROLES)}", param="messages")
        reject_unknown(m, {"role", "content", "name"}, {}, where=f"{where}.")
        get_str(m, "name", where=f"{where}.")
        if m.get("content") is None:
            raise ApiError(400, f"{where}.content: field required", param="messages")
        text = text_content(m["content"], f"{where}.content")
        if _ROLES[role] == "system":
            if out:
                raise ApiError(400, f"{where}: system messages must come before the conversation", param="messages")
            system_parts.append(text)
        else:
            out.append(Message(_ROLES[role], text))
    if not out:
        raise ApiError(400, "messages: needs at least one user message", param="messages")
    return ("\n\n".join(system_parts) or None), tuple(out)


def parse_request(doc: dict[str, Any], served_model: str) -> tuple[GenerationRequest, bool, bool]:
    """Returns the request, whether to stream, and whether to send a usage chunk."""
    reject_unknown(doc, _KNOWN, _UNSUPPORTED)
    model = get_str(doc, "model", required=True)
    if model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist; this appliance serves `{served_model}`",
                       param="model")  # fmt: skip
    system, messages = _messages(doc)
    get_str(doc, "user")
    n = get_int(doc, "n", minimum=1)
    if n not in (None, 1):
        raise ApiError(400, "n: only n=1 is supported by this server", param="n")
    for key in ("frequency_penalty", "presence_penalty"):
        if get_number(doc, key, -2.0, 2.0) not in (None, 0.0):
            raise ApiError(400, f"{key}: penalties are not supported by this server (use 0)", param=key)
    if get_bool(doc, "logprobs"):
        raise ApiError(400, "logprobs: not supported by this server", param="logprobs")
    max_tokens = get_int(doc, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = get_int(doc, "max_tokens", minimum=1)
    stop = doc.get("stop")
    if isinstance(stop, str):
        stops: tuple[str, ...] = (stop,)
    elif stop is None:
        stops = ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
        stops = tuple(stop)
    else:
        raise ApiError(400, "stop: must be a string or a list of at most 4 strings", param="stop")
    stream = get_bool(doc, "stream")
    options = doc.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise ApiError(400, "stream_options: must be an object", param="stream_options")
        if not stream:
            raise ApiError(400, "stream_options: only allowed when stream is true", param="stream_options")
        reject_unknown(options, {"include_usage", "include_obfuscation"}, {}, where="stream_options.")
        include_usage = get_bool(options, "include_usage")
    seed = get_int(doc, "seed")
    request = GenerationRequest(
        messages=messages,
        system=system,
        max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
        temperature=get_number(doc, "temperature", 0.0, 2.0),
        top_p=get_number(doc, "top_p", 0.0, 1.0),
        stop_sequences=stops,
        seed=seed,
    )
    return request, stream, include_usage


def finish_reason(done: Finished) -> str:
    return "length" if done.stop_reason == "max_tokens" else "stop"


def new_completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def response(completion_id: str, model: str, text: str, done: Finished) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                     "finish_reason": finish_reason(done), "logprobs": None}],
        "usage": _usage(done),
    }


def _usage(done: Finished) -> dict[str, int]:
    return {"prompt_tokens": done.input_tokens, "completion_tokens": done.output_tokens,
            "total_tokens": done.input_tokens + done.output_tokens}  # fmt: skip


class StreamEncoder:
    def __init__(self, completion_id: str, model: str, include_usage: bool) -> None:
        self.id, self.model, self.include_usage = completion_id, model, include_usage
        self.created = int(time.time())

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        doc = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": choices, **extra}  # fmt: skip
        return f"data: {json.dumps(doc, ensure_ascii=False)}\n\n".encode()

    def start(self) -> bytes:
        return self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])

    def delta(self, text: str) -> bytes:
        return self._chunk([{"index": 0, "delta": {"content": text}, "finish_reason": None}])

    def debug(self, lines: list[str]) -> bytes:
        """The decision trace as an SSE comment: clients that do not ask for it skip it."""
        return b"".join(f": zerolayer-debug {line}\n".encode() for line in lines) + b"\n"

    def finish(self, done: Finished) -> bytes:
        out = self._chunk([{"index": 0, "delta": {}, "finish_reason": finish_reason(done)}])
        if self.include_usage:
            out += self._chunk([], usage=_usage(done))
        return out + b"data: [DONE]\n\n"

    def error(self, err: ApiError) -> bytes:
        return b"data: " + error_body(err) + b"\n\n"


def error_body(err: ApiError) -> bytes:
    kind, code = _ERROR_KINDS.get(err.status, _ERROR_KINDS[500])
    return json.dumps({"error": {"message": err.message, "type": kind, "param": err.param, "code": code}}).encode()


class OpenAIDialect:
    """Chat Completions (`/v1/chat/completions`, and OpenAI clients on shared paths)."""

    name = "openai"
    busy_status = 429

    def parse(self, doc: dict[str, Any], served_model: str) -> Call:
        request, stream, include_usage = parse_request(doc, served_model)
        return Call(request, stream, include_usage)

    def response(self, model: str, text: str, done: Finished) -> dict[str, Any]:
        return response(new_completion_id(), model, text, done)

    def stream(self, model: str, input_tokens: int, call: Call) -> StreamEncoder:
        return StreamEncoder(new_completion_id(), model, call.include_usage)

    def error_body(self, err: ApiError) -> bytes:
        return error_body(err)

    def models(self, model: ModelInfo) -> dict[str, Any]:
        item: dict[str, Any] = {"id": model.name, "object": "model", "created": model.created, "owned_by": "zerolayer"}
        return {"object": "list", "data": [item]}


OPENAI = OpenAIDialect()
