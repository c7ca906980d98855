"""OpenAI's Responses API (`/v1/responses`): a conversation reaches the model as it does through
Chat Completions, and the official SDK's create, stream and parse work against the demo model."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from clients import MODEL, openai_client
from daemon_thread import RunningDaemon
from pydantic import BaseModel

from appliance.api.app import dialect_of
from appliance.api.errors import ApiError
from appliance.api.openai import OPENAI
from appliance.api.responses import RESPONSES
from appliance.devsetup import DevSetup

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                  "additionalProperties": False}  # fmt: skip
ARGS = '{"city": "Paris"}'


def test_a_conversation_reaches_the_model_as_it_does_through_chat_completions() -> None:
    assert dialect_of("/v1/responses", []) is RESPONSES
    chat = OPENAI.parse({"model": "m", "max_tokens": 50, "temperature": 0.3, "messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "Thanks. And tomorrow?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA,
                                                    "strict": True}}],
        "tool_choice": "required", "parallel_tool_calls": False}, ["m"])  # fmt: skip
    responses = RESPONSES.parse({"model": "m", "max_output_tokens": 50, "temperature": 0.3,
                                 "instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": ARGS,
         "status": "completed", "async": None},  # as the SDK dumps an output item it got back
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "user", "content": "Thanks. And tomorrow?"}],
        "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA, "strict": True}],
        "tool_choice": "required", "parallel_tool_calls": False}, ["m"])  # fmt: skip
    a, b = chat.request, responses.request
    assert (a.system, a.messages, a.max_tokens, a.temperature) == (b.system, b.messages, b.max_tokens, b.temperature)
    assert a.output.tools == b.output.tools and a.output.choice == b.output.choice
    # An assistant turn of calls only: the Responses SDK sends its (empty) message item before them.
    calls_only = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""},
                  {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": ARGS},
                  {"type": "function_call_output", "call_id": "c", "output": "ok"}]  # fmt: skip
    chat_calls = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"}]  # fmt: skip
    assert (RESPONSES.parse({"model": "m", "input": calls_only}, ["m"]).request.messages
            == OPENAI.parse({"model": "m", "messages": chat_calls}, ["m"]).request.messages)  # fmt: skip
    schema = RESPONSES.parse({"model": "m", "input": "hi", "text": {"format": {
        "type": "json_schema", "name": "w", "schema": WEATHER_SCHEMA}}}, ["m"]).request.output  # fmt: skip
    assert schema.json_schema == WEATHER_SCHEMA and schema.schema_field == "text"


@pytest.mark.parametrize(("body", "param"), [
    ({"conversation": {"id": 3}}, "conversation"),
    ({"conversation": "conv_1", "previous_response_id": "resp_1"}, "conversation"),
    ({"input": [{"type": "input_image", "image_url": "data:,"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input"),
    ({"input": []}, "input"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"text": {"format": {"type": "xml"}}}, "text"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
])  # fmt: skip
def test_what_this_server_cannot_do_is_a_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as info:
        RESPONSES.parse({"model": "m", "input": "hi", **body}, ["m"])
    assert info.value.status == 400 and info.value.param == param, info.value.message
    unset = {"previous_response_id": None, "reasoning": None, "background": False, "top_logprobs": 0}
    assert RESPONSES.parse({"model": "m", "input": "hi", **unset}, ["m"]).request.messages  # what frameworks send
    assert OPENAI.parse({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logit_bias": {},
                         "functions": None, "reasoning_effort": None}, ["m"]).request.messages  # fmt: skip


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


class City(BaseModel):
    name: str
    country: str


@pytest.mark.demo
def test_the_openai_sdk_creates_streams_and_parses_responses(demo: tuple[RunningDaemon, DevSetup]) -> None:
    client = openai_client(*demo, unix=True)
    question = "What is the capital of France?"
    chat = client.chat.completions.create(model=MODEL, max_tokens=40, temperature=0,
                                          messages=[{"role": "user", "content": question}])  # fmt: skip
    whole = client.responses.create(model=MODEL, input=question, max_output_tokens=40, temperature=0)
    assert whole.status == "completed" and whole.output_text == chat.choices[0].message.content
    assert whole.usage is not None and whole.usage.input_tokens == chat.usage.prompt_tokens  # type: ignore[union-attr]
    with client.responses.stream(model=MODEL, input=question, max_output_tokens=40, temperature=0) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()  # the SDK checks every event's order and identity on the way
    assert deltas == final.output_text == whole.output_text

    cut = client.responses.create(model=MODEL, input=question, max_output_tokens=3, temperature=0)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"

    tools: Any = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
                   "parameters": WEATHER_SCHEMA, "strict": True}]  # fmt: skip
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    called = client.responses.create(model=MODEL, input=ask, tools=tools, tool_choice="required",  # type: ignore[arg-type]
                                     max_output_tokens=60)  # fmt: skip
    (call,) = [item for item in called.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
    with client.responses.stream(model=MODEL, input=ask, tools=tools, tool_choice="required",  # type: ignore[arg-type]
                                 max_output_tokens=60) as stream:  # fmt: skip
        streamed = [item for item in stream.get_final_response().output if item.type == "function_call"]
    assert [(c.name, c.arguments) for c in streamed] == [(call.name, call.arguments)]
    cut_calls = []
    for budget in (12, 16, 20, 40):  # max_output_tokens inside the call's arguments: an incomplete call
        for item in client.responses.create(model=MODEL, input=ask, tools=tools, tool_choice="required",  # type: ignore[arg-type]
                                            max_output_tokens=budget).output:  # fmt: skip
            if item.type == "function_call":
                cut_calls.append(item)
                assert (item.status == "completed") == _is_object(item.arguments), item
    assert any(c.status == "incomplete" for c in cut_calls) and any(c.status == "completed" for c in cut_calls)
    answer = client.responses.create(model=MODEL, tools=tools, max_output_tokens=40, input=[  # type: ignore[arg-type]
        *ask, *called.output, {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    assert answer.status in ("completed", "incomplete") and answer.output  # the model's turn after the result

    parsed = client.responses.parse(model=MODEL, input="Name a city in Japan.", text_format=City, max_output_tokens=80)
    assert isinstance(parsed.output_parsed, City)


@pytest.mark.demo
def test_responses_are_stored_continued_listed_and_deleted(demo: tuple[RunningDaemon, DevSetup]) -> None:
    client = openai_client(*demo, unix=True)
    greedy: Any = {"model": MODEL, "max_output_tokens": 16, "temperature": 0}
    opening = [{"role": "user", "content": "My name is Ada. Say hello to me."}]
    first = client.responses.create(input=opening, **greedy)
    assert first.store is True and client.responses.retrieve(first.id).model_dump() == first.model_dump()
    # Continued, it answers as the whole conversation sent in input does: the same prompt, the same tokens.
    second = client.responses.create(previous_response_id=first.id, input="What is my name?", **greedy)
    asked = [*opening, *first.output, {"role": "user", "content": "What is my name?"}]
    whole = client.responses.create(input=asked, **greedy)
    assert second.previous_response_id == first.id
    assert second.usage is not None and whole.usage is not None
    assert (second.usage.input_tokens, second.output_text) == (whole.usage.input_tokens, whole.output_text)
    # A streamed one is stored as well, and a chain of three reads back through both links.
    with client.responses.stream(previous_response_id=second.id, input="Thanks!", **greedy) as stream:
        (third,) = [e.response for e in stream if e.type in ("response.completed", "response.incomplete")]
    thanked = client.responses.create(input=[*asked, *second.output, {"role": "user", "content": "Thanks!"}], **greedy)
    assert third.usage is not None and thanked.usage is not None
    assert (third.usage.input_tokens, third.output_text) == (thanked.usage.input_tokens, thanked.output_text)
    assert client.responses.retrieve(third.id).output_text == third.output_text
    (item,) = client.responses.input_items.list(second.id).data
    assert item.type == "message" and item.role == "user" and item.content[0].text == "What is my name?"  # type: ignore[union-attr]
    with pytest.raises(openai.NotFoundError, match="background responses"):
        client.responses.cancel(second.id)  # nothing runs in the background here

    assert client.responses.delete(first.id) is None  # the SDK reads no body from a delete
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError, match="it continued is no longer kept"):
        client.responses.create(previous_response_id=third.id, input="hi", **greedy)
    unkept = client.responses.create(input="hi", store=False, **greedy)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)
    with pytest.raises(openai.BadRequestError, match="previous_response_id: no stored response"):
        client.responses.create(previous_response_id=unkept.id, input="hi", **greedy)


@pytest.mark.demo
def test_conversations_are_continued_by_responses_and_kept(demo: tuple[RunningDaemon, DevSetup]) -> None:
    """The Conversations API as the OpenAI SDK (and the Agents SDK's OpenAIConversationsSession)
    uses it: a response continuing a conversation answers as the whole conversation sent in input
    does, and its input and output join the conversation; items are listed in pages both ways,
    added, read and deleted; the conversation's metadata updated; the conversation deleted."""
    client = openai_client(*demo, unix=True)
    greedy: Any = {"model": MODEL, "max_output_tokens": 16, "temperature": 0}
    opening = {"role": "user", "content": "My name is Ada."}
    conv = client.conversations.create(items=[opening], metadata={"topic": "names"})
    assert conv.metadata == {"topic": "names"} and conv.id.startswith("conv_")
    first = client.responses.create(conversation=conv.id, input="Say hello to me.", **greedy)
    asked = [opening, {"role": "user", "content": "Say hello to me."}]
    whole = client.responses.create(input=asked, **greedy)
    assert first.conversation is not None and first.conversation.id == conv.id
    assert first.usage is not None and whole.usage is not None
    assert (first.usage.input_tokens, first.output_text) == (whole.usage.input_tokens, whole.output_text)
    with client.responses.stream(conversation={"id": conv.id}, input="What is my name?", **greedy) as stream:
        (second,) = [e.response for e in stream if e.type in ("response.completed", "response.incomplete")]
    asked += [*first.output, {"role": "user", "content": "What is my name?"}]
    again = client.responses.create(input=asked, **greedy)
    assert second.usage is not None and again.usage is not None
    assert (second.usage.input_tokens, second.output_text) == (again.usage.input_tokens, again.output_text)

    items = list(client.conversations.items.list(conv.id, order="asc"))  # every page
    assert [i.type for i in items] == ["message"] * 5 and [i.role for i in items] == [  # type: ignore[union-attr]
        "user", "user", "assistant", "user", "assistant"]  # fmt: skip
    assert (items[2].id, items[4].id) == (first.output[0].id, second.output[0].id)
    newest = [i.id for i in client.conversations.items.list(conv.id, limit=2)]  # newest first, two a page
    assert newest == [i.id for i in reversed(items)]
    added = client.conversations.items.create(conv.id, items=[{"type": "message", "role": "user", "content": "Bye."}])
    (bye,) = added.data
    assert client.conversations.items.retrieve(bye.id, conversation_id=conv.id).model_dump() == bye.model_dump()
    assert client.conversations.items.delete(bye.id, conversation_id=conv.id).id == conv.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(bye.id, conversation_id=conv.id)
    assert client.conversations.update(conv.id, metadata={"topic": "greetings"}).metadata == {"topic": "greetings"}
    assert client.conversations.retrieve(conv.id).metadata == {"topic": "greetings"}

    with pytest.raises(openai.BadRequestError, match="cannot be given with previous_response_id"):
        client.responses.create(conversation=conv.id, previous_response_id=first.id, input="hi", **greedy)
    with pytest.raises(openai.BadRequestError, match=r"items\[0\]"):
        client.conversations.items.create(conv.id, items=[{"type": "nonsense"}])  # type: ignore[list-item]
    assert client.conversations.delete(conv.id).deleted
    with pytest.raises(openai.NotFoundError, match="no conversation"):
        client.responses.create(conversation=conv.id, input="hi", **greedy)


@pytest.mark.demo
def test_responses_give_the_answer_s_log_probabilities_as_chat_does(demo: tuple[RunningDaemon, DevSetup]) -> None:
    client = openai_client(*demo, unix=True)
    question = "What is the capital of France?"
    chat = client.chat.completions.create(model=MODEL, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2,
                                          messages=[{"role": "user", "content": question}])  # fmt: skip
    assert chat.choices[0].logprobs is not None and chat.choices[0].logprobs.content is not None
    expected = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                for t in chat.choices[0].logprobs.content]  # fmt: skip
    asked: dict[str, Any] = dict(model=MODEL, input=question, max_output_tokens=12, temperature=0, top_logprobs=2,
                                 include=["message.output_text.logprobs"])  # fmt: skip

    def entries(logprobs: Any) -> list[Any]:
        return [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in logprobs]

    whole = client.responses.create(**asked)
    part = whole.output[0].content[0]  # type: ignore[union-attr]
    assert part.type == "output_text" and entries(part.logprobs) == expected
    assert "".join(t for t, _, _ in expected) == part.text
    streamed, done = [], None
    for event in client.responses.create(stream=True, **asked):
        if event.type == "response.output_text.delta":
            streamed += entries(event.logprobs)
        elif event.type == "response.output_text.done":
            done = entries(event.logprobs)
    assert streamed == expected and done == expected
    plain = client.responses.create(model=MODEL, input=question, max_output_tokens=12, temperature=0)
    assert plain.output[0].content[0].logprobs == []  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError, match="include"):
        client.responses.create(model=MODEL, input=question, include=["file_search_call.results"])
