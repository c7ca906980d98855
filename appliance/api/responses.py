"""OpenAI's Responses API (`/v1/responses`), what the OpenAI SDK's `responses.create` and the
agent frameworks built on it call: `input` (a string, or messages and the function calls and
outputs of earlier turns) -> GenerationRequest; the answer as output items (a message, function
calls), whole or as typed stream events. A request may carry its whole conversation, continue a
stored response (`previous_response_id`: the app looks the conversation up in its
response_store.ResponseStore and passes its items in) or a conversation of the Conversations API
(`conversation`: conversation_store.ConversationStore's, likewise). Errors and the model list are
the OpenAI dialect's."""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from appliance.api.dialect import Call
from appliance.api.errors import ApiError
from appliance.api.fields import check_hints, get_bool, get_int, get_str, reject_unknown
from appliance.api.openai import (
    DEFAULT_MAX_TOKENS,
    HINTS,
    OpenAIDialect,
    common_fields,
    debug_comment,
    logprob_entry,
    reasoning_of,
    tool_choice_of,
)
from appliance.api.tools import (
    Answer,
    CallOut,
    arguments_text,
    check_tools,
    make_tool,
    schema_object,
    strict_flag,
    tool_extras,
    tool_items,
)
from appliance.engine import Finished, GenerationRequest, Message
from appliance.engine.request import PromptLogprobs, TokenLogprob
from appliance.engine.tools import OutputRules, PastCall, Tool, ToolChoice

_KNOWN = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
          "parallel_tool_calls", "text", "stream", "stream_options", "truncation", "include", "reasoning",
          "max_tool_calls", "top_logprobs", "previous_response_id", "conversation", *HINTS}  # fmt: skip
_UNSUPPORTED = {
    "context_management": "server-side compaction is not supported by this server: send the conversation to keep",
    "moderation": "moderation is not supported by this server",
    "background_options": "background responses are not supported by this server",
    "prompt": "stored prompts are not supported by this server",
    "background": "background responses are not supported by this server",
}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = {"user": ("input_text",), "system": ("input_text",), "developer": ("input_text",),
               "assistant": ("output_text", "refusal")}  # fmt: skip


@dataclass(frozen=True)
class ResponsesCall(Call):
    """A Responses request: what its answer repeats back (the API echoes its parameters), and
    what storing it takes: this turn's input items and the response it continues."""

    echo_fields: dict[str, Any] = field(default_factory=dict)
    input_items: list[dict[str, Any]] = field(default_factory=list)
    previous: str | None = None
    store: bool = True
    conversation: str | None = None  # the conversation it continues, to which its items are added


def conversation_id(doc: dict[str, Any]) -> str | None:
    """The `conversation` a request continues: its id, or an object with it."""
    value = doc.get("conversation")
    if value is None:
        return None
    found = value.get("id") if isinstance(value, dict) else value
    if not isinstance(found, str) or not found:
        raise ApiError(400, "conversation: must be a conversation id or an object with its id", param="conversation")
    if doc.get("previous_response_id") is not None:
        raise ApiError(400, "conversation: cannot be given with previous_response_id (each names the earlier turns)",
                       param="conversation")  # fmt: skip
    return found


def check_items(items: object, param: str = "items") -> list[dict[str, Any]]:
    """Items a conversation is given, as the API lists them back (messages with their type, an id
    and their text as parts): ApiError 400 where they are not what `input` takes."""
    if not isinstance(items, list):
        raise ApiError(400, f"{param}: must be a list of items", param=param)
    try:
        _conversation({}, items)
    except ApiError as exc:
        raise ApiError(400, exc.message.replace("input[", f"{param}["), param=param) from None
    return [_listed(item) for item in items]


