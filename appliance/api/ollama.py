"""Ollama's API: `/api/chat` and `/api/generate` (JSON -> GenerationRequest, engine events ->
Ollama's JSON, streamed by default as newline-delimited JSON), and the model facts its clients
read first (`/api/tags`, `/api/show`, `/api/version`, `/api/ps`). For the clients written for
Ollama: its own Python and JavaScript libraries, and the tools that speak to it (Open WebUI,
LangChain's ChatOllama). Errors are `{"error": "..."}`, as Ollama's."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Self

from appliance.api.dialect import Call, ModelInfo
from appliance.api.errors import ApiError, not_served
from appliance.api.fields import get_bool, get_int, get_number, get_str, reject_unknown, text_content
from appliance.api.openai import function_tools, logprob_entry, reasoning_of
from appliance.api.tools import Answer, CallOut, chat_turns, new_call_id, past_calls, schema_object
from appliance.engine import ContextOverflow, Finished, GenerationRequest, Message
from appliance.engine.request import MAX_TOP_LOGPROBS, PromptLogprobs, TokenLogprob
from appliance.engine.tools import OutputRules

VERSION = "0.12.0"  # the Ollama API release whose fields these are (what /api/version tells its clients)
LATEST = ":latest"  # Ollama's tag for a model's default; a served name with it is the name
NO_LIMIT = 1 << 20  # num_predict -1: as many tokens as the context leaves (GenerationRequest.fit_context)

# options: what each changes here; those a runtime sets for itself (this box sets them) are let be.
_SAMPLING = {"temperature", "top_p", "top_k", "min_p", "seed", "num_predict", "stop", "repeat_penalty",
             "presence_penalty", "frequency_penalty"}  # fmt: skip
_RUNTIME = {"num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap", "use_mlock", "numa",
            "low_vram", "f16_kv", "vocab_only", "num_keep", "repeat_last_n", "penalize_newline"}  # fmt: skip
# Samplers not built here: refused where they would change the answer, let be at their off values.
_OFF_VALUES = {"mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1, "typical_p": 1.0, "tfs_z": 1.0}
_ROLES = ("system", "user", "assistant", "tool")


def served_name(doc: dict[str, Any], served: Sequence[str]) -> str:
    model = get_str(doc, "model", required=True)
    assert model is not None
    name = model.removesuffix(LATEST)
    if name not in served:
        raise ApiError(404, not_served(model, served), param="model")
    return name


def _options(doc: dict[str, Any]) -> dict[str, Any]:
    """`options` as GenerationRequest's keyword arguments."""
    raw = doc.get("options") or {}
    if not isinstance(raw, dict):
        raise ApiError(400, "options: must be an object", param="options")
    for key, value in raw.items():
        if key in _OFF_VALUES and value is not None and value != _OFF_VALUES[key]:
            raise ApiError(400, f"options.{key}: this sampler is not built here (leave it at "
                           f"{_OFF_VALUES[key]})", param=f"options.{key}")  # fmt: skip
        if key not in _SAMPLING | _RUNTIME | set(_OFF_VALUES):
            raise ApiError(400, f"options.{key}: unknown option", param=f"options.{key}")
    predict = get_int(raw, "num_predict")
    if predict is not None and predict not in (-1, -2) and predict < 1:
        raise ApiError(400, "options.num_predict: -1 (until the context is full), or at least 1",
                       param="options.num_predict")  # fmt: skip
    stop = raw.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "options.stop: must be a list of non-empty strings", param="options.stop")
    seed = get_int(raw, "seed")
    return dict(
        temperature=get_number(raw, "temperature", 0.0, 2.0), top_p=get_number(raw, "top_p", 0.0, 1.0),
        top_k=get_int(raw, "top_k", minimum=0), min_p=get_number(raw, "min_p", 0.0, 1.0) or 0.0,
        seed=None if seed is None or seed < 0 else seed,  # (Ollama's -1: a random seed)
        repetition_penalty=get_number(raw, "repeat_penalty", 0.01, 10.0) or 1.0,
        presence_penalty=get_number(raw, "presence_penalty", -2.0, 2.0) or 0.0,
        frequency_penalty=get_number(raw, "frequency_penalty", -2.0, 2.0) or 0.0,
        stop_sequences=tuple(stop),
        max_tokens=NO_LIMIT if predict is None or predict < 0 else predict, fit_context=predict is None or predict < 0,
    )  # fmt: skip


