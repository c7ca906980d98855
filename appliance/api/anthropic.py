"""The Anthropic Messages API: JSON -> GenerationRequest, engine events -> JSON and SSE bytes."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any, Self

from appliance.api.dialect import Call, ModelInfo
from appliance.api.errors import ApiError, not_served
from appliance.api.fields import (
    Hint,
    block_text,
    check_hints,
    get_bool,
    get_int,
    get_number,
    get_str,
    reject_unknown,
    text_content,
)
from appliance.api.tools import (
    Answer,
    CallOut,
    arguments_text,
    check_tools,
    make_tool,
    new_call_id,
    schema_object,
    strict_flag,
    tool_extras,
    tool_items,
)
from appliance.engine import ContextOverflow, Finished, GenerationRequest, Message
from appliance.engine.request import PromptLogprobs, TokenLogprob
from appliance.engine.tools import OutputRules, PastCall, Tool, ToolChoice

# status -> the Messages API's error type
_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    405: "invalid_request_error", 413: "request_too_large", 425: "invalid_request_error", 429: "rate_limit_error",
    500: "api_error", 503: "api_error", 529: "overloaded_error",
}  # fmt: skip

# Accepted and checked (fields.check_hints): none changes the answer. The prefix pool caches
# prompts unasked (cache_control); the box has one speed, one tier and one place (inference_geo).
_COUNT_HINTS: dict[str, Hint] = {"cache_control": dict, "speed": ("standard", "fast"), "user_profile_id": str,
                                 "workspace_id": str}  # fmt: skip
_HINTS: dict[str, Hint] = {**_COUNT_HINTS, "metadata": dict, "service_tier": ("auto", "standard_only"),
                           "inference_geo": str, "diagnostics": dict}  # fmt: skip
_KNOWN = {"model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "stream",
          "tools", "tool_choice", "output_config", "output_format", "thread", "thinking", "context_management",
          *_HINTS}  # fmt: skip
_UNSUPPORTED = {
    "mcp_servers": "MCP servers are not supported by this server",
    "container": "containers are not supported by this server",
    "compaction": "server-side compaction is not supported by this server: send the conversation to keep",
}
_COUNT_KNOWN = {"model", "messages", "system", "tools", "tool_choice", "output_config", "output_format", "thinking",
                "context_management", *_COUNT_HINTS}  # fmt: skip
_CLEAR_THINKING = "clear_thinking_20251015"
# output_config.effort: the chat template's reasoning_effort (gpt-oss reads low, medium and high).
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
_TOOL_KNOWN = {"name", "description", "input_schema", "type", "cache_control", "strict", "input_examples",
               "eager_input_streaming", "defer_loading", "allowed_callers"}  # fmt: skip


def _conversation(doc: dict[str, Any]) -> tuple[str | None, tuple[Message, ...]]:
    """`system` and `messages` -> the system text and the turns: system messages before the first
    turn join the system text; a later one stays where it is (the chat template places it)."""
    system = [] if doc.get("system") is None else [text_content(doc["system"], "system")]
    messages = list(_messages(doc))
    while messages and messages[0].role == "system":
        system.append(messages.pop(0).content)
    if not messages:
        raise ApiError(400, "messages: must hold a user turn, not system messages only", param="messages")
    return "\n\n".join(system) if system else None, _cleared(tuple(messages), doc.get("context_management"))


def _cleared(messages: tuple[Message, ...], raw: Any) -> tuple[Message, ...]:
    """`context_management`'s edits applied: clear_thinking drops the thoughts of the assistant turns
    before the last ones it keeps (`keep`: "all", or {"type": "thinking_turns", "value": N}; one by
    default). Clearing tool results server-side (clear_tool_uses) is refused by name."""
    if raw is None:
        return messages
    edits = raw.get("edits") if isinstance(raw, dict) else None
    if not isinstance(edits, list) or not isinstance(raw, dict) or set(raw) - {"edits"}:
        raise ApiError(400, "context_management: must be an object with a list of edits", param="context_management")
    for i, edit in enumerate(edits):
        where = f"context_management.edits[{i}]"
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind != _CLEAR_THINKING:
            raise ApiError(400, f"{where}.type: {kind!r} is not supported by this server (only {_CLEAR_THINKING}: "
                           "clearing earlier tool results server-side is not; send the conversation to keep)",
                           param="context_management")  # fmt: skip
        assert isinstance(edit, dict)
        reject_unknown(edit, {"type", "keep"}, {}, where=f"{where}.")
        keep = edit.get("keep", {"type": "thinking_turns", "value": 1})
        if keep == "all":
            continue
        turns = keep.get("value") if isinstance(keep, dict) and keep.get("type") == "thinking_turns" else None
        if not isinstance(turns, int) or isinstance(turns, bool) or turns < 0:
            raise ApiError(400, f"{where}.keep: must be \"all\" or {{\"type\": \"thinking_turns\", \"value\": N}}",
                           param="context_management")  # fmt: skip
        answers = [i for i, m in enumerate(messages) if m.role == "assistant"]
        cleared = set(answers[: len(answers) - turns]) if turns < len(answers) else set()
        messages = tuple(dataclasses.replace(m, thought="") if i in cleared else m for i, m in enumerate(messages))
    return messages


def _messages(doc: dict[str, Any]) -> tuple[Message, ...]:
    raw = doc.get("messages")
    if raw is None:
        raise ApiError(400, "messages: field required", param="messages")
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "messages: must be a non-empty list", param="messages")
    out: list[Message] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where}: must be an object", param="messages")
        reject_unknown(m, {"role", "content"}, {}, where=f"{where}.")
        role = m.get("role")
        if role not in ("user", "assistant", "system"):
            raise ApiError(400, f"{where}.role: must be 'user', 'assistant' or 'system'", param="messages")
        if role == "assistant" and not any(o.role == "user" for o in out):
            raise ApiError(400, f"{where}.role: the first turn must be the user's", param="messages")
        if "content" not in m:
            raise ApiError(400, f"{where}.content: field required", param="messages")
        if role == "system":  # its text only, as the top-level system's
            message = Message("system", text_content(m["content"], f"{where}.content"))
        else:
            message = _message(m["content"], role, f"{where}.content")
        # Consecutive messages of one role are one turn, as the Messages API combines them (tool
        # results and the next question, say, sent as two user messages).
        if out and out[-1].role == role:
            out[-1] = _combined(out[-1], message)
        else:
            out.append(message)
    return tuple(out)


def _combined(first: Message, then: Message) -> Message:
    def joined(*texts: str) -> str:
        return "\n".join(t for t in texts if t)

    return Message(first.role, joined(first.content, then.content), first.calls + then.calls,
                   first.results + then.results, joined(first.thought, then.thought))  # fmt: skip


def _message(content: Any, role: str, where: str) -> Message:
    """A message's text (its text blocks), the assistant's thought and earlier tool calls, and the
    user's tool results (text, is_error)."""
    if not isinstance(content, list):
        return Message(role, text_content(content, where))
    parts: list[str] = []
    thoughts: list[str] = []
    calls: list[PastCall] = []
    results: list[tuple[str, bool]] = []
    for i, block in enumerate(content):
        at = f"{where}[{i}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use" and role == "assistant":
            reject_unknown(block, {"type", "id", "name", "input", "cache_control", "caller", "toolset_name"}, {},
                           where=f"{at}.")  # what the SDK echoes back from a response
            get_str(block, "id", required=True, where=f"{at}.")
            name = get_str(block, "name", required=True, where=f"{at}.")
            calls.append(PastCall(str(name), arguments_text(block.get("input"), f"{at}.input", "messages")))
        elif kind == "tool_result" and role == "user":
            reject_unknown(block, {"type", "tool_use_id", "content", "is_error", "cache_control", "toolset_name"}, {},
                           where=f"{at}.")  # fmt: skip
            get_str(block, "tool_use_id", required=True, where=f"{at}.")
            results.append((_result_text(block.get("content", ""), f"{at}.content"), get_bool(block, "is_error")))
        elif kind == "thinking" and role == "assistant":  # an earlier thought, echoed back as the SDK keeps it
            thoughts.append(get_str(block, "thinking", where=f"{at}.") or "")
        elif kind == "redacted_thinking" and role == "assistant":
            continue  # (another server's thought, encrypted: nothing a template could show)
        elif kind in ("tool_use", "tool_result"):
            owner = "assistant" if kind == "tool_use" else "user"
            raise ApiError(400, f"{at}: {kind} blocks belong in {owner} messages", param="messages")
        elif _is_document(block) and role == "user":
            parts.append(_document_text(block, at))
        else:
            parts.append(block_text(block, at, param="messages"))
    return Message(role, "\n".join(parts), tuple(calls), tuple(results), "\n".join(t for t in thoughts if t))