def _text(content: Any, role: str, where: str) -> str:
    """A message's content: a string, or a list of text parts (input_text; output_text for the assistant)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise ApiError(400, f"{where}: must be a string or a non-empty list of content parts", param="input")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            raise ApiError(400, f"{at}: must be an object with a type", param="input")
        if kind not in _TEXT_PARTS[role]:
            raise ApiError(400, f"{at}: content parts of type {kind!r} are not supported here (text only: "
                           f"{', '.join(_TEXT_PARTS[role])})", param="input")  # fmt: skip
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise ApiError(400, f"{at}.text: must be a string", param="input")
        texts.append(text)
    return "".join(texts)


def input_items(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """`input` as a list of items (a string is one user message)."""
    raw = doc.get("input")
    if raw is None:
        raise ApiError(400, "input: field required", param="input")
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "input: must be a string or a non-empty list of items", param="input")
    return raw


def _listed(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as the API lists a stored response's input: a message with its type, an id
    and its text as parts (it reads back as it was sent)."""
    if item.get("type", "message") != "message":
        return item
    content = item.get("content")
    part = "output_text" if item.get("role") == "assistant" else "input_text"
    parts = [{"type": part, "text": content}] if isinstance(content, str) else content
    return {"type": "message", "id": item.get("id") or _new_id("msg_"), **item, "content": parts}


def _conversation(doc: dict[str, Any], raw: Sequence[Any]) -> tuple[str | None, tuple[Message, ...]]:
    """`instructions` and the items (the earlier turns' and `input`'s) -> the system text and the
    turns in the model's own terms: an assistant's calls written as it writes them, their outputs
    as one user turn of results. (`instructions` are this request's alone, as OpenAI's.)"""
    system = [get_str(doc, "instructions")] if doc.get("instructions") else []
    turns: list[Message] = []
    assistant: list[str | PastCall] = []  # the assistant turn being built: its text, then its calls
    thought: list[str] = []  # the reasoning items before it
    results: list[tuple[str, bool]] = []  # function_call_output items in a row: one user turn
    # Items are read by the keys they need, the rest let be: clients send back the output items of
    # earlier responses as their SDK dumps them (ids, status, fields newer than this server).
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ApiError(400, f"{where}: must be an object", param="input")
        kind = item.get("type", "message")
        if kind != "function_call" and assistant:
            turns.append(_assistant_turn(assistant, thought))
            assistant, thought = [], []
        if kind != "function_call_output" and results:
            turns.append(Message("user", "", results=tuple(results)))
            results = []
        if kind == "message":
            role = item.get("role")
            if not isinstance(role, str) or role not in _ROLES:
                raise ApiError(400, f"{where}.role: must be one of {', '.join(_ROLES)}", param="input")
            text = _text(item.get("content"), role, f"{where}.content")
            if _ROLES[role] == "system" and not turns:
                system.append(text)
            elif _ROLES[role] == "system":  # later on it stays where it is: the chat template places it
                turns.append(Message("system", text))
            elif role == "assistant":
                assistant.append(text)
            else:
                turns.append(Message("user", text))
                thought = []  # (a thought no assistant turn followed)
        elif kind == "function_call":
            get_str(item, "call_id", required=True, where=f"{where}.")
            name = get_str(item, "name", required=True, where=f"{where}.")
            assistant.append(PastCall(str(name), arguments_text(item.get("arguments", "{}"), f"{where}.arguments",
                                                                "input")))  # fmt: skip
        elif kind == "reasoning":  # an earlier thought, sent back with the output items: the template decides
            parts = item["content"] if isinstance(item.get("content"), list) else []
            texts = [p.get("text") for p in parts if isinstance(p, dict) and p.get("type") == "reasoning_text"]
            thought.extend(t for t in texts if isinstance(t, str))
        elif kind == "function_call_output":
            get_str(item, "call_id", required=True, where=f"{where}.")
            output = item.get("output")
            results.append((output if isinstance(output, str) else _text(output, "user", f"{where}.output"), False))
        else:
            raise ApiError(400, f"{where}.type: items of type {kind!r} are not supported by this server (message, "
                           "function_call, function_call_output, reasoning)", param="input")  # fmt: skip
    if assistant:
        turns.append(_assistant_turn(assistant, thought))
    if results:
        turns.append(Message("user", "", results=tuple(results)))
    return ("\n\n".join(s for s in system if s) or None), tuple(turns)