def _format(doc: dict[str, Any]) -> dict[str, Any] | None:
    """`format`: "json" (any JSON object), a JSON schema, or absent (text)."""
    raw = doc.get("format")
    if raw in (None, ""):
        return None
    if raw == "json":
        return {"type": "object"}
    return schema_object(raw, "format", "format")


def _think(doc: dict[str, Any]) -> dict[str, Any]:
    """`think`: true or false, or a level ("low", "medium", "high") as gpt-oss takes."""
    think = doc.get("think")
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"thinking": think}
    if think not in ("low", "medium", "high"):
        raise ApiError(400, "think: must be true, false, \"low\", \"medium\" or \"high\"", param="think")
    return reasoning_of(think, "think")


def _refuse_used(doc: dict[str, Any], fields: dict[str, str]) -> None:
    for key, why in fields.items():
        if doc.get(key) not in (None, "", [], False):
            raise ApiError(400, f"{key}: {why}", param=key)


def _turn(m: dict[str, Any], where: str) -> Message:
    role = m.get("role")
    if role not in _ROLES:
        raise ApiError(400, f"{where}.role: must be one of {', '.join(_ROLES)}", param="messages")
    reject_unknown(m, {"role", "content", "thinking", "tool_calls", "tool_name", "tool_call_id"},
                   {"images": "images are not read by this server (its models take text)"},
                   where=f"{where}.")  # fmt: skip
    text = text_content(m.get("content") or "", f"{where}.content")
    if role == "tool":
        return Message("user", "", results=((text, False),))
    if role != "assistant":
        return Message(role, text)
    past = past_calls(m.get("tool_calls"), where)
    return Message("assistant", text, past, thought=get_str(m, "thinking", where=f"{where}.") or "")


_COMMON = {"model", "stream", "format", "options", "keep_alive", "think", "logprobs", "top_logprobs"}


def _logprobs(doc: dict[str, Any]) -> int | None:
    """`logprobs` and `top_logprobs` as GenerationRequest.logprobs (alternatives asked for are logprobs asked for)."""
    top = get_int(doc, "top_logprobs", minimum=0)
    if top is not None and top > MAX_TOP_LOGPROBS:
        raise ApiError(400, f"top_logprobs: at most {MAX_TOP_LOGPROBS}", param="top_logprobs")
    return (top or 0) if get_bool(doc, "logprobs") or top else None


def parse_chat(doc: dict[str, Any], served: Sequence[str]) -> Call:
    reject_unknown(doc, _COMMON | {"messages", "tools"}, {})
    model = served_name(doc, served)
    system, messages = chat_turns(doc.get("messages"), _turn)
    tools = function_tools({"tools": doc.get("tools")})
    request = GenerationRequest(messages=messages, system=system, output=_with_format(tools, _format(doc)),
                                logprobs=_logprobs(doc), **_think(doc), **_options(doc))  # fmt: skip
    return Call(request, _stream(doc), model)


def parse_generate(doc: dict[str, Any], served: Sequence[str]) -> Call:
    """A prompt answered through the chat template as a user's message (after `system`), or with
    `raw` as it is, no template."""
    reject_unknown(doc, _COMMON | {"prompt", "system", "raw", "suffix", "images", "template", "context"}, {})
    _refuse_used(doc, {"suffix": "suffix (insertion) is not supported by this server",
                       "images": "images are not read by this server (its models take text)",
                       "template": "the chat template is the firmware's own (send raw: true for a plain prompt)",
                       "context": "a returned context is not continued here (send the conversation to /api/chat)"})
    model = served_name(doc, served)
    prompt = get_str(doc, "prompt") or ""
    if not prompt:
        raise ApiError(400, "prompt: must not be empty", param="prompt")
    system = get_str(doc, "system")
    output = _with_format(OutputRules(), _format(doc))
    if get_bool(doc, "raw"):
        if system:
            raise ApiError(400, "system: a raw prompt has no template to place it in", param="system")
        request = GenerationRequest(messages=(), raw_prompt=prompt, output=output, logprobs=_logprobs(doc),
                                    **_options(doc))  # fmt: skip
    else:
        request = GenerationRequest(messages=(Message("user", prompt),), system=system, output=output,
                                    logprobs=_logprobs(doc), **_think(doc), **_options(doc))  # fmt: skip
    return Call(request, _stream(doc), model)


