"""OpenAI Chat Completions: JSON -> GenerationRequest, engine events -> JSON and SSE chunks."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

from appliance.api.dialect import Call, ModelInfo
from appliance.api.dialect import StreamEncoder as Encoder
from appliance.api.errors import ApiError, not_served
from appliance.api.fields import (
    Hint,
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
    chat_turns,
    check_tools,
    make_tool,
    new_call_id,
    past_calls,
    schema_object,
    strict_flag,
    tool_items,
)
from appliance.engine import ContextOverflow, Finished, GenerationRequest, Message
from appliance.engine.request import LOGIT_BIAS, MAX_LOGIT_BIAS, PromptLogprobs, TokenLogprob
from appliance.engine.tools import OutputRules, Tool, ToolChoice, choice_rule, regex_rule

# status -> (OpenAI error type, code)
_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None), 401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "permission_denied"), 404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"), 413: ("invalid_request_error", "request_too_large"),
    425: ("invalid_request_error", "too_early"), 429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", None), 503: ("server_error", "not_ready"), 529: ("server_error", "overloaded"),
}  # fmt: skip

# Accepted and checked (fields.check_hints), shared with the Responses API: none changes the answer.
HINTS: dict[str, Hint] = {
    "user": str, "safety_identifier": str, "metadata": dict, "store": bool,
    "service_tier": ("auto", "default", "flex", "scale", "priority", "fast"),  # this server has one tier
    "prompt_cache_key": str, "prompt_cache_retention": ("in_memory", "24h"), "prompt_cache_options": dict,
}  # fmt: skip
# verbosity: a hint at the answer's length (the Responses API's text.verbosity); the model answers as it does.
_HINTS: dict[str, Hint] = {**HINTS, "verbosity": ("low", "medium", "high")}
# vLLM's structured outputs, as its users send them through the OpenAI SDK's extra_body: the older
# guided_* fields (the kind each asks for), and the newer structured_outputs object (its keys the kinds).
GUIDED = {"guided_json": "json", "guided_choice": "choice", "guided_regex": "regex"}
_KNOWN = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed", "n",
          "stream", "stream_options", "frequency_penalty", "presence_penalty", "logprobs", "tools", "tool_choice",
          "parallel_tool_calls", "response_format", "top_k", "min_p", "repetition_penalty", "top_logprobs",
          "reasoning_effort", "modalities", "logit_bias", "chat_template_kwargs", "min_tokens", "ignore_eos",
          "structured_outputs", *_HINTS, *GUIDED}  # fmt: skip
_UNSUPPORTED = {
    "moderation": "moderation is not supported by this server",
    "functions": "the legacy functions field is not supported by this server (use tools)",
    "function_call": "the legacy function_call field is not supported by this server (use tool_choice)",
    "audio": "audio output is not supported by this server",
    "prediction": "predicted outputs are not supported by this server",
    "web_search_options": "web search is not supported by this server",
}
_ASSISTANT_UNSUPPORTED = {"audio": "audio is not supported by this server",
                          "function_call": "the legacy function_call is not supported by this server (use tool_calls)"}
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "user"}
DEFAULT_MAX_TOKENS = 1024
MAX_CHOICES = 8  # n: each choice takes a slot of its own
MAX_GUIDED_CHOICES = 256
MAX_GUIDED_REGEX_CHARS = 4096


def _messages(doc: dict[str, Any]) -> tuple[str | None, tuple[Message, ...]]:
    if doc.get("messages") is None:
        raise ApiError(400, "messages: field required", param="messages")
    return chat_turns(doc["messages"], _turn)


def _turn(m: dict[str, Any], where: str) -> Message:
    role = m.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise ApiError(400, f"{where}.role: must be one of {', '.join(_ROLES)}", param="messages")
    if role == "tool":
        reject_unknown(m, {"role", "content", "tool_call_id"}, {}, where=f"{where}.")
        get_str(m, "tool_call_id", required=True, where=f"{where}.")
        text = text_content(m.get("content", ""), f"{where}.content") if m.get("content") else ""
        return Message("user", "", results=((text, False),))
    if role == "assistant":
        # An earlier thought (reasoning_content, as the SDK echoes a message back) goes to the template;
        # a message sent back as the SDK dumps it (model_dump()) has annotations and unset fields too.
        reject_unknown(m, {"role", "content", "name", "tool_calls", "refusal", "reasoning_content", "reasoning",
                           "annotations"}, _ASSISTANT_UNSUPPORTED, where=f"{where}.")  # fmt: skip
        return _assistant_turn(m, where)
    reject_unknown(m, {"role", "content", "name"}, {}, where=f"{where}.")
    get_str(m, "name", where=f"{where}.")
    if m.get("content") is None:
        raise ApiError(400, f"{where}.content: field required", param="messages")
    return Message(_ROLES[role], text_content(m["content"], f"{where}.content"))


def _assistant_turn(m: dict[str, Any], where: str) -> Message:
    """An assistant turn as the model wrote it: its text, then its tool calls."""
    get_str(m, "name", where=f"{where}.")
    content = m.get("content")
    text = text_content(content, f"{where}.content") if content not in (None, "", []) else ""
    past = past_calls(m.get("tool_calls"), where)
    if not past and content is None:
        raise ApiError(400, f"{where}.content: field required (or tool_calls)", param="messages")
    # The thought as DeepSeek's API and llama.cpp's server name it, or as vLLM's newer releases and OpenRouter do.
    thought = get_str(m, "reasoning_content", where=f"{where}.") or get_str(m, "reasoning", where=f"{where}.")
    return Message("assistant", text, tuple(past), thought=thought or "")


# OpenAI's reasoning efforts: the lowest two ask a reasoning model to answer without a thought.
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def reasoning_of(effort: Any, param: str) -> dict[str, Any]:
    """A reasoning effort as the chat template reads it (GenerationRequest's keyword arguments):
    `enable_thinking` (off for the lowest two), and `reasoning_effort` as gpt-oss's three levels."""
    if effort is None:
        return {}
    if effort not in EFFORTS:
        raise ApiError(400, f"{param}: must be one of {', '.join(EFFORTS)}", param=param)
    level = {"none": "low", "minimal": "low", "xhigh": "high"}.get(effort, effort)
    return {"thinking": effort not in ("none", "minimal"), "reasoning_effort": level}


def function_tools(doc: dict[str, Any]) -> OutputRules:
    """The request's function tools, tool_choice and response_format (Ollama's chat reads its tools so too)."""
    tools: list[Tool] = []
    for where, t in tool_items(doc):
        if t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise ApiError(400, f"{where}: must be {{type: 'function', function: {{...}}}} (other tool types are "
                           "not supported by this server)", param="tools")  # fmt: skip
        reject_unknown(t, {"type", "function"}, {}, where=f"{where}.")
        fn = t["function"]
        reject_unknown(fn, {"name", "description", "parameters", "strict"}, {}, where=f"{where}.function.")
        tools.append(make_tool(fn.get("name"), fn.get("description"), fn.get("parameters"), f"{where}.function",
                               "tools", strict_flag(fn, f"{where}.function.", "tools")))  # fmt: skip
    names = {t.name for t in tools}
    parallel = doc.get("parallel_tool_calls") is None or get_bool(doc, "parallel_tool_calls")  # default: allowed
    choice = _tool_choice(doc.get("tool_choice"), names, parallel)
    schema, strict = _response_format(doc.get("response_format"))
    return OutputRules(check_tools(tools, "tools"), choice, schema, schema_strict=strict)


def _tool_choice(raw: Any, names: set[str], parallel: bool) -> ToolChoice:
    fn = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    return tool_choice_of(raw, names, parallel, name, "{type: 'function', function: {name: ...}}",
                          "tool_choice.function.name")  # fmt: skip


def tool_choice_of(raw: Any, names: set[str], parallel: bool, name: Any, shape: str, name_field: str) -> ToolChoice:
    """OpenAI's tool_choice in either of its APIs: 'auto', 'none', 'required', or the one function
    `name` (found by the caller where its API puts it: `shape`, `name_field` in errors)."""
    if raw is None:
        return ToolChoice(parallel=parallel)
    if raw in ("auto", "none", "required"):
        if raw == "required" and not names:
            raise ApiError(400, "tool_choice: 'required' needs tools", param="tool_choice")
        return ToolChoice(raw, parallel=parallel)
    if isinstance(raw, dict) and raw.get("type") == "allowed_tools":
        return _allowed_tools(raw, names, parallel)
    if not isinstance(name, str):
        raise ApiError(400, f"tool_choice: must be 'auto', 'none', 'required', {shape} or "
                       "{type: 'allowed_tools', ...}", param="tool_choice")  # fmt: skip
    if name not in names:
        raise ApiError(400, f"{name_field}: {name!r} is not one of the tools", param="tool_choice")
    return ToolChoice("tool", name, parallel=parallel)


def _allowed_tools(raw: dict[str, Any], names: set[str], parallel: bool) -> ToolChoice:
    """{type: 'allowed_tools'}: calls of some of the tools only, 'auto' or 'required'; nested in
    `allowed_tools` with functions as Chat Completions writes them, flat as the Responses API does."""
    nested = "allowed_tools" in raw
    spec = raw["allowed_tools"] if nested else raw
    where = "tool_choice.allowed_tools." if nested else "tool_choice."
    if not isinstance(spec, dict):
        raise ApiError(400, f"{where[:-1]}: must be an object", param="tool_choice")
    reject_unknown(raw, {"type", "allowed_tools"} if nested else {"type", "mode", "tools"}, {}, where="tool_choice.")
    if nested:
        reject_unknown(spec, {"mode", "tools"}, {}, where=where)
    mode = spec.get("mode")
    if mode not in ("auto", "required"):
        raise ApiError(400, f"{where}mode: must be 'auto' or 'required'", param="tool_choice")
    listed = spec.get("tools")
    if not isinstance(listed, list) or not listed:
        raise ApiError(400, f"{where}tools: must be a non-empty list of tools", param="tool_choice")
    allowed = []
    for i, tool in enumerate(listed):
        is_function = isinstance(tool, dict) and tool.get("type") == "function"
        fn = tool.get("function") if is_function and nested else tool
        name = fn.get("name") if is_function and isinstance(fn, dict) else None
        if name not in names:
            raise ApiError(400, f"{where}tools[{i}]: must be a function of the request's tools ({name!r} is not)",
                           param="tool_choice")  # fmt: skip
        allowed.append(name)
    return ToolChoice(mode, parallel=parallel, allowed=tuple(allowed))


def _response_format(raw: Any) -> tuple[dict[str, Any] | None, bool]:
    """The answer's JSON schema (None: free text) and whether it is strict."""
    if raw is None:
        return None, False
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return None, False
    if kind == "json_object":
        return {"type": "object"}, False
    if kind == "json_schema":
        spec = raw.get("json_schema")
        if not isinstance(spec, dict):
            raise ApiError(400, "response_format.json_schema: must be an object", param="response_format")
        where = "response_format.json_schema."
        reject_unknown(spec, {"name", "description", "schema", "strict"}, {}, where=where)
        get_str(spec, "name", required=True, where=where)
        return (schema_object(spec.get("schema", {}), f"{where}schema", "response_format"),
                strict_flag(spec, where, "response_format"))  # fmt: skip
    raise ApiError(400, "response_format.type: must be 'text', 'json_object' or 'json_schema'",
                   param="response_format")  # fmt: skip


@dataclass(frozen=True)
class Common:
    """What Chat Completions and Completions share: sampling, stops, streaming, n and the model."""

    sampling: dict[str, Any]  # GenerationRequest's keyword arguments
    stream: bool
    include_usage: bool
    model: str
    n: int = 1  # choices: answers sampled for the one prompt


def common_fields(doc: dict[str, Any], served: Sequence[str]) -> Common:
    model = get_str(doc, "model", required=True)
    assert model is not None
    if model not in served:
        raise ApiError(404, not_served(model, served), param="model")
    get_str(doc, "user")
    n = get_int(doc, "n", minimum=1) or 1
    if n > MAX_CHOICES:
        raise ApiError(400, f"n: at most {MAX_CHOICES} choices per request", param="n")
    metadata = doc.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise ApiError(400, "metadata: must be an object", param="metadata")
    stop = doc.get("stop")
    if isinstance(stop, str):
        stops: tuple[str, ...] = (stop,)
    elif stop is None:
        stops = ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
        stops = tuple(stop)
    else:
        raise ApiError(400, "stop: must be a string or a list of at most 4 strings", param="stop")
    if not all(stops):  # named here, in this API's own terms (the engine would say stop_sequences)
        raise ApiError(400, "stop: a stop sequence must not be empty", param="stop")
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
    sampling = dict(
        temperature=get_number(doc, "temperature", 0.0, 2.0),
        top_p=get_number(doc, "top_p", 0.0, 1.0),
        top_k=get_int(doc, "top_k", minimum=0),
        min_p=get_number(doc, "min_p", 0.0, 1.0) or 0.0,
        frequency_penalty=get_number(doc, "frequency_penalty", -2.0, 2.0) or 0.0,
        presence_penalty=get_number(doc, "presence_penalty", -2.0, 2.0) or 0.0,
        repetition_penalty=get_number(doc, "repetition_penalty", 0.01, 10.0) or 1.0,
        logit_bias=logit_bias(doc),
        stop_sequences=stops,
        seed=get_int(doc, "seed"),
        # vLLM's, which benchmark clients send for answers of a set length (vllm bench serve, genai-perf).
        min_tokens=get_int(doc, "min_tokens", minimum=0) or 0,
        ignore_eos=get_bool(doc, "ignore_eos"),
    )
    return Common(sampling, stream, include_usage, model, n)


def logit_bias(doc: dict[str, Any]) -> tuple[tuple[int, float], ...]:
    """`logit_bias`, an object from token ids (as the model's tokenizer numbers them, written as
    strings) to a bias from -100 to 100 added to the token's logit; an id written twice ("7" and
    "07") keeps its last bias."""
    raw = doc.get("logit_bias")
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ApiError(400, "logit_bias: must be an object mapping token ids to biases", param="logit_bias")
    if len(raw) > MAX_LOGIT_BIAS:
        raise ApiError(400, f"logit_bias: at most {MAX_LOGIT_BIAS} tokens may be biased", param="logit_bias")
    biases: dict[int, float] = {}
    for key, value in raw.items():
        if not (key.isascii() and key.isdigit()) or len(key) > 12:
            raise ApiError(400, f"logit_bias: {key!r} is not a token id", param="logit_bias")
        if (isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
                or not -LOGIT_BIAS <= value <= LOGIT_BIAS):  # fmt: skip
            raise ApiError(400, f"logit_bias[{key!r}]: must be a number from -100 to 100", param="logit_bias")
        biases[int(key)] = float(value)
    return tuple(biases.items())


def parse_request(doc: dict[str, Any], served: Sequence[str]) -> tuple[GenerationRequest, Common]:
    """Returns the request, and what Chat Completions shares with Completions (whether to stream,
    whether to send a usage chunk, the model)."""
    reject_unknown(doc, _KNOWN, _UNSUPPORTED)
    check_hints(doc, _HINTS)
    modalities = doc.get("modalities")
    if modalities is not None and (not isinstance(modalities, list) or set(modalities) - {"text"}):
        raise ApiError(400, "modalities: only text output is supported by this server (send [\"text\"] or "
                       "leave it out)", param="modalities")  # fmt: skip
    common = common_fields(doc, served)
    system, messages = _messages(doc)
    top = get_int(doc, "top_logprobs", minimum=0)
    if top is not None and not get_bool(doc, "logprobs"):
        raise ApiError(400, "top_logprobs: needs logprobs: true", param="top_logprobs")
    max_tokens = get_int(doc, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = get_int(doc, "max_tokens", minimum=1)
    request = GenerationRequest(
        messages=messages,
        system=system,
        max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
        logprobs=(top or 0) if get_bool(doc, "logprobs") else None,
        output=guided_output(doc, function_tools(doc)),
        **{**template_kwargs(doc), **reasoning_of(doc.get("reasoning_effort"), "reasoning_effort")},
        **common.sampling,
    )
    return request, common


def guided_output(doc: dict[str, Any], rules: OutputRules) -> OutputRules:
    """vLLM's structured outputs on top of `rules`: a JSON schema (as JSON text or an object), one
    of given strings, or a regular expression, the answer held to it by the grammar as
    response_format's schema is."""
    asked = [(name, kind, doc[name]) for name, kind in GUIDED.items() if doc.get(name) is not None]
    structured = doc.get("structured_outputs")
    if structured is not None:
        if not isinstance(structured, dict):
            raise ApiError(400, "structured_outputs: must be an object", param="structured_outputs")
        kinds = ("json", "choice", "regex")
        reject_unknown(structured, set(kinds), {
            "grammar": "a grammar of the client's is not taken here (json, choice or regex)",
            "json_object": "send response_format {type: 'json_object'}",
            "structural_tag": "structural tags are not taken here (json, choice or regex)"},
            where="structured_outputs.")  # fmt: skip
        asked += [(f"structured_outputs.{k}", k, structured[k]) for k in kinds if structured.get(k) is not None]
    if not asked:
        return rules
    if len(asked) > 1 or rules.json_schema is not None:
        raise ApiError(400, f"{asked[-1][0]}: one of response_format, guided_json, guided_choice, guided_regex and "
                       "structured_outputs at a time", param=asked[-1][0].split(".")[0])  # fmt: skip
    (name, kind, value), param = asked[0], asked[0][0].split(".")[0]
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise ApiError(400, f"{name}: must be a JSON schema (an object, or JSON text of one)",
                               param=param) from None  # fmt: skip
        return dataclasses.replace(rules, json_schema=schema_object(value, name, param), schema_field=param)
    if kind == "choice":
        if (not isinstance(value, list) or not 0 < len(value) <= MAX_GUIDED_CHOICES
                or not all(isinstance(v, str) and v for v in value)):  # fmt: skip
            raise ApiError(400, f"{name}: must be a list of 1 to {MAX_GUIDED_CHOICES} non-empty strings", param=param)
        return dataclasses.replace(rules, answer_rule=choice_rule(value), schema_field=param)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_GUIDED_REGEX_CHARS:
        raise ApiError(400, f"{name}: must be a regular expression of 1 to {MAX_GUIDED_REGEX_CHARS} characters",
                       param=param)  # fmt: skip
    return dataclasses.replace(rules, answer_rule=regex_rule(value), schema_field=param)


def template_kwargs(doc: dict[str, Any]) -> dict[str, Any]:
    """`chat_template_kwargs` (vLLM's, SGLang's and llama.cpp's servers take it: Qwen3's users send
    `enable_thinking`) as GenerationRequest's keyword arguments: `enable_thinking` is the thinking
    switch, the rest variables for the template as they are."""
    raw = doc.get("chat_template_kwargs")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ApiError(400, "chat_template_kwargs: must be an object", param="chat_template_kwargs")
    out: dict[str, Any] = {"template_variables": tuple((k, v) for k, v in raw.items() if k != "enable_thinking")}
    if raw.get("enable_thinking") is not None:
        out["thinking"] = get_bool(raw, "enable_thinking")
    return out


def finish_reason(done: Finished) -> str:
    return {"max_tokens": "length", "tool_use": "tool_calls"}.get(done.stop_reason, "stop")


def new_completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def _call(call: CallOut) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def response(completion_id: str, model: str, choices: Sequence[tuple[Answer, Finished]]) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [_choice(i, answer, done) for i, (answer, done) in enumerate(choices)],
        "usage": usage(*(done for _, done in choices)),
    }


def _choice(index: int, answer: Answer, done: Finished) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.text or (None if answer.calls else ""),
                               "refusal": None}  # fmt: skip
    if answer.thought:  # as llama.cpp's server, vLLM and DeepSeek's API return a thought
        message["reasoning_content"] = answer.thought
    if answer.calls:
        message["tool_calls"] = [_call(c) for c in answer.calls]
    return {"index": index, "message": message, "finish_reason": finish_reason(done),
            "logprobs": None if answer.logprobs is None else {
                "content": [logprob_entry(t) for t in answer.logprobs], "refusal": None}}  # fmt: skip