def _assistant_turn(parts: list[str | PastCall], thought: list[str]) -> Message:
    """An assistant's text and calls, one turn as the model writes it (an empty text is no part),
    and the thought before them."""
    text = "\n".join(p for p in parts if isinstance(p, str) and p)
    return Message("assistant", text, tuple(p for p in parts if isinstance(p, PastCall)),
                   thought="\n".join(t for t in thought if t))  # fmt: skip


def _tools(doc: dict[str, Any]) -> OutputRules:
    tools: list[Tool] = []
    for where, t in tool_items(doc):
        if t.get("type") != "function":
            raise ApiError(400, f"{where}.type: only function tools are supported by this server (not "
                           f"{t.get('type')!r})", param="tools")  # fmt: skip
        reject_unknown(t, {"type", "name", "description", "parameters", "strict", "output_schema", "defer_loading",
                           "allowed_callers", "async"}, {}, where=f"{where}.")  # fmt: skip
        tool_extras(t, where, "tools")
        tools.append(make_tool(t.get("name"), t.get("description"), t.get("parameters"), where, "tools",
                               strict_flag(t, f"{where}.", "tools")))  # fmt: skip
    names = {t.name for t in tools}
    parallel = doc.get("parallel_tool_calls") is None or get_bool(doc, "parallel_tool_calls")
    schema, strict = _format(doc.get("text"))
    return OutputRules(check_tools(tools, "tools"), _tool_choice(doc.get("tool_choice"), names, parallel),
                       schema, schema_field="text", schema_strict=strict)  # fmt: skip


def _tool_choice(raw: Any, names: set[str], parallel: bool) -> ToolChoice:
    name = raw.get("name") if isinstance(raw, dict) and raw.get("type") == "function" else None
    return tool_choice_of(raw, names, parallel, name, "{type: 'function', name: ...}", "tool_choice.name")


def _format(raw: Any) -> tuple[dict[str, Any] | None, bool]:
    """`text.format`: plain text (None), any JSON object, or JSON matching a schema; and whether
    it is strict."""
    if raw is None:
        return None, False
    if not isinstance(raw, dict):
        raise ApiError(400, "text: must be an object", param="text")
    reject_unknown(raw, {"format", "verbosity"}, {}, where="text.")
    fmt = raw.get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None, False
    if kind == "json_object":
        return {"type": "object"}, False
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        reject_unknown(fmt, {"type", "name", "description", "schema", "strict"}, {}, where="text.format.")
        get_str(fmt, "name", required=True, where="text.format.")
        return schema_object(fmt.get("schema"), "text.format.schema", "text"), strict_flag(fmt, "text.format.", "text")
    raise ApiError(400, "text.format.type: must be 'text', 'json_object' or 'json_schema'", param="text")


