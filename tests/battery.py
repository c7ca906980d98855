"""The bad-input battery's shared parts: request bodies bent out of shape, and the count of cases
tried per group (printed at the end of the run by conftest.py)."""

from __future__ import annotations

import asyncio
import copy
import json
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

CASES: Counter[str] = Counter()  # group -> cases tried; any failure fails its test

MODEL = "tiny-llama"
_TOOL_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                                "days": {"type": "integer", "minimum": 1}}, "required": ["city"]}
# Per endpoint, a plain body and one that reaches everything nested: tool definitions and their
# schemas, tool turns, structured output. bend() changes parts at any depth of either.
VALID: dict[str, list[dict[str, Any]]] = {
    "/v1/messages": [
        {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        {"model": MODEL, "max_tokens": 4, "system": [{"type": "text", "text": "be brief"}], "messages": [
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "a call", "signature": ""},
                                              {"type": "tool_use", "id": "toolu_1", "name": "get_w",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}],
         "tools": [{"name": "get_w", "description": "the weather", "input_schema": _TOOL_SCHEMA}],
         "tool_choice": {"type": "tool", "name": "get_w"}, "thinking": {"type": "adaptive"}},
        {"model": MODEL, "max_tokens": 4, "messages": [  # documents, search results, one role twice
            {"role": "user", "content": [{"type": "document", "title": "notes", "source": {
                "type": "text", "media_type": "text/plain", "data": "Grass is green."}}]},
            {"role": "user", "content": "What colour is grass?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_2", "name": "get_w", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": [
                {"type": "search_result", "source": "https://example.com", "title": "t",
                 "content": [{"type": "text", "text": "sunny"}]}]}]}],
         "tools": [{"name": "get_w", "input_schema": _TOOL_SCHEMA}]},
    ],
    "/v1/messages/count_tokens": [{"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                   "tools": [{"name": "get_w", "input_schema": _TOOL_SCHEMA}]}],
    "/v1/chat/completions": [
        {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        {"model": MODEL, "max_tokens": 4, "seed": 3, "temperature": 0.7, "reasoning_effort": "low", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {"role": "assistant", "reasoning_content": "a call", "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_w", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
         "tools": [{"type": "function", "function": {"name": "get_w", "description": "the weather",
                                                     "parameters": _TOOL_SCHEMA}}],
         "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": _TOOL_SCHEMA}}},
    ],
    "/v1/completions": [{"model": MODEL, "max_tokens": 4, "prompt": "Once"}],
    "/api/chat": [
        {"model": MODEL, "stream": False, "options": {"num_predict": 4},
         "messages": [{"role": "user", "content": "hi"}]},
        {"model": MODEL + ":latest", "options": {"num_predict": 4, "temperature": 0.7, "seed": 3, "stop": ["x"]},
         "think": False, "messages": [
            {"role": "system", "content": "be brief"}, {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "thinking": "a call",
             "tool_calls": [{"function": {"name": "get_w", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_name": "get_w", "content": "sunny"}],
         "tools": [{"type": "function", "function": {"name": "get_w", "description": "the weather",
                                                     "parameters": _TOOL_SCHEMA}}],
         "format": _TOOL_SCHEMA},
    ],
    "/api/generate": [
        {"model": MODEL, "prompt": "Once", "raw": True, "stream": False, "options": {"num_predict": 4}},
        {"model": MODEL, "prompt": "Once", "system": "be brief", "format": "json", "options": {"num_predict": 4}},
    ],
    "/v1/responses": [
        {"model": MODEL, "max_output_tokens": 4, "input": "hi"},
        {"model": MODEL, "max_output_tokens": 4, "instructions": "be brief", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "a call"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_w", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
         "tools": [{"type": "function", "name": "get_w", "parameters": _TOOL_SCHEMA}], "tool_choice": "auto",
         "text": {"format": {"type": "json_schema", "name": "w", "schema": _TOOL_SCHEMA}},
         "reasoning": {"effort": "low"}},
    ],
}  # fmt: skip
# Field names a hostile or careless client might send, known and unknown to each API.
KEYS = ["model", "messages", "max_tokens", "system", "stream", "temperature", "top_p", "top_k", "stop",
        "stop_sequences", "tools", "tool_choice", "response_format", "output_config", "metadata", "seed", "n",
        "logprobs", "top_logprobs", "prompt", "echo", "role", "content", "type", "text", "name", "input_schema",
        "parameters", "function", "tool_calls", "tool_call_id", "tool_use_id", "input", "schema", "json_schema",
        "frequency_penalty", "repetition_penalty", "min_p", "user", "thread", "suffix", "input", "instructions",
        "max_output_tokens", "call_id", "output", "arguments", "thinking", "budget_tokens", "reasoning_effort",
        "reasoning", "effort", "reasoning_content", "summary", "signature", "service_tier", "cache_control", "speed",
        "prompt_cache_key", "prompt_cache_retention", "verbosity", "modalities", "max_tool_calls",
        "context_management", "output_format", "inference_geo", "annotations", "defer_loading", "allowed_callers",
        "input_examples", "eager_input_streaming", "output_schema", "async", "toolset_name", "citations", "source",
        "title", "context", "data", "\u0000", "a\ud800b", ""]


def junk(rng: random.Random, depth: int = 0) -> Any:
    """A JSON value of any shape, leaning to the edges: huge and negative numbers, empty and odd
    strings (lone surrogates, NUL, RTL marks), deep or wide containers."""
    kind = rng.randrange(11 if depth < 4 else 7)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2**31, -(2**63), 10**30, 4, 65536])
    if kind == 3:
        return rng.choice([0.0, -0.5, 1e308, 1e-308, 2.5, -1e9])
    if kind == 4:
        return rng.choice(["", "hi", "a\ud800b", "\u0000", "\u202e", "x" * 5000, "\U0001f642" * 50, "user",
                           "assistant", "auto", "function", "json_schema", "tool_use", "text", "document",
                           "search_result", "content", MODEL])  # fmt: skip
    if kind == 5:
        return rng.choice(KEYS)
    if kind == 6:  # empty, or a schema that refers to itself
        return rng.choice([[], {}, {"$ref": "#"}])
    if kind in (7, 8):
        return [junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(KEYS): junk(rng, depth + 1) for _ in range(rng.randrange(4))}


def bend(rng: random.Random, path: str) -> dict[str, Any]:
    """A valid body for `path` with one to three of its parts, at any depth, replaced, added or
    removed: near enough to valid to reach the deep checks."""
    body = copy.deepcopy(rng.choice(VALID[path]))
    for _ in range(rng.randrange(1, 4)):
        target = body if rng.random() < 0.4 else rng.choice(_objects(body))
        op = rng.randrange(3)
        if op == 0 and target:
            key = rng.choice(sorted(target, key=str))
            target[key] = junk(rng)
        elif op == 1:
            target[rng.choice(KEYS)] = junk(rng)
        elif target:
            del target[rng.choice(sorted(target, key=str))]
    return body


def _objects(doc: Any) -> list[dict[str, Any]]:
    """Every object in a JSON document, the document first."""
    found, stack = [], [doc]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            found.append(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return found


def encode(body: Any) -> bytes:
    return json.dumps(body).encode("utf-8", "surrogatepass")


def check_error(path: str, status: int, body: bytes, expected: int | None = None) -> None:
    """What every answer to a bad request must be: a 4xx (`expected`, when a case names it) in the
    dialect's own JSON error shape, whichever layer answered."""
    assert 400 <= status < 500 and status == (expected or status), (status, body[:300])
    doc = json.loads(body)
    if path.startswith("/v1/messages"):
        assert doc["type"] == "error" and doc["error"]["type"] and isinstance(doc["error"]["message"], str), doc
    elif path.startswith("/api/"):  # Ollama's
        assert set(doc) == {"error"} and isinstance(doc["error"], str) and doc["error"], doc
    else:
        assert set(doc["error"]) == {"message", "type", "param", "code"} and "type" not in doc, doc
    assert "Traceback" not in body.decode()


async def call_app(app: Any, method: str, path: str, data: bytes = b"",
                   headers: list[tuple[bytes, bytes]] | None = None, transport: str = "unix",
                   connected_for: float = 3600.0, on_send: Callable[[int], Awaitable[None]] | None = None,
                   ) -> tuple[int, dict[bytes, bytes], bytes]:  # fmt: skip
    """One request straight into the ASGI app, its body as raw bytes. The client disconnects after
    `connected_for` seconds, and `on_send(n)` runs as the app sends its n-th message (to slow the
    client down, or fail the send)."""
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": data, "more_body": False}
        await asyncio.sleep(connected_for)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if on_send is not None:
            await on_send(len(sent))

    scope = {"type": "http", "method": method, "path": path, "http_version": "1.1", "headers": headers or [],
             "extensions": {"zerolayer": {"transport": transport}}}  # fmt: skip
    await app(scope, receive, send)
    start = sent[0] if sent else {"status": 0, "headers": []}
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])
