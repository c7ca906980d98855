"""A reasoning model's thought through each dialect, read by the official clients: Chat Completions'
`reasoning_content` (as llama.cpp's server, vLLM and DeepSeek's API give it) and its usage's
reasoning tokens; the Messages API's thinking blocks, with `thinking.budget_tokens` honoured; the
Responses API's reasoning item. Streamed and whole answers agree, each API's switch reaches the
chat template, and a client that sends an answer back with its thought is not refused. The tiny
SmolLM3 fixture (tests/engine/test_reasoning.py says why its thoughts are opened by the prompt)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from clients import anthropic_client, openai_client, serve
from daemon_thread import RunningDaemon

from appliance.devsetup import DevSetup

MODEL = "tiny-smollm3"
QUESTION = {"role": "user", "content": "Explain the for statement and the else clause of a loop."}
PREFILL = {"role": "assistant", "content": "<think>\n"}  # the prompt opens the thought


@pytest.fixture(scope="module")
def thinker(trusted_keys: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, DevSetup]]:
    from firmware.toolchain.tiny import tiny_bundle

    running, setup = serve(tmp_path_factory.mktemp("thinker"), tiny_bundle("smollm3"), trusted_keys)
    yield running, setup
    running.stop()


def test_chat_completions_give_the_thought_as_reasoning_content(thinker: tuple[RunningDaemon, DevSetup]) -> None:
    client = openai_client(*thinker, unix=True)
    whole = client.chat.completions.create(model=MODEL, messages=[QUESTION, PREFILL], max_tokens=16,  # type: ignore[list-item]
                                           temperature=0)  # fmt: skip
    message = whole.choices[0].message
    thought = (message.model_extra or {})["reasoning_content"]
    assert thought and message.content == "" and whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens_details is not None
    assert whole.usage.completion_tokens_details.reasoning_tokens == 16
    parts: list[str] = []
    for chunk in client.chat.completions.create(model=MODEL, messages=[QUESTION, PREFILL], max_tokens=16,  # type: ignore[list-item]
                                                temperature=0, stream=True):  # fmt: skip
        for choice in chunk.choices:
            parts.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
            assert not choice.delta.content
    assert "".join(parts) == thought
    # The SDK's message sent back as the conversation's next turn, its thought with it.
    again = client.chat.completions.create(model=MODEL, max_tokens=4, messages=[
        QUESTION, message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}])  # type: ignore[list-item]
    assert again.choices[0].message.content is not None


def test_reasoning_effort_is_the_template_switch(thinker: tuple[RunningDaemon, DevSetup]) -> None:
    client = openai_client(*thinker, unix=True)

    def prompt_tokens(effort: str) -> int:
        done = client.chat.completions.create(model=MODEL, messages=[QUESTION], max_tokens=1,  # type: ignore[list-item]
                                              reasoning_effort=effort)  # type: ignore[arg-type]
        assert done.usage is not None
        return done.usage.prompt_tokens

    # "none" writes the template's empty thought into the prompt; the others leave the model to think.
    assert prompt_tokens("none") > prompt_tokens("high") == prompt_tokens("low")
    with pytest.raises(openai.BadRequestError) as err:
        prompt_tokens("extreme")
    assert err.value.param == "reasoning_effort"


def _claude(thinker: tuple[RunningDaemon, DevSetup], **fields: Any) -> Any:
    return dict(model=MODEL, max_tokens=1040, messages=[QUESTION, PREFILL],  # greedy: the firmware default
                thinking={"type": "enabled", "budget_tokens": 1024}, **fields)  # fmt: skip


def test_the_messages_api_gives_thinking_blocks_within_the_budget(thinker: tuple[RunningDaemon, DevSetup]) -> None:
    client = anthropic_client(*thinker, unix=True)
    whole = client.messages.create(**_claude(thinker))
    assert [b.type for b in whole.content] == ["thinking", "text"]
    thinking, text = whole.content
    assert isinstance(thinking, anthropic.types.ThinkingBlock) and isinstance(text, anthropic.types.TextBlock)
    assert thinking.thinking and text.text  # the budget (1024 tokens) closed the thought; 16 of answer followed
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 1040
    with client.messages.stream(**_claude(thinker)) as stream:
        streamed = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None), getattr(b, "text", None)) for b in streamed.content] == [
        (b.type, getattr(b, "thinking", None), getattr(b, "text", None)) for b in whole.content]
    # The answer sent back with its thinking block, as the SDK keeps it.
    again = client.messages.create(model=MODEL, max_tokens=4, messages=[
        QUESTION, {"role": "assistant", "content": [b.model_dump() for b in whole.content]},
        {"role": "user", "content": "Go on."}])  # type: ignore[list-item]
    assert again.content[0].type == "text"
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(**{**_claude(thinker), "max_tokens": 1024})
    assert "budget_tokens" in err.value.message


def test_the_messages_api_thinks_before_a_tool_call(thinker: tuple[RunningDaemon, DevSetup]) -> None:
    # The tool grammar holds the answer, not the thought: the budget closes it, then the call comes.
    client = anthropic_client(*thinker, unix=True)
    verdict = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    tools = [{"name": "record", "description": "Record the verdict.", "input_schema": verdict}]
    fields = {**_claude(thinker), "max_tokens": 1200, "tools": tools, "tool_choice": {"type": "any"}}
    whole = client.messages.create(**fields)
    assert [b.type for b in whole.content] == ["thinking", "tool_use"] and whole.stop_reason == "tool_use"
    call = whole.content[1]
    assert isinstance(call, anthropic.types.ToolUseBlock) and call.name == "record"
    assert call.input in ({"ok": True}, {"ok": False})
    with client.messages.stream(**fields) as stream:
        streamed = stream.get_final_message()
    blocks = [[b.model_dump(exclude={"id"}) for b in m.content] for m in (whole, streamed)]
    assert blocks[0] == blocks[1]


def test_the_responses_api_gives_a_reasoning_item(thinker: tuple[RunningDaemon, DevSetup]) -> None:
    client = openai_client(*thinker, unix=True)
    conversation: list[Any] = [QUESTION, PREFILL]
    whole = client.responses.create(model=MODEL, input=conversation, max_output_tokens=16, temperature=0,
                                    reasoning={"effort": "medium"})  # fmt: skip
    assert [item.type for item in whole.output] == ["reasoning"]
    item = whole.output[0]
    assert isinstance(item, openai.types.responses.ResponseReasoningItem) and item.content
    assert item.content[0].text and whole.usage is not None
    assert whole.usage.output_tokens_details.reasoning_tokens == 16 and whole.reasoning is not None
    with client.responses.stream(model=MODEL, input=conversation, max_output_tokens=16, temperature=0) as stream:
        events = list(stream)  # it ends incomplete (at max_output_tokens): the SDK's final response is for completed
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    final = next(e.response for e in events if e.type == "response.incomplete")
    assert "".join(deltas) == item.content[0].text
    assert [o.model_dump(exclude={"id"}) for o in final.output] == [o.model_dump(exclude={"id"}) for o in whole.output]
    # The output items sent back as input, the reasoning item among them.
    again = client.responses.create(model=MODEL, max_output_tokens=4, input=[
        QUESTION, *[o.model_dump(exclude_none=True) for o in whole.output], {"role": "user", "content": "Go on."}])
    assert again.status == "incomplete"


@pytest.fixture(scope="module")
def gpt_oss(trusted_keys: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, DevSetup]]:
    from firmware.toolchain.tiny import tiny_bundle

    running, setup = serve(tmp_path_factory.mktemp("gpt-oss"), tiny_bundle("gpt_oss"), trusted_keys)
    yield running, setup
    running.stop()


def test_gpt_oss_calls_in_its_own_messages_through_both_clients_and_reads_the_result(
        gpt_oss: tuple[RunningDaemon, DevSetup]) -> None:  # fmt: skip
    """gpt-oss writes a call as a commentary message to its function (tests/engine/test_reasoning.py
    checks the tokens): a client gets a plain call, and sends it back with its result, which the
    template renders as gpt-oss's own messages."""
    claude = anthropic_client(*gpt_oss, unix=True)
    city = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}
    tools = [{"name": "get_weather", "description": "The weather in a city now.", "input_schema": city}]
    fields: dict[str, Any] = {"model": "tiny-gpt_oss", "max_tokens": 1100, "tools": tools,  # greedy by default
                              "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 1024},
                              "messages": [{"role": "user", "content": "Weather in Paris?"}]}  # fmt: skip
    whole = claude.messages.create(**fields)
    assert whole.stop_reason == "tool_use" and whole.content[-1].type == "tool_use"
    call = whole.content[-1]
    assert isinstance(call, anthropic.types.ToolUseBlock) and call.name == "get_weather"
    assert call.input in ({"city": "Paris"}, {"city": "Rome"})
    with claude.messages.stream(**fields) as stream:
        streamed = stream.get_final_message()
    blocks = [[b.model_dump(exclude={"id"}) for b in m.content] for m in (whole, streamed)]
    assert blocks[0] == blocks[1]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C"}]}
    again = claude.messages.create(**{**fields, "tool_choice": {"type": "auto"}, "messages": [
        *fields["messages"], {"role": "assistant", "content": whole.content}, result]})
    assert again.stop_reason in ("tool_use", "end_turn", "max_tokens")
    # OpenAI's shapes of the same turns: its tool_calls and tool message reach the template as such.
    chat = openai_client(*gpt_oss, unix=True)
    function = {"type": "function", "function": {"name": "get_weather", "parameters": city}}
    called = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps(call.input)}}]}
    turns = [{"role": "user", "content": "Weather in Paris?"}, called,
             {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]  # fmt: skip
    answer = chat.chat.completions.create(model="tiny-gpt_oss", max_tokens=20, temperature=0, tools=[function],
                                          messages=turns)  # type: ignore[arg-type]
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_an_earlier_thought_reaches_a_template_that_shows_it_from_each_dialect(
        gpt_oss: tuple[RunningDaemon, DevSetup]) -> None:  # fmt: skip
    """gpt-oss's template shows the thought before an earlier call (its analysis message): sent
    back in each dialect's shape, it is there, and the prompt is longer by the same tokens."""
    model, thought, args = "tiny-gpt_oss", "The user asks for Paris.", '{"city": "Paris"}'
    params = {"type": "object", "properties": {"city": {"type": "string"}}}
    question = {"role": "user", "content": "Weather in Paris?"}
    claude, chat = anthropic_client(*gpt_oss, unix=True), openai_client(*gpt_oss, unix=True)

    def claude_tokens(*thinking: dict[str, Any]) -> int:
        use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": json.loads(args)}
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}
        turns: Any = [question, {"role": "assistant", "content": [*thinking, use]},
                      {"role": "user", "content": [result]}]  # fmt: skip
        tools: Any = [{"name": "get_weather", "input_schema": params}]
        return claude.messages.count_tokens(model=model, tools=tools, messages=turns).input_tokens

    def chat_tokens(**reasoning: str) -> int:
        call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}
        turns: Any = [question, {"role": "assistant", "content": None, **reasoning, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]  # fmt: skip
        tools: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": params}}]
        usage = chat.chat.completions.create(model=model, max_tokens=1, tools=tools, messages=turns).usage
        assert usage is not None
        return usage.prompt_tokens

    def responses_tokens(*reasoning: dict[str, Any]) -> int:
        items: Any = [question, *reasoning,
                      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": args},
                      {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}]  # fmt: skip
        tools: Any = [{"type": "function", "name": "get_weather", "parameters": params}]
        usage = chat.responses.create(model=model, max_output_tokens=16, tools=tools, input=items).usage
        assert usage is not None
        return usage.input_tokens

    item = {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": thought}]}
    shown = (claude_tokens({"type": "thinking", "thinking": thought, "signature": ""}) - claude_tokens(),
             chat_tokens(reasoning_content=thought) - chat_tokens(), responses_tokens(item) - responses_tokens(),
             chat_tokens(reasoning=thought) - chat_tokens())  # (vLLM's newer and OpenRouter's name for it)
    assert shown[0] > len(thought.split()) and len(set(shown)) == 1, shown