def _reasoning(raw: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """`reasoning`: its effort as the chat template reads it, and what the response echoes."""
    if raw is None:
        return {}, None
    if not isinstance(raw, dict):
        raise ApiError(400, "reasoning: must be an object", param="reasoning")
    reject_unknown(raw, {"effort", "summary", "generate_summary"}, {}, where="reasoning.")
    for key in ("summary", "generate_summary"):  # a summary is asked for; the thought is given whole instead
        if raw.get(key) not in (None, "auto", "concise", "detailed"):
            raise ApiError(400, f"reasoning.{key}: must be 'auto', 'concise' or 'detailed'", param="reasoning")
    return reasoning_of(raw.get("effort"), "reasoning.effort"), {"effort": raw.get("effort"), "summary": None}


# What `include` may ask for: the answer's log probabilities; and reasoning items fit to send back
# (each carries its thought as text: this server encrypts nothing, so it asks nothing more).
_INCLUDES = ("message.output_text.logprobs", "reasoning.encrypted_content")


def _logprobs(doc: dict[str, Any]) -> int | None:
    """The answer's log probabilities (`include`), with `top_logprobs` alternatives at each token;
    None where not asked for."""
    include = doc.get("include") or []
    if not isinstance(include, list) or any(item not in _INCLUDES for item in include):
        raise ApiError(400, f"include: this server can include {', '.join(_INCLUDES)} (not {include!r})",
                       param="include")  # fmt: skip
    top = get_int(doc, "top_logprobs", minimum=0)  # at most 20: the request checks it, as for chat
    if "message.output_text.logprobs" in include:
        return top or 0
    if top:
        raise ApiError(400, "top_logprobs: needs include: ['message.output_text.logprobs']", param="top_logprobs")
    return None


def parse_request(doc: dict[str, Any], served: Sequence[str], history: Sequence[dict[str, Any]] = ()) -> ResponsesCall:
    """`history`: the items of the conversation `previous_response_id` or `conversation` continues."""
    reject_unknown(doc, _KNOWN, _UNSUPPORTED)
    common = common_fields(doc, served)  # model, sampling, stream (the keys it reads beyond ours are refused above)
    logprobs = _logprobs(doc)
    if doc.get("truncation") not in (None, "disabled", "auto"):
        raise ApiError(400, "truncation: must be 'disabled' or 'auto'", param="truncation")
    check_hints(doc, HINTS)
    get_int(doc, "max_tool_calls", minimum=1)  # it counts calls of built-in tools, which this server has none of
    items = input_items(doc)
    system, messages = _conversation(doc, [*history, *items])
    if not messages:
        raise ApiError(400, "input: needs at least one user message", param="input")
    max_tokens = get_int(doc, "max_output_tokens", minimum=1)
    template, reasoning = _reasoning(doc.get("reasoning"))
    request = GenerationRequest(messages=messages, system=system, max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
                                output=_tools(doc), logprobs=logprobs, **template, **common.sampling)  # fmt: skip
    echo = {
        "instructions": doc.get("instructions"),
        "max_output_tokens": max_tokens,
        "metadata": doc.get("metadata") or {},
        "parallel_tool_calls": request.output.choice.parallel,
        "temperature": doc.get("temperature", 1.0),
        "top_p": doc.get("top_p", 1.0),
        "tool_choice": doc.get("tool_choice", "auto"),
        "tools": doc.get("tools") or [],
        "text": {"format": (doc.get("text") or {}).get("format") or {"type": "text"}},
        "truncation": doc.get("truncation") or "disabled",
        "reasoning": reasoning,
        "store": doc.get("store") is not False,
        "previous_response_id": doc.get("previous_response_id"),
        "conversation": {"id": conversation} if (conversation := conversation_id(doc)) else None,
        "user": doc.get("user"),
    }
    return ResponsesCall(request, common.stream, common.model, echo_fields=echo,
                         input_items=[_listed(item) for item in items], previous=get_str(doc, "previous_response_id"),
                         store=bool(echo["store"]), conversation=conversation)  # fmt: skip


def _usage(done: Finished) -> dict[str, Any]:
    return {"input_tokens": done.input_tokens, "input_tokens_details": {"cached_tokens": done.trace.reused_tokens},
            "output_tokens": done.output_tokens, "output_tokens_details": {"reasoning_tokens": done.thought_tokens},
            "total_tokens": done.input_tokens + done.output_tokens}  # fmt: skip


Entries = list[dict[str, Any]]  # log probabilities, each token's as Chat Completions gives it (logprob_entry)


def _message_item(item_id: str, text: str, status: str, logprobs: Entries | None = None) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [_text_part(text, logprobs)] if status == "completed" or text else []}  # fmt: skip


def _text_part(text: str, logprobs: Entries | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def _reasoning_item(item_id: str, thought: str, status: str) -> dict[str, Any]:
    """A reasoning model's thought, whole (no summary is made of it)."""
    content = [_thought_part(thought)] if status == "completed" or thought else []
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [], "content": content}