def _is_document(block: Any) -> bool:
    """A plain-text document or a search result (_document_text reads either)."""
    return isinstance(block, dict) and block.get("type") in ("document", "search_result")


def _result_text(content: Any, where: str) -> str:
    """A tool result's content: a string, or text blocks, plain-text documents and search results."""
    if not isinstance(content, list) or not any(_is_document(b) for b in content):
        return "" if content == [] else text_content(content, where)
    return "\n".join(_document_text(b, f"{where}[{i}]") if _is_document(b) else block_text(b, f"{where}[{i}]",
                     param="messages") for i, b in enumerate(content))  # fmt: skip


def _document_text(block: dict[str, Any], at: str) -> str:
    """A plain-text document or a search result (RAG's sources) as the model reads it, in the layout
    Anthropic's long-context guide gives: its source, title and context, then its text. PDFs, images
    and uploaded files are refused by name, and so are citations (this server writes none)."""
    reject_unknown(block, {"type", "source", "title", "context", "content", "citations", "cache_control"}, {},
                   where=f"{at}.")  # fmt: skip
    citations = block.get("citations")
    if isinstance(citations, dict) and citations.get("enabled"):
        raise ApiError(400, f"{at}.citations: citations are not supported by this server", param="messages")
    title = get_str(block, "title", where=f"{at}.")
    context = get_str(block, "context", where=f"{at}.")
    if block["type"] == "search_result":
        origin = get_str(block, "source", required=True, where=f"{at}.")
        text = text_content(block.get("content"), f"{at}.content")
    else:
        source = block.get("source")
        kind = source.get("type") if isinstance(source, dict) else None
        if kind == "text":
            assert isinstance(source, dict)
            text = get_str(source, "data", required=True, where=f"{at}.source.") or ""
        elif kind == "content":
            assert isinstance(source, dict)
            text = text_content(source.get("content"), f"{at}.source.content")
        else:
            raise ApiError(400, f"{at}.source: documents of source type {kind!r} are not supported by this server "
                           "(plain text is: 'text' or 'content')", param="messages")  # fmt: skip
        origin = None
    lines = [f"<source>{origin}</source>" if origin else "", f"<title>{title}</title>" if title else "",
             f"<context>{context}</context>" if context else "", f"<document_content>\n{text}\n</document_content>"]
    return "<document>\n" + "\n".join(line for line in lines if line) + "\n</document>"