def preload(doc: dict[str, Any], served: Sequence[str], chat: bool) -> dict[str, Any] | None:
    """Ollama's answer to a request with nothing to answer (no prompt, or no messages), which its
    clients send to load a model before they use it (`ollama run` does): every served model is
    loaded at start here, so it is loaded. None for any other request."""
    if doc.get("messages" if chat else "prompt") not in (None, "", []):
        return None
    model = served_name(doc, served)
    answer: dict[str, Any] = {"model": model, "created_at": _now()}
    answer.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return {**answer, "done": True, "done_reason": "load"}


def _with_format(rules: OutputRules, schema: dict[str, Any] | None) -> OutputRules:
    return rules if schema is None else dataclasses.replace(rules, json_schema=schema)


def _stream(doc: dict[str, Any]) -> bool:
    return doc.get("stream") is None or get_bool(doc, "stream")  # Ollama streams unless told not to


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def done_reason(done: Finished) -> str:
    return "length" if done.stop_reason == "max_tokens" else "stop"


def _figures(done: Finished) -> dict[str, Any]:
    """The end's counts and durations (nanoseconds), as Ollama reports them."""
    prefill, decode = int(done.trace.prefill_ms * 1e6), int(done.trace.decode_ms * 1e6)
    return {"done": True, "done_reason": done_reason(done), "total_duration": prefill + decode, "load_duration": 0,
            "prompt_eval_count": done.input_tokens, "prompt_eval_duration": prefill,
            "eval_count": done.output_tokens, "eval_duration": decode}  # fmt: skip


def _calls(calls: Sequence[CallOut]) -> list[dict[str, Any]]:
    """Calls as Ollama writes them: each function's arguments an object."""
    return [{"id": c.id, "function": {"index": i, "name": c.name, "arguments": json.loads(c.arguments or "{}")}}
            for i, c in enumerate(calls)]  # fmt: skip