def _thought_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def _call_item(call: CallOut, status: str) -> dict[str, Any]:
    """A function call item; one whose arguments max_output_tokens cut off is `incomplete`."""
    if status == "completed" and call.input() is None:
        status = "incomplete"
    return {"type": "function_call", "id": _call_item_id(call), "call_id": call.id,
            "name": call.name, "arguments": call.arguments, "status": status}  # fmt: skip


def _call_item_id(call: CallOut) -> str:
    return "fc_" + call.id.removeprefix("call_")


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def response(response_id: str, created: int, model: str, call: ResponsesCall, output: list[dict[str, Any]],
             done: Finished | None) -> dict[str, Any]:  # fmt: skip
    """The response object; `done` None while it is still being generated (the stream's first events)."""
    status = "in_progress" if done is None else "incomplete" if done.stop_reason == "max_tokens" else "completed"
    return {"id": response_id, "object": "response", "created_at": created, "status": status,
            "error": None, "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": model, "output": output, "usage": None if done is None else _usage(done),
            **call.echo_fields}  # fmt: skip


# The output items that carry text, by kind: their id prefix, item and content part, the prefix of
# their delta and done events, and whether those events carry the text's log probabilities.
_TEXT_ITEMS: dict[str, tuple[str, Callable[..., dict[str, Any]], Callable[..., dict[str, Any]], str, bool]] = {
    "message": ("msg_", _message_item, _text_part, "response.output_text", True),
    "reasoning": ("rs_", _reasoning_item, _thought_part, "response.reasoning_text", False),
}  # fmt: skip


@dataclass
class _Writing:
    kind: str  # of _TEXT_ITEMS
    id: str
    parts: list[str] = field(default_factory=list)
    logprobs: Entries = field(default_factory=list)  # of the text written so far