def _tools(doc: dict[str, Any], config: dict[str, Any]) -> OutputRules:
    """tools, tool_choice and output_config.format (`config`: _output_config): what the answer may be."""
    tools: list[Tool] = []
    for where, t in tool_items(doc):
        if t.get("type") not in (None, "custom"):
            raise ApiError(400, f"{where}.type: server tools ({t.get('type')!r}) are not supported by this server; "
                           "define custom tools with input_schema", param="tools")  # fmt: skip
        reject_unknown(t, _TOOL_KNOWN, {}, where=f"{where}.")
        tool_extras(t, where, "tools")
        if "input_schema" not in t:
            raise ApiError(400, f"{where}.input_schema: field required", param="tools")
        tools.append(make_tool(t.get("name"), t.get("description"), t["input_schema"], where, "tools",
                               strict_flag(t, f"{where}.", "tools")))  # fmt: skip
    choice = _tool_choice(doc.get("tool_choice"), {t.name for t in tools})
    # Structured outputs are always enforced in the Messages API: a schema it cannot hold is refused.
    return OutputRules(check_tools(tools, "tools"), choice, _output_format(config),
                       schema_field="output_config", schema_strict=True)  # fmt: skip


def _tool_choice(raw: Any, names: set[str]) -> ToolChoice:
    if raw is None:
        return ToolChoice()
    if not isinstance(raw, dict):
        raise ApiError(400, "tool_choice: must be an object", param="tool_choice")
    kind = raw.get("type")
    modes = {"auto": "auto", "any": "required", "tool": "tool", "none": "none"}
    if not isinstance(kind, str) or kind not in modes:
        raise ApiError(400, "tool_choice.type: must be one of auto, any, tool, none", param="tool_choice")
    reject_unknown(raw, {"type", "name", "disable_parallel_tool_use"}, {}, where="tool_choice.")
    name = get_str(raw, "name", required=kind == "tool", where="tool_choice.")
    if kind == "tool" and name not in names:
        raise ApiError(400, f"tool_choice.name: {name!r} is not one of the tools", param="tool_choice")
    if kind in ("any", "tool") and not names:
        raise ApiError(400, f"tool_choice: type {kind!r} needs tools", param="tool_choice")
    return ToolChoice(modes[kind], name, parallel=not get_bool(raw, "disable_parallel_tool_use"))