def logprob_entry(token: TokenLogprob) -> dict[str, Any]:
    def one(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {**one(token.token, token.logprob), "top_logprobs": [one(t, lp) for t, lp in token.top]}


def usage(*choices: Finished, per_prompt: int | None = None) -> dict[str, Any]:
    """Each prompt counted once, however many choices were sampled from it: the choices in order,
    `per_prompt` of each prompt (the Completions API's several prompts), by default all of one."""
    firsts = choices[:: per_prompt or len(choices)]
    prompt, completion = sum(done.input_tokens for done in firsts), sum(done.output_tokens for done in choices)
    thought = sum(done.thought_tokens for done in choices)
    # cached_tokens: the prompt's tokens the prefix pool held (not prefilled again), part of prompt_tokens.
    cached = sum(done.trace.reused_tokens for done in firsts)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": thought}}  # fmt: skip


class StreamEncoder:
    """Engine events -> Chat Completions chunks, then `[DONE]` (Completions' chunks subclass it)."""

    OBJECT = "chat.completion.chunk"
    content_type = b"text/event-stream; charset=utf-8"  # server-sent events

    def __init__(self, completion_id: str, model: str, include_usage: bool) -> None:
        self.id, self.model, self.include_usage = completion_id, model, include_usage
        self.created = int(time.time())
        self.calls = 0
        self.index = 0  # the choice this encoder writes
        self.per_prompt: int | None = None  # choices of each prompt (several prompts: the Completions API's)

    def choice(self, index: int) -> Self:
        """The encoder of another choice of the same completion (n > 1)."""
        other = copy.copy(self)
        other.index, other.calls = index, 0
        return other

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        doc = {"id": self.id, "object": self.OBJECT, "created": self.created, "model": self.model,
               "choices": choices, **extra}  # fmt: skip
        return f"data: {json.dumps(doc, ensure_ascii=False)}\n\n".encode()

    def start(self) -> bytes:
        return self._chunk([{"index": self.index, "delta": {"role": "assistant", "content": ""},
                             "finish_reason": None}])  # fmt: skip

    def delta(self, text: str) -> bytes:
        return self._chunk([{"index": self.index, "delta": {"content": text}, "finish_reason": None}])

    def thought(self, text: str) -> bytes:
        return self._chunk([{"index": self.index, "delta": {"reasoning_content": text}, "finish_reason": None}])

    def call_start(self, call: CallOut) -> bytes:
        self.calls += 1
        first = {"index": self.calls - 1, **_call(call)}
        return self._chunk([{"index": self.index, "delta": {"tool_calls": [first]}, "finish_reason": None}])

    def call_arguments(self, call: CallOut, piece: str) -> bytes:
        more = {"index": self.calls - 1, "function": {"arguments": piece}}
        return self._chunk([{"index": self.index, "delta": {"tool_calls": [more]}, "finish_reason": None}])

    def logprob(self, token: TokenLogprob) -> bytes:
        return self._chunk([{"index": self.index, "delta": {},
                             "logprobs": {"content": [logprob_entry(token)], "refusal": None},
                             "finish_reason": None}])  # fmt: skip

    def prompt_logprobs(self, scores: PromptLogprobs) -> bytes:
        return b""  # (never asked for: a chat's prompt is its template's)

    def debug(self, lines: list[str]) -> bytes:
        return debug_comment(lines)

    def _last(self, done: Finished) -> dict[str, Any]:
        """The choice that carries the finish reason."""
        return {"index": self.index, "delta": {}, "finish_reason": finish_reason(done)}

    def finish_choice(self, done: Finished) -> bytes:
        """This choice's last chunk: its finish reason."""
        return self._chunk([self._last(done)])

    def end(self, *choices: Finished) -> bytes:
        """After every choice's last chunk: the usage chunk when asked for, and `[DONE]`."""
        out = self._chunk([], usage=usage(*choices, per_prompt=self.per_prompt)) if self.include_usage else b""
        return out + b"data: [DONE]\n\n"

    def error(self, err: ApiError) -> bytes:
        return b"data: " + error_body(err) + b"\n\n"


def debug_comment(lines: list[str]) -> bytes:
    """The decision trace as an SSE comment: clients that do not ask for it skip it."""
    return b"".join(f": zerolayer-debug {line}\n".encode() for line in lines) + b"\n"


def error_body(err: ApiError) -> bytes:
    kind, code = _ERROR_KINDS.get(err.status, _ERROR_KINDS[500])
    if err.status == 404 and err.param == "model":
        code = "model_not_found"  # as OpenAI names an unknown model
    code = err.code or code
    return json.dumps({"error": {"message": err.message, "type": kind, "param": err.param, "code": code}}).encode()


class OpenAIDialect:
    """Chat Completions (`/v1/chat/completions`, and OpenAI clients on shared paths)."""

    name = "openai"
    busy_status = 429

    def parse(self, doc: dict[str, Any], served: Sequence[str]) -> Call:
        request, common = parse_request(doc, served)
        return Call(request, common.stream, common.model, common.include_usage, n=common.n)

    def response(self, model: str, call: Call, choices: Sequence[tuple[Answer, Finished]]) -> dict[str, Any]:
        return response(new_completion_id(), model, choices)

    def new_call(self, name: str) -> CallOut:
        return CallOut(new_call_id("call_"), name)

    def stream(self, model: str, input_tokens: int, call: Call) -> Encoder:
        return StreamEncoder(new_completion_id(), model, call.include_usage)

    def error_body(self, err: ApiError) -> bytes:
        return error_body(err)

    def overflow(self, exc: ContextOverflow) -> ApiError:
        if exc.prompt_tokens is None or exc.max_tokens is None or exc.limit is None:
            return ApiError(400, str(exc), param=exc.param, code="context_length_exceeded")
        asked = exc.prompt_tokens + exc.max_tokens
        return ApiError(400, f"This model's maximum context length is {exc.limit} tokens. However, you requested "
                        f"{asked} tokens ({exc.prompt_tokens} in the messages, {exc.max_tokens} in the completion). "
                        "Please reduce the length of the messages or completion.", param="messages",
                        code="context_length_exceeded")  # fmt: skip

    def models(self, models: list[ModelInfo]) -> dict[str, Any]:
        return {"object": "list", "data": [self.model(m) for m in models]}

    def model(self, model: ModelInfo) -> dict[str, Any]:
        return {"id": model.name, "object": "model", "created": model.created, "owned_by": "zerolayer"}


OPENAI = OpenAIDialect()