class ResponseStream:
    """Engine events -> the Responses API's typed events: the response created, an output item
    (the message, then each function call) added, filled by deltas and done, then the response
    completed (or incomplete, at max_output_tokens) with its whole output."""

    content_type = b"text/event-stream; charset=utf-8"  # server-sent events

    def __init__(self, response_id: str, model: str, call: ResponsesCall) -> None:
        self.id, self.model, self.call = response_id, model, call
        self.created = int(time.time())
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # the items done so far, for the final event
        self.writing: _Writing | None = None  # the message or reasoning item being written
        self.open_call: CallOut | None = None
        self.pending: Entries = []  # log probabilities of tokens whose text has not been written yet
        self.final: dict[str, Any] | None = None  # the response as the last event gives it

    def choice(self, index: int) -> Self:
        return self  # one answer per response (no n)

    def _event(self, kind: str, **fields: Any) -> bytes:
        doc = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(doc, ensure_ascii=False)}\n\n".encode()

    def _index(self) -> int:
        return len(self.output)  # the item being written comes after those done

    def start(self) -> bytes:
        snapshot = response(self.id, self.created, self.model, self.call, [], None)
        return (self._event("response.created", response=snapshot)
                + self._event("response.in_progress", response=snapshot))  # fmt: skip

    def thought(self, text: str) -> bytes:
        return self._write("reasoning", text)

    def delta(self, text: str) -> bytes:
        return self._write("message", text)

    def _write(self, kind: str, text: str) -> bytes:
        """Text into the item of `kind` being written, opened first (and the item before it done)."""
        prefix, make_item, make_part, events, scored = _TEXT_ITEMS[kind]
        out = b""
        if self.writing is None or self.writing.kind != kind:
            out += self._close()
            self.writing = _Writing(kind, _new_id(prefix))
            out += self._event("response.output_item.added", output_index=self._index(),
                               item=make_item(self.writing.id, "", "in_progress"))  # fmt: skip
            out += self._event("response.content_part.added", item_id=self.writing.id, output_index=self._index(),
                               content_index=0, part=make_part(""))  # fmt: skip
        self.writing.parts.append(text)
        extra: dict[str, Any] = {}
        if scored:  # the tokens this text came from (a token's text may be held back, as before a stop sequence)
            extra["logprobs"], self.pending = self.pending, []
            self.writing.logprobs += extra["logprobs"]
        return out + self._event(f"{events}.delta", item_id=self.writing.id, output_index=self._index(),
                                 content_index=0, delta=text, **extra)  # fmt: skip

    def _close(self) -> bytes:
        """The item being written, done."""
        out = b""
        if self.writing is not None:
            _, make_item, make_part, events, scored = _TEXT_ITEMS[self.writing.kind]
            item_id, text = self.writing.id, "".join(self.writing.parts)
            scores = (self.writing.logprobs,) if scored else ()  # the part's and item's, where the kind has them
            at = self._index()
            extra = {"logprobs": self.writing.logprobs} if scored else {}
            out += self._event(f"{events}.done", item_id=item_id, output_index=at, content_index=0, text=text,
                               **extra)  # fmt: skip
            out += self._event("response.content_part.done", item_id=item_id, output_index=at, content_index=0,
                               part=make_part(text, *scores))  # fmt: skip
            item = make_item(item_id, text, "completed", *scores)
            out += self._event("response.output_item.done", output_index=at, item=item)
            self.output.append(item)
            self.writing = None
        if self.open_call is not None:
            item = _call_item(self.open_call, "completed")
            at = self._index()
            out += self._event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                               name=item["name"], arguments=item["arguments"])  # fmt: skip
            out += self._event("response.output_item.done", output_index=at, item=item)
            self.output.append(item)
            self.open_call = None
        return out

    def call_start(self, call: CallOut) -> bytes:
        out = self._close()
        self.open_call = call
        return out + self._event("response.output_item.added", output_index=self._index(),
                                 item=_call_item(call, "in_progress"))  # fmt: skip

    def call_arguments(self, call: CallOut, piece: str) -> bytes:
        return self._event("response.function_call_arguments.delta", item_id=_call_item_id(call),
                           output_index=self._index(), delta=piece)  # fmt: skip

    def logprob(self, token: TokenLogprob) -> bytes:
        self.pending.append(logprob_entry(token))  # sent with the text it makes (its delta event)
        return b""

    def prompt_logprobs(self, scores: PromptLogprobs) -> bytes:
        return b""  # (never asked for: a response's input is no plain prompt)

    def debug(self, lines: list[str]) -> bytes:
        return debug_comment(lines)

    def finish_choice(self, done: Finished) -> bytes:
        return self._close()

    def end(self, *choices: Finished) -> bytes:
        done = choices[0]
        final = self.final = response(self.id, self.created, self.model, self.call, copy.deepcopy(self.output), done)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return self._event(kind, response=final)

    def error(self, err: ApiError) -> bytes:
        code = "server_error" if err.status >= 500 else "invalid_request_error"
        return self._event("error", code=code, message=err.message, param=err.param)


class ResponsesDialect(OpenAIDialect):
    """`/v1/responses`: input items in, output items out."""

    def parse(self, doc: dict[str, Any], served: Sequence[str]) -> Call:
        return parse_request(doc, served)

    def response(self, model: str, call: Call, choices: Sequence[tuple[Answer, Finished]]) -> dict[str, Any]:
        assert isinstance(call, ResponsesCall)
        ((answer, done),) = choices
        output = [_reasoning_item(_new_id("rs_"), answer.thought, "completed")] if answer.thought else []
        logprobs = [logprob_entry(t) for t in answer.logprobs or []]
        output += [_message_item(_new_id("msg_"), answer.text, "completed", logprobs)] if answer.text else []
        output += [_call_item(c, "completed") for c in answer.calls]
        return response(_new_id("resp_"), int(time.time()), model, call, output, done)

    def stream(self, model: str, input_tokens: int, call: Call) -> ResponseStream:
        assert isinstance(call, ResponsesCall)
        return ResponseStream(_new_id("resp_"), model, call)


RESPONSES = ResponsesDialect()