def _output_config(doc: dict[str, Any]) -> dict[str, Any]:
    """output_config ({} where absent), its format given by the structured-outputs beta's
    top-level `output_format` where a client of that beta sends one there."""
    raw = doc.get("output_config")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ApiError(400, "output_config: must be an object", param="output_config")
    reject_unknown(raw, {"format", "effort"}, {}, where="output_config.")
    if doc.get("output_format") is None:
        return raw
    if raw.get("format") is not None:
        raise ApiError(400, "output_format: give the format once, in output_config.format", param="output_format")
    return {**raw, "format": doc["output_format"]}


def _effort(config: dict[str, Any]) -> str | None:
    effort = config.get("effort")
    if effort is not None and effort not in _EFFORTS:
        raise ApiError(400, f"output_config.effort: must be one of {', '.join(_EFFORTS)}", param="output_config")
    return None if effort is None else _EFFORTS[effort]


def _output_format(config: dict[str, Any]) -> dict[str, Any] | None:
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise ApiError(400, "output_config.format: must be {type: 'json_schema', schema: {...}}",
                       param="output_config")  # fmt: skip
    reject_unknown(fmt, {"type", "schema"}, {}, where="output_config.format.")
    return schema_object(fmt.get("schema"), "output_config.format.schema", "output_config")


MIN_THINKING_BUDGET = 1024  # as the Messages API requires


def _thinking(raw: Any, max_tokens: int | None) -> tuple[bool | None, int | None]:
    """`thinking`: enabled (with a budget of thought tokens below max_tokens, where the request has
    one), adaptive (the model's own measure), or disabled -> (the template's switch, the budget)."""
    if raw is None:
        return None, None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in ("enabled", "adaptive", "disabled"):
        raise ApiError(400, "thinking.type: must be 'enabled', 'adaptive' or 'disabled'", param="thinking")
    assert isinstance(raw, dict)
    reject_unknown(raw, {"type", "budget_tokens", "display"}, {}, where="thinking.")
    if kind != "enabled":
        return kind == "adaptive", None
    budget = get_int(raw, "budget_tokens", required=True, minimum=MIN_THINKING_BUDGET)
    assert budget is not None
    if max_tokens is not None and budget >= max_tokens:
        raise ApiError(400, f"thinking.budget_tokens: must be less than max_tokens ({max_tokens})", param="thinking")
    return True, budget


def check_model(doc: dict[str, Any], served: Sequence[str]) -> str:
    model = get_str(doc, "model", required=True)
    assert model is not None
    if model not in served:
        raise ApiError(404, f"model: {not_served(model, served)}", param="model")
    return model