class OllamaStream:
    """Engine events -> Ollama's stream: a JSON object a line, a piece of the answer each (with the
    log probabilities of the tokens it came from, where asked for), then the end with its figures.
    A call is sent whole once the answer is over (Ollama sends it complete)."""

    content_type = b"application/x-ndjson"

    def __init__(self, model: str, chat: bool) -> None:
        self.model, self.chat = model, chat
        self.calls: list[CallOut] = []
        self.pending: list[dict[str, Any]] = []  # log probabilities, sent with the text their tokens make

    def choice(self, index: int) -> Self:
        return self  # (Ollama's requests have one answer)

    def _line(self, text: str = "", thought: str = "", calls: list[dict[str, Any]] | None = None,
              **end: Any) -> bytes:  # fmt: skip
        doc: dict[str, Any] = {"model": self.model, "created_at": _now()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thought:
                message["thinking"] = thought
            if calls:
                message["tool_calls"] = calls
            doc["message"] = message
        else:
            doc["response"] = text
            if thought:
                doc["thinking"] = thought
        if self.pending:
            doc["logprobs"], self.pending = self.pending, []
        doc.update(end or {"done": False})
        return json.dumps(doc, ensure_ascii=False).encode() + b"\n"

    def start(self) -> bytes:
        return b""

    def delta(self, text: str) -> bytes:
        return self._line(text)

    def thought(self, text: str) -> bytes:
        return self._line(thought=text)

    def call_start(self, call: CallOut) -> bytes:
        self.calls.append(call)  # its arguments fill in as they arrive
        return b""

    def call_arguments(self, call: CallOut, piece: str) -> bytes:
        return b""

    def logprob(self, token: TokenLogprob) -> bytes:
        self.pending.append(logprob_entry(token))
        return b""

    def prompt_logprobs(self, scores: PromptLogprobs) -> bytes:
        return b""

    def debug(self, lines: list[str]) -> bytes:
        return b""  # (no comment lines in JSON lines: the trace header of a whole answer carries it)

    def finish_choice(self, done: Finished) -> bytes:
        calls = self._line(calls=_calls(self.calls)) if self.calls and self.chat else b""
        return calls + self._line(**_figures(done))

    def end(self, *choices: Finished) -> bytes:
        return b""

    def error(self, err: ApiError) -> bytes:
        return json.dumps({"error": err.message}).encode() + b"\n"


class OllamaDialect:
    """`/api/chat` (chat=True) or `/api/generate`."""

    name = "ollama"
    busy_status = 503  # as Ollama's own full queue ("server busy")

    def __init__(self, chat: bool) -> None:
        self.chat = chat

    def parse(self, doc: dict[str, Any], served: Sequence[str]) -> Call:
        return parse_chat(doc, served) if self.chat else parse_generate(doc, served)

    def response(self, model: str, call: Call, choices: Sequence[tuple[Answer, Finished]]) -> dict[str, Any]:
        answer, done = choices[0]
        doc: dict[str, Any] = {"model": model, "created_at": _now()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": answer.text}
            if answer.thought:
                message["thinking"] = answer.thought
            if answer.calls:
                message["tool_calls"] = _calls(answer.calls)
            doc["message"] = message
        else:
            doc["response"] = answer.text
            if answer.thought:
                doc["thinking"] = answer.thought
        if answer.logprobs is not None:
            doc["logprobs"] = [logprob_entry(t) for t in answer.logprobs]
        return {**doc, **_figures(done)}

    def new_call(self, name: str) -> CallOut:
        return CallOut(new_call_id("call_"), name)

    def stream(self, model: str, input_tokens: int, call: Call) -> OllamaStream:
        return OllamaStream(model, self.chat)

    def error_body(self, err: ApiError) -> bytes:
        return json.dumps({"error": err.message}).encode()

    def overflow(self, exc: ContextOverflow) -> ApiError:
        return ApiError(400, str(exc), param=exc.param)

    def models(self, models: list[ModelInfo]) -> dict[str, Any]:
        """`/api/tags`: the models served."""
        return {"models": [self.model(m) for m in models]}

    def model(self, model: ModelInfo) -> dict[str, Any]:
        stamp = datetime.fromtimestamp(model.created, UTC).isoformat().replace("+00:00", "Z")
        return {"name": model.name, "model": model.name, "modified_at": stamp, "size": 0, "digest": "",
                "details": {"format": "onnx", "family": "", "families": [], "parameter_size": "",
                            "quantization_level": "", "version": model.version}}  # fmt: skip


OLLAMA_CHAT = OllamaDialect(chat=True)
OLLAMA_GENERATE = OllamaDialect(chat=False)


def show(model: ModelInfo, chat_template: str, context_length: int, capabilities: Sequence[str]) -> dict[str, Any]:
    """`/api/show`: what a client reads of a model before it calls it (its context, what it can do)."""
    return {"modelfile": "", "parameters": "", "template": chat_template,
            "details": OLLAMA_CHAT.model(model)["details"],
            "model_info": {"general.architecture": "onnx", "onnx.context_length": context_length},
            "capabilities": list(capabilities), "modified_at": OLLAMA_CHAT.model(model)["modified_at"]}  # fmt: skip


def running(models: list[ModelInfo], context_length: dict[str, int]) -> dict[str, Any]:
    """`/api/ps`: every served model is loaded, for good."""
    return {"models": [{**OLLAMA_CHAT.model(m), "expires_at": "9999-12-31T23:59:59Z", "size_vram": 0,
                        "context_length": context_length.get(m.name, 0)} for m in models]}  # fmt: skip


def version() -> dict[str, Any]:
    return {"version": VERSION}

