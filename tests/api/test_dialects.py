"""Both API dialects with no socket and no model: parsing, answers, streams, errors, routing."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from answers import finished, sse_events

from appliance.api.anthropic import ANTHROPIC, parse_count_tokens
from appliance.api.app import dialect_of
from appliance.api.completions import COMPLETIONS
from appliance.api.dialect import Call, ModelInfo
from appliance.api.errors import ApiError
from appliance.api.openai import OPENAI
from appliance.api.responses import RESPONSES
from appliance.api.tools import Answer
from appliance.engine import ContextOverflow, GenerationRequest, Message

PLAIN_CALL = Call(GenerationRequest((Message("user", "hi"),)), stream=False, model="m")


def test_requests_are_routed_to_their_dialect_by_path_then_by_header() -> None:
    assert dialect_of("/v1/messages", []) is ANTHROPIC
    assert dialect_of("/v1/messages/count_tokens", []) is ANTHROPIC
    assert dialect_of("/v1/chat/completions", [(b"anthropic-version", b"2023-06-01")]) is OPENAI
    assert dialect_of("/v1/models", [(b"anthropic-version", b"2023-06-01")]) is ANTHROPIC
    assert dialect_of("/v1/models", []) is OPENAI


def test_each_dialect_parses_its_own_body_into_one_call() -> None:
    a = ANTHROPIC.parse({"model": "m", "max_tokens": 5, "system": "Be brief.", "stream": True,
                         "messages": [{"role": "user", "content": "hi"}]}, ["m"])  # fmt: skip
    assert a.stream and not a.include_usage and a.request.system == "Be brief." and a.request.max_tokens == 5
    o = OPENAI.parse({"model": "m", "stream": True, "stream_options": {"include_usage": True}, "seed": 3,
                      "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]},
                     ["m"])  # fmt: skip
    assert o.stream and o.include_usage and o.request.system == "Be brief." and o.request.seed == 3
    with pytest.raises(ApiError) as info:
        OPENAI.parse({"model": "other", "messages": [{"role": "user", "content": "hi"}]}, ["m"])
    assert info.value.status == 404 and info.value.param == "model"
    for stop in ("", ["END", ""]):  # refused in the dialect's own field name, not the engine's stop_sequences
        with pytest.raises(ApiError) as info:
            OPENAI.parse({"model": "m", "stop": stop, "messages": [{"role": "user", "content": "hi"}]}, ["m"])
        assert info.value.status == 400 and info.value.param == "stop"


def test_hints_today_s_clients_send_are_checked_and_what_this_server_lacks_is_a_400_naming_it() -> None:
    a = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    o = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    r = {"model": "m", "input": "hi"}
    openai_hints = {"service_tier": "auto", "prompt_cache_key": "k", "prompt_cache_retention": "24h",
                    "prompt_cache_options": {"ttl": "30m"}, "safety_identifier": "s", "user": "u",
                    "metadata": {"a": "b"}, "store": False}  # fmt: skip
    ANTHROPIC.parse({**a, "cache_control": {"type": "ephemeral", "ttl": "1h"}, "service_tier": "standard_only",
                     "speed": "fast", "inference_geo": "eu", "diagnostics": {"previous_message_id": "msg_1"},
                     "user_profile_id": "p", "workspace_id": "w", "metadata": {"user_id": "u"}}, ["m"])  # fmt: skip
    parse_count_tokens({**o, "cache_control": {"type": "ephemeral"}, "speed": "standard"}, ["m"])
    OPENAI.parse({**o, **openai_hints, "verbosity": "high", "modalities": ["text"]}, ["m"])
    RESPONSES.parse({**r, **openai_hints, "max_tool_calls": 3}, ["m"])
    COMPLETIONS.parse({"model": "m", "prompt": "hi", "user": "u", "metadata": {}}, ["m"])
    # Unset (null), as frameworks send every parameter they know: accepted too.
    ANTHROPIC.parse({**a, "context_management": None, "service_tier": None, "cache_control": None}, ["m"])
    RESPONSES.parse({**r, "context_management": None, "moderation": None}, ["m"])
    for dialect, base, body, param in [
        (ANTHROPIC, a, {"service_tier": "priority"}, "service_tier"),
        (ANTHROPIC, a, {"speed": "warp"}, "speed"),
        (ANTHROPIC, a, {"cache_control": "ephemeral"}, "cache_control"),
        (ANTHROPIC, a, {"metadata": ["u"]}, "metadata"),
        (ANTHROPIC, a, {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "context_management"),
        (ANTHROPIC, a, {"output_config": {"effort": "extreme"}}, "output_config"),
        (OPENAI, o, {"service_tier": "gold"}, "service_tier"),
        (OPENAI, o, {"prompt_cache_retention": "1y"}, "prompt_cache_retention"),
        (OPENAI, o, {"verbosity": 3}, "verbosity"),
        (OPENAI, o, {"modalities": ["text", "audio"]}, "modalities"),
        (OPENAI, o, {"moderation": {"model": "omni"}}, "moderation"),
        (RESPONSES, r, {"context_management": [{"type": "compaction"}]}, "context_management"),
        (RESPONSES, r, {"max_tool_calls": 0}, "max_tool_calls"),
        (RESPONSES, r, {"safety_identifier": 7}, "safety_identifier"),
    ]:  # fmt: skip
        with pytest.raises(ApiError) as info:
            dialect.parse({**base, **body}, ["m"])
        assert info.value.status == 400 and info.value.param == param, (body, info.value.message)


def test_messages_and_tools_as_today_s_sdks_write_them_are_read() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    # A chat answer sent back as the SDK dumps it (message.model_dump()): annotations and unset fields.
    dumped = {"role": "assistant", "content": "Paris.", "refusal": None, "annotations": [], "audio": None,
              "function_call": None, "tool_calls": None}  # fmt: skip
    o = {"model": "m", "messages": [{"role": "user", "content": "hi"}, dumped, {"role": "user", "content": "more"}]}
    assert OPENAI.parse(o, ["m"]).request.messages[1].content == "Paris."
    extras = {"defer_loading": False, "allowed_callers": ["direct"]}
    r = {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "w", "parameters": schema, "strict": False,
                                               "output_schema": {"type": "string"}, "async": False, **extras}]}
    a = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": [{
        "name": "w", "input_schema": schema, "input_examples": [{"city": "Paris"}], "eager_input_streaming": True,
        **extras}]}  # fmt: skip
    assert [t.name for t in RESPONSES.parse(r, ["m"]).request.output.tools] == ["w"]
    assert [t.name for t in ANTHROPIC.parse(a, ["m"]).request.output.tools] == ["w"]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18 C",
                                           "toolset_name": "weather"}]}  # fmt: skip
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {}}]}
    assert ANTHROPIC.parse({**a, "messages": [a["messages"][0], call, result]}, ["m"]).request.messages[2].results
    for dialect, base, change, param in [
        (OPENAI, o, {"function_call": {"name": "w", "arguments": "{}"}}, "messages[1].function_call"),
        (OPENAI, o, {"audio": {"id": "a1"}}, "messages[1].audio"),
        (RESPONSES, r, {"defer_loading": True}, "tools"),
        (RESPONSES, r, {"allowed_callers": ["programmatic"]}, "tools"),
        (RESPONSES, r, {"async": True}, "tools"),
        (ANTHROPIC, a, {"allowed_callers": ["code_execution_20250825"]}, "tools"),
        (ANTHROPIC, a, {"input_examples": "Paris"}, "tools"),
        (ANTHROPIC, a, {"eager_input_streaming": "yes"}, "tools"),
    ]:  # fmt: skip
        body = copy.deepcopy(base)
        (body["messages"][1] if dialect is OPENAI else body["tools"][0]).update(change)
        with pytest.raises(ApiError) as info:
            dialect.parse(body, ["m"])
        assert info.value.status == 400 and info.value.param == param, (change, info.value.message)


def test_anthropic_effort_reaches_the_template_and_the_structured_outputs_beta_s_format_is_read() -> None:
    a = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    efforts = {e: ANTHROPIC.parse({**a, "output_config": {"effort": e}}, ["m"]).request.reasoning_effort
               for e in ("low", "medium", "high", "xhigh", "max")}  # fmt: skip
    assert efforts == {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
    assert ANTHROPIC.parse(a, ["m"]).request.reasoning_effort is None
    assert ANTHROPIC.parse(a, ["m"]).request.thinking is None  # effort alone does not switch thinking on
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}  # fmt: skip
    fmt = {"type": "json_schema", "schema": schema}
    beta = ANTHROPIC.parse({**a, "output_format": fmt}, ["m"]).request.output
    assert beta == ANTHROPIC.parse({**a, "output_config": {"format": fmt}}, ["m"]).request.output
    assert beta.json_schema == schema
    with pytest.raises(ApiError) as info:
        ANTHROPIC.parse({**a, "output_format": fmt, "output_config": {"format": fmt}}, ["m"])
    assert info.value.param == "output_format"


def test_errors_in_each_dialects_shape_and_a_full_queue_in_its_status() -> None:
    err = ApiError(400, "max_tokens: must be an integer", param="max_tokens")
    assert json.loads(ANTHROPIC.error_body(err)) == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: must be an integer"}}
    assert json.loads(OPENAI.error_body(err)) == {"error": {
        "message": "max_tokens: must be an integer", "type": "invalid_request_error", "param": "max_tokens",
        "code": None}}  # fmt: skip
    assert (ANTHROPIC.busy_status, OPENAI.busy_status) == (529, 429)
    assert json.loads(ANTHROPIC.error_body(ApiError(529, "busy")))["error"]["type"] == "overloaded_error"
    assert json.loads(OPENAI.error_body(ApiError(429, "busy")))["error"]["code"] == "rate_limit_exceeded"
    assert json.loads(ANTHROPIC.error_body(ApiError(413, "big")))["error"]["type"] == "request_too_large"


def test_whole_answers_carry_text_stop_reason_and_usage() -> None:
    a = ANTHROPIC.response("m", PLAIN_CALL, [(Answer("Paris."), finished("max_tokens"))])
    assert a["content"] == [{"type": "text", "text": "Paris."}] and a["stop_reason"] == "max_tokens"
    assert a["usage"] == {"input_tokens": 12, "output_tokens": 3}
    o = OPENAI.response("m", PLAIN_CALL, [(Answer("Paris."), finished("max_tokens"))])
    assert o["choices"][0]["message"]["content"] == "Paris." and o["choices"][0]["finish_reason"] == "length"
    assert o["usage"]["total_tokens"] == 15


def test_anthropic_stream_is_the_messages_event_sequence() -> None:
    call = ANTHROPIC.parse({"model": "m", "max_tokens": 5, "stream": True,
                            "messages": [{"role": "user", "content": "hi"}]}, ["m"])  # fmt: skip
    enc = ANTHROPIC.stream("m", 12, call)
    done = finished()
    events = sse_events(enc.start() + enc.delta("Par") + enc.delta("is") + enc.finish_choice(done) + enc.end(done))
    assert [e["type"] for e in events] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                           "content_block_delta", "content_block_stop", "message_delta",
                                           "message_stop"]  # fmt: skip
    assert events[6]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


def test_openai_stream_ends_with_usage_when_asked_and_done() -> None:
    call = OPENAI.parse({"model": "m", "stream": True, "stream_options": {"include_usage": True},
                         "messages": [{"role": "user", "content": "hi"}]}, ["m"])  # fmt: skip
    enc = OPENAI.stream("m", 12, call)
    done = finished()
    raw = enc.start() + enc.delta("Paris") + enc.finish_choice(done) + enc.end(done)
    events = sse_events(raw)
    assert events[1]["choices"][0]["delta"] == {"content": "Paris"}  # type: ignore[index]
    assert events[2]["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
    assert events[3]["usage"] == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
                                  "prompt_tokens_details": {"cached_tokens": 0},
                                  "completion_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
    assert raw.endswith(b"data: [DONE]\n\n")
    assert sse_events(enc.error(ApiError(500, "failed")))[0]["error"]["type"] == "server_error"  # type: ignore[index]


def test_model_lists_in_each_shape() -> None:
    info = ModelInfo("smollm2", "1.0.0", 1_700_000_000)
    a = ANTHROPIC.models([info])
    assert a["data"][0]["id"] == "smollm2" and a["data"][0]["display_name"] == "smollm2 1.0.0"
    assert a["data"][0]["created_at"] == "2023-11-14T22:13:20Z"
    assert OPENAI.models([info]) == {"object": "list", "data": [{"id": "smollm2", "object": "model",
                                                               "created": 1_700_000_000, "owned_by": "zerolayer"}]}


def test_anthropic_turns_of_one_role_combine_and_plain_text_documents_are_read() -> None:
    a: dict[str, Any] = {"model": "m", "max_tokens": 5}

    def messages(*turns: dict[str, Any]) -> tuple[Message, ...]:
        return ANTHROPIC.parse({**a, "messages": list(turns)}, ["m"]).request.messages

    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "search", "input": {}}]}
    found = {"type": "search_result", "source": "https://example.com/sky", "title": "Sky",
             "content": [{"type": "text", "text": "The sky is blue."}]}  # fmt: skip
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [found]}]}
    # Tool results and the next question as two user messages: one turn, as the Messages API combines them.
    turns = messages({"role": "user", "content": "Look it up."}, call, result, {"role": "user", "content": "So?"})
    assert [m.role for m in turns] == ["user", "assistant", "user"] and turns[2].content == "So?"
    assert turns[2].results == (("<document>\n<source>https://example.com/sky</source>\n<title>Sky</title>\n"
                                 "<document_content>\nThe sky is blue.\n</document_content>\n</document>", False),)
    text = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Grass is green."},
            "title": "Facts", "context": "from a field guide"}  # fmt: skip
    grass = [{"type": "text", "text": "Grass is green."}]
    blocks = {"type": "document", "source": {"type": "content", "content": grass}}
    ask = {"type": "text", "text": "What colour is grass?"}
    (turn,) = messages({"role": "user", "content": [text, ask]})
    body = "<document_content>\nGrass is green.\n</document_content>\n</document>\n"
    assert turn.content == ("<document>\n<title>Facts</title>\n<context>from a field guide</context>\n" + body
                            + "What colour is grass?")  # fmt: skip
    (turn,) = messages({"role": "user", "content": [blocks]}, {"role": "user", "content": [ask]})
    assert turn.content == "<document>\n" + body + "What colour is grass?"
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}
    for turns_sent in ([{"role": "user", "content": [pdf]}], [{"role": "user", "content": [{**text, "citations": {
            "enabled": True}}]}], [{"role": "assistant", "content": "Hi."}]):  # fmt: skip
        with pytest.raises(ApiError) as info:
            messages(*turns_sent)
        assert info.value.status == 400 and info.value.param == "messages", info.value.message


def test_anthropic_system_messages_and_cleared_thoughts_reach_the_model_as_claude_code_sends_them() -> None:
    a: dict[str, Any] = {"model": "m", "max_tokens": 5, "system": "Be brief."}

    def parsed(*turns: dict[str, Any], **extra: Any) -> GenerationRequest:
        return ANTHROPIC.parse({**a, "messages": list(turns), **extra}, ["m"]).request

    # A system message before the first turn joins the system text; a later one stays where it is.
    request = parsed({"role": "system", "content": [{"type": "text", "text": "Use tools."}]},
                     {"role": "user", "content": "hi"}, {"role": "system", "content": "Agents: Explore."})  # fmt: skip
    assert request.system == "Be brief.\n\nUse tools."
    assert request.messages == (Message("user", "hi"), Message("system", "Agents: Explore."))
    said = [{"role": "user", "content": "one"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "first", "signature": ""},
                                              {"type": "text", "text": "1"}]},
            {"role": "user", "content": "two"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "second", "signature": ""},
                                              {"type": "text", "text": "2"}]},
            {"role": "user", "content": "three"}]  # fmt: skip

    def thoughts(edit: dict[str, Any] | None) -> list[str]:
        extra = {} if edit is None else {"context_management": {"edits": [edit]}}
        return [m.thought for m in parsed(*said, **extra).messages if m.role == "assistant"]

    assert thoughts(None) == ["first", "second"]
    assert thoughts({"type": "clear_thinking_20251015", "keep": "all"}) == ["first", "second"]  # Claude Code's
    assert thoughts({"type": "clear_thinking_20251015"}) == ["", "second"]  # the last turn's kept by default
    assert thoughts({"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}}) == ["", ""]
    for bad in ({"type": "clear_tool_uses_20250919"}, {"type": "clear_thinking_20251015", "keep": 2},
                {"type": "clear_thinking_20251015", "keep": "all", "trigger": {}}):
        with pytest.raises(ApiError) as info:
            parsed(*said, context_management={"edits": [bad]})
        assert info.value.status == 400 and str(info.value.param).startswith("context_management"), info.value.message
    for only_system in ([{"role": "system", "content": "x"}], [{"role": "system", "content": "x"},
                                                               {"role": "assistant", "content": "y"}]):  # fmt: skip
        with pytest.raises(ApiError) as info:
            parsed(*only_system)
        assert info.value.status == 400 and info.value.param == "messages"
    count = parse_count_tokens({"model": "m", "messages": [{"role": "system", "content": "s"},
                                                           {"role": "user", "content": "hi"}]}, ["m"])[1]  # fmt: skip
    assert count.system == "s" and count.messages == (Message("user", "hi"),)


def test_a_context_overflow_is_worded_as_each_api_s_clients_recognise_it() -> None:
    overflow = ContextOverflow("too long", "max_tokens", prompt_tokens=20282, max_tokens=32000, limit=8192)
    anthropic_error = ANTHROPIC.overflow(overflow)
    # Claude Code parses this sentence and retries with a max_tokens that fits.
    assert re.search(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)",
                     anthropic_error.message).groups() == ("20282", "32000", "8192")  # type: ignore[union-attr]
    openai_error = json.loads(OPENAI.error_body(OPENAI.overflow(overflow)))["error"]
    assert openai_error["code"] == "context_length_exceeded" and openai_error["param"] == "messages"
    assert openai_error["message"].startswith("This model's maximum context length is 8192 tokens. However, you "
                                              "requested 52282 tokens (20282 in the messages, 32000 in the completion)")
    assert RESPONSES.overflow(overflow).code == "context_length_exceeded"
    unknown = ContextOverflow("the KV cache holds 300", "max_tokens")  # the scheduler's: no numbers to word
    assert ANTHROPIC.overflow(unknown).message == "the KV cache holds 300"