def parse_request(doc: dict[str, Any], served: Sequence[str]) -> tuple[str, GenerationRequest, bool]:
    reject_unknown(doc, _KNOWN, _UNSUPPORTED)
    check_hints(doc, _HINTS)
    model = check_model(doc, served)
    if doc.get("thread") not in (None, False):
        # The SDKs' tool runners ask for a thread and, on this error code, go on sending the whole conversation.
        raise ApiError(400, f"thread: server-side threads ({doc['thread']!r}) are not supported by this server; "
                       "send the whole conversation without `thread`", param="thread",
                       details={"error_code": "thread_unsupported_request"})  # fmt: skip
    system, messages = _conversation(doc)
    max_tokens = get_int(doc, "max_tokens", required=True, minimum=1)
    assert max_tokens is not None
    stops = doc.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, "stop_sequences: must be a list of strings", param="stop_sequences")
    thinking, budget = _thinking(doc.get("thinking"), max_tokens)
    config = _output_config(doc)
    request = GenerationRequest(
        messages=messages,
        system=system,
        max_tokens=max_tokens,
        temperature=get_number(doc, "temperature", 0.0, 1.0),
        top_p=get_number(doc, "top_p", 0.0, 1.0),
        top_k=get_int(doc, "top_k", minimum=0),
        stop_sequences=tuple(stops),
        output=_tools(doc, config),
        thinking=thinking,
        thinking_budget=budget,
        reasoning_effort=_effort(config),
    )
    return model, request, get_bool(doc, "stream")


def parse_count_tokens(doc: dict[str, Any], served: Sequence[str]) -> tuple[str, GenerationRequest]:
    reject_unknown(doc, _COUNT_KNOWN, _UNSUPPORTED)
    check_hints(doc, _COUNT_HINTS)
    model = check_model(doc, served)
    thinking, _ = _thinking(doc.get("thinking"), None)  # the prompt renders as the request's would
    config = _output_config(doc)
    system, messages = _conversation(doc)
    return model, GenerationRequest(messages=messages, system=system, max_tokens=1,
                                    output=_tools(doc, config), thinking=thinking,
                                    reasoning_effort=_effort(config))  # fmt: skip


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def response(message_id: str, model: str, answer: Answer, done: Finished) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if answer.thought:  # no signature: nothing here checks a thought that comes back
        content.append({"type": "thinking", "thinking": answer.thought, "signature": ""})
    if answer.text or not (answer.calls or answer.thought):  # a stream's blocks, the same
        content.append({"type": "text", "text": answer.text})
    for call in answer.calls:
        arguments = call.input()
        if arguments is not None:  # a call cut off by max_tokens has no input to give
            content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments})
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": done.stop_reason,
        "stop_sequence": done.stop_sequence,
        "usage": {"input_tokens": done.input_tokens, "output_tokens": done.output_tokens},
    }


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class StreamEncoder:
    """Engine events -> the Messages API's SSE event sequence. Content blocks open as the answer
    needs them: a text block for text, a tool_use block for each call."""

    content_type = b"text/event-stream; charset=utf-8"  # server-sent events

    def __init__(self, message_id: str, model: str, input_tokens: int) -> None:
        self.message_id, self.model, self.input_tokens = message_id, model, input_tokens
        self.block = -1  # index of the open content block
        self.open: str | None = None  # its type

    def start(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.message_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }  # fmt: skip
        return sse("message_start", {"type": "message_start", "message": message}) + sse("ping", {"type": "ping"})

    def _open(self, block: dict[str, Any]) -> bytes:
        out = self._close()
        self.block += 1
        self.open = block["type"]
        return out + sse("content_block_start", {"type": "content_block_start", "index": self.block,
                                                 "content_block": block})  # fmt: skip

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        self.open = None
        return sse("content_block_stop", {"type": "content_block_stop", "index": self.block})

    def delta(self, text: str) -> bytes:
        out = b"" if self.open == "text" else self._open({"type": "text", "text": ""})
        return out + sse("content_block_delta", {"type": "content_block_delta", "index": self.block,
                                                 "delta": {"type": "text_delta", "text": text}})  # fmt: skip

    def thought(self, text: str) -> bytes:
        out = b"" if self.open == "thinking" else self._open({"type": "thinking", "thinking": "", "signature": ""})
        return out + sse("content_block_delta", {"type": "content_block_delta", "index": self.block,
                                                 "delta": {"type": "thinking_delta", "thinking": text}})  # fmt: skip

    def call_start(self, call: CallOut) -> bytes:
        return self._open({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})

    def call_arguments(self, call: CallOut, piece: str) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": self.block,
                                           "delta": {"type": "input_json_delta", "partial_json": piece}})  # fmt: skip

    def logprob(self, token: TokenLogprob) -> bytes:
        return b""  # the Messages API has no log probabilities (never asked for)

    def prompt_logprobs(self, scores: PromptLogprobs) -> bytes:
        return b""

    def debug(self, lines: list[str]) -> bytes:
        """The decision trace, for callers allowed to see it (not part of the Messages API)."""
        return sse("zerolayer_debug", {"type": "zerolayer_debug", "lines": lines})

    def choice(self, index: int) -> Self:
        """A message has one answer (the Messages API has no n): this encoder itself."""
        if index != 0:
            raise ValueError("a message has one choice")
        return self

    def finish_choice(self, done: Finished) -> bytes:
        out = self._open({"type": "text", "text": ""}) if self.block < 0 else b""  # an empty answer: one empty block
        return (
            out + self._close()
            + sse("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": done.stop_reason, "stop_sequence": done.stop_sequence},
                                    "usage": {"output_tokens": done.output_tokens}})
        )  # fmt: skip

    def end(self, *choices: Finished) -> bytes:
        return sse("message_stop", {"type": "message_stop"})

    def error(self, err: ApiError) -> bytes:
        return f"event: error\ndata: {error_body(err).decode()}\n\n".encode()


