"""Both API dialects with no socket and no model: parsing, answers, streams, errors, routing."""

from __future__ import annotations

import json

import pytest
from answers import finished, sse_events

from appliance.api.anthropic import ANTHROPIC
from appliance.api.app import dialect_of
from appliance.api.dialect import Call, ModelInfo
from appliance.api.errors import ApiError
from appliance.api.openai import OPENAI
from appliance.api.tools import Answer
from appliance.engine import GenerationRequest, Message

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