def error_body(err: ApiError) -> bytes:
    kind = _ERROR_TYPES.get(err.status, "api_error")
    error: dict[str, object] = {"type": kind, "message": err.message}
    if err.details:
        error["details"] = err.details
    return json.dumps({"type": "error", "error": error}).encode()


class AnthropicDialect:
    """The Messages API (`/v1/messages`, `/v1/messages/count_tokens`, `anthropic-version` clients)."""

    name = "anthropic"
    busy_status = 529

    def parse(self, doc: dict[str, Any], served: Sequence[str]) -> Call:
        model, request, stream = parse_request(doc, served)
        return Call(request, stream, model)

    def response(self, model: str, call: Call, choices: Sequence[tuple[Answer, Finished]]) -> dict[str, Any]:
        ((answer, done),) = choices  # the Messages API has no n
        return response(new_message_id(), model, answer, done)

    def new_call(self, name: str) -> CallOut:
        return CallOut(new_call_id("toolu_"), name)

    def stream(self, model: str, input_tokens: int, call: Call) -> StreamEncoder:
        return StreamEncoder(new_message_id(), model, input_tokens)

    def error_body(self, err: ApiError) -> bytes:
        return error_body(err)

    def overflow(self, exc: ContextOverflow) -> ApiError:
        if exc.prompt_tokens is None or exc.max_tokens is None or exc.limit is None:
            return ApiError(400, str(exc), param=exc.param)
        return ApiError(400, f"input length and `max_tokens` exceed context limit: {exc.prompt_tokens} + "
                        f"{exc.max_tokens} > {exc.limit}, decrease input length or `max_tokens` and try again",
                        param="max_tokens")  # fmt: skip

    def models(self, models: list[ModelInfo]) -> dict[str, Any]:
        first, last = (models[0].name, models[-1].name) if models else (None, None)
        return {"data": [self.model(m) for m in models], "has_more": False, "first_id": first, "last_id": last}

    def model(self, model: ModelInfo) -> dict[str, Any]:
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(model.created))
        return {"type": "model", "id": model.name, "display_name": f"{model.name} {model.version}",
                "created_at": created}  # fmt: skip


ANTHROPIC = AnthropicDialect()
