"""A reasoning model's thought is split from its answer on the tokens of its markers: the thought
comes as ThoughtDelta events and counts in Finished.thought_tokens, the answer as TextDelta; a
budget closes the thought; the chat template's switch is passed through; stop sequences, log
probabilities, grammars and plain completions belong to the answer alone (a grammar holds the
answer after a thought that runs free). The tiny SmolLM3 fixture
has `<think>` and `</think>` as tokens of its own and a template that writes them; the tiny gpt-oss
writes harmony's messages. Their random weights never close a thought by themselves, so a thought
is opened by the prompt (as DeepSeek-R1's distills' templates and an assistant prefill do) and
closed by the budget."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import firmware
from appliance.engine import Engine, EngineConfig, Finished, GenerationRequest, InvalidRequest, Message, TextDelta
from appliance.engine.reasoning import (
    MAX_BLANK_TOKENS,
    MAX_HEADER_TOKENS,
    ChannelSplit,
    Gate,
    Harmony,
    MarkerSplit,
    TagSplit,
    TextMarker,
    ThinkTags,
)
from appliance.engine.request import Event, ThoughtDelta, TokenLogprob
from appliance.engine.tools import CallArguments, CallStart, OutputRules, Tool, ToolChoice

QUESTION = Message("user", "Explain the for statement and the else clause of a loop.")
PREFILLED = (QUESTION, Message("assistant", "<think>\n"))  # the prompt opens the thought


@pytest.fixture(scope="module")
def engine(trusted_keys: Path) -> Iterator[Engine]:
    from firmware.toolchain.tiny import tiny_bundle

    eng = Engine(firmware.load(tiny_bundle("smollm3"), trusted_keys), EngineConfig(intra_op_threads=1))
    yield eng
    eng.close()


def _run(engine: Engine, request: GenerationRequest) -> tuple[str, str, Finished, list[Event]]:
    async def go() -> list[Event]:
        return [e async for e in engine.submit(request)]

    events = asyncio.run(go())
    done = events[-1]
    assert isinstance(done, Finished)
    thought = "".join(e.text for e in events if isinstance(e, ThoughtDelta))
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    return thought, answer, done, events


def _ask(max_tokens: int, **fields: object) -> GenerationRequest:
    return GenerationRequest(messages=PREFILLED, max_tokens=max_tokens, temperature=0, **fields)  # type: ignore[arg-type]


def test_the_split_follows_the_tags_and_only_a_first_open_tag_opens_a_thought() -> None:
    tags = ThinkTags(open_id=1, close_id=2)
    split = TagSplit(tags)
    assert [split.take(t) for t in (1, 5, 6, 2, 7, 1, 2)] == [
        "tag", "thought", "thought", "tag", "answer", "answer", "answer"]  # fmt: skip
    assert split.tokens == 4 and not split.thinking and split.answered
    late = TagSplit(tags)
    assert [late.take(t) for t in (7, 1, 5)] == ["answer"] * 3  # an answer that writes the tag is answer
    inside = tags.split([9, 1], budget=3)
    assert inside.forced() is None and inside.take(5) == "thought"
    assert inside.forced() is None and inside.take(6) == "thought"
    assert inside.forced() == 2 and inside.take(2) == "tag" and inside.forced() is None
    assert tags.inside([9, 1, 5]) and not tags.inside([1, 5, 2, 9]) and not tags.inside([9])


# Harmony's markers, and one-token names: start 1, channel 2, message 3, end 4; "analysis" 10,
# "assistant" 11, "final" 12, "commentary" 13.
HARMONY = Harmony(start=1, channel=2, message=3, end=4, analysis=(10,), final_header=(1, 11, 2, 12, 3),
                  commentary=(13,))


def test_harmony_channels_split_the_analysis_from_the_final_answer() -> None:
    split = HARMONY.split([7, 1, 11], budget=None)  # the generation prompt: <|start|>assistant
    tokens = [2, 10, 3, 20, 21, 4, 1, 11, 2, 12, 3, 30, 31]
    assert [split.take(t) for t in tokens] == [
        "tag", "tag", "tag", "thought", "thought", "tag", "tag", "tag", "tag", "tag", "tag", "answer", "answer"]
    assert split.tokens == 11 and split.answered
    straight = HARMONY.split([7, 1, 11], budget=None)  # no analysis: the final channel first
    assert [straight.take(t) for t in (2, 12, 3, 30)] == ["tag"] * 3 + ["answer"] and not straight.answered
    other = HARMONY.split([7, 1, 11], budget=None)  # any other channel is answer too
    assert [other.take(t) for t in (2, 13, 3, 30)] == ["tag"] * 3 + ["answer"]
    bare = HARMONY.split([7, 1, 11], budget=None)  # a model that writes no header: its text is answer
    assert [bare.take(30) for _ in range(MAX_HEADER_TOKENS)] == ["tag"] * MAX_HEADER_TOKENS
    assert bare.take(30) == "answer"
    between = HARMONY.split([7, 4], budget=None)  # after a message's end, text before a <|start|> is answer
    assert between.take(30) == "answer"


def test_harmony_prompts_that_end_inside_a_message_and_the_budget() -> None:
    assert HARMONY.split([1, 11, 2, 10, 3, 20], budget=None).thinking  # a prefilled analysis
    assert not HARMONY.split([1, 11, 2, 12, 3, 20], budget=None).thinking  # a prefilled final answer
    split = HARMONY.split([1, 11, 2, 10, 3], budget=3)
    assert isinstance(split, ChannelSplit)
    assert split.take(20) == "thought" and split.take(21) == "thought"
    forced = []
    while (token := split.forced()) is not None:
        forced.append(token)
        assert split.take(token) == "tag"
    assert forced == [4, 1, 11, 2, 12, 3] and split.take(30) == "answer" and split.tokens == 8


def test_the_tags_are_found_where_the_vocabulary_has_them_and_the_template_writes_them(engine: Engine) -> None:
    tok = engine.tokenizer
    assert engine.thought_format == ThinkTags(tok.token_id("<think>"), tok.token_id("</think>"))  # type: ignore[arg-type]
    assert ThinkTags.of(tok, "{{ messages }}") is None  # a template that never writes them


@pytest.mark.parametrize(("open_tag", "close_tag", "template"), [
    ("[THINK]", "[/THINK]", "{{ system }}Write your thought between [THINK] and [/THINK]."),  # Magistral
    ("<|inner_prefix|>", "<|inner_suffix|>", "{%- set inner_token = '<|inner_prefix|>' -%}"),  # Apertus' deliberation
    ("<|START_THINKING|>", "<|END_THINKING|>", "{{ '<|START_THINKING|>' + message.tool_plan }}"),  # Command R7B's
])  # fmt: skip
def test_other_families_tags_are_found_as_well(engine: Engine, tmp_path: Path, open_tag: str, close_tag: str,
                                               template: str) -> None:  # fmt: skip
    from tokenizers import Tokenizer

    from appliance.engine.tokenizer import TextTokenizer

    vocab = Tokenizer.from_file(str(engine.bundle.tokenizer_path))
    vocab.add_special_tokens([open_tag, close_tag])
    vocab.save(str(tmp_path / "tokenizer.json"))
    tok = TextTokenizer(tmp_path / "tokenizer.json", tmp_path / "absent.json")
    tags = ThinkTags.of(tok, template)
    assert tags is not None and (tags.open_id, tags.close_id) == (tok.token_id(open_tag), tok.token_id(close_tag))
    assert tok.encode("\n\n")[0][0] in tags.blank_ids


def test_the_template_switch_is_passed_and_left_unset_by_default(engine: Engine) -> None:
    def prompt(thinking: bool | None) -> str:
        return engine.prepare(GenerationRequest(messages=(QUESTION,), thinking=thinking)).text

    assert prompt(False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert prompt(True).endswith("<|im_start|>assistant\n") and prompt(None) == prompt(True)


def test_a_template_that_reads_a_thinking_budget_gets_the_request_s_and_none_when_thinking_is_off(
        engine: Engine) -> None:  # fmt: skip
    """Seed-OSS's template reads `thinking_budget`, not a switch: 0 closes the thought in the prompt."""
    from appliance.engine.chat import ChatTemplate

    template = ChatTemplate("{{ 'budget=' ~ (thinking_budget if thinking_budget is defined else 'unset') }}"
                            "{% for m in messages %}{{ m.content }}{% endfor %}", engine.tokenizer)  # fmt: skip
    for thinking, budget, said in ((None, None, "unset"), (False, None, "0"), (True, 512, "512"), (None, 64, "64")):
        assert template.prompt((QUESTION,), thinking=thinking, budget=budget).text.startswith(f"budget={said}")
    own, engine.template = engine.template, template  # the request's budget, as the engine renders it
    try:
        rendered = engine.prepare(GenerationRequest(messages=(QUESTION,), thinking_budget=300)).text
        assert rendered.startswith("budget=300")
    finally:
        engine.template = own


def test_a_prompt_that_opens_a_thought_streams_it_apart_until_max_tokens(engine: Engine) -> None:
    thought, answer, done, _ = _run(engine, _ask(24))
    assert thought and answer == ""
    assert done.stop_reason == "max_tokens" and done.output_tokens == done.thought_tokens == 24


def test_the_budget_closes_the_thought_and_the_answer_follows(engine: Engine) -> None:
    thought, answer, done, _ = _run(engine, _ask(40, thinking_budget=10))
    assert thought and answer
    assert done.thought_tokens == 10 and done.output_tokens == 40  # 9 of thought, the forced close, 30 of answer
    assert "</think>" not in thought + answer and answer == answer.lstrip()
    alone, _, _, _ = _run(engine, _ask(9))
    assert thought == alone  # greedy: the budget cut the same thought short, it changed none of it


def test_thinking_switched_off_closes_a_thought_the_prompt_opens_all_the_same(engine: Engine) -> None:
    # (DeepSeek-R1's distills' templates open one whatever the switch; here a prefill does)
    thought, answer, done, _ = _run(engine, _ask(20, thinking=False))
    assert thought == "" and answer and done.thought_tokens == 1  # the close tag, at once
    assert "</think>" not in answer


def test_stop_sequences_and_log_probabilities_belong_to_the_answer(engine: Engine) -> None:
    thought, answer, _, _ = _run(engine, _ask(40, thinking_budget=10))
    word = next(w for w in thought.split() if len(w) > 2 and w not in answer)
    thought2, answer2, done, events = _run(engine, _ask(40, thinking_budget=10, stop_sequences=(word,), logprobs=0))
    assert (thought2, answer2, done.stop_reason) == (thought, answer, "max_tokens")  # the thought does not stop it
    assert sum(isinstance(e, TokenLogprob) for e in events) == 30  # one per answer token
    cut = answer[5:9]
    _, answer3, done3, _ = _run(engine, _ask(40, thinking_budget=10, stop_sequences=(cut,)))
    assert done3.stop_reason == "stop_sequence" and answer3 == answer[: answer.index(cut)]


# An answer the grammar leaves one choice in: {"ok": true} or {"ok": false}.
OK = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}


def test_a_plain_completion_is_all_answer(engine: Engine) -> None:
    request = GenerationRequest(messages=(), raw_prompt="<think>\nA loop", max_tokens=12, temperature=0)
    thought, answer, done, _ = _run(engine, request)
    assert thought == "" and answer and done.thought_tokens == 0


def test_under_a_grammar_the_thought_runs_free_and_the_answer_is_held(engine: Engine) -> None:
    def free(request: GenerationRequest) -> str:
        """The greedy text of the request's own prompt, held by nothing (a plain completion)."""
        text = engine.prepare(request).text
        return _run(engine, GenerationRequest(messages=(), raw_prompt=text, max_tokens=9, temperature=0))[1]

    schema = _ask(40, thinking_budget=10, output=OutputRules(json_schema=OK))
    thought, answer, done, _ = _run(engine, schema)
    assert thought == free(schema)  # the grammar held none of the thought
    assert json.loads(answer) in ({"ok": True}, {"ok": False}) and done.stop_reason == "end_turn"
    assert done.thought_tokens == 10
    off = GenerationRequest(messages=(QUESTION,), max_tokens=40, temperature=0, thinking=False,
                            output=OutputRules(json_schema=OK))  # fmt: skip
    thought, answer, done, _ = _run(engine, off)  # the template's empty thought: the grammar from the first token
    assert thought == "" and done.thought_tokens == 0 and json.loads(answer) in ({"ok": True}, {"ok": False})
    tool = Tool("record", "Record the verdict.", OK)
    rules = OutputRules(tools=(tool,), choice=ToolChoice("required"))
    called = _ask(120, thinking_budget=10, output=rules)
    thought, answer, done, events = _run(engine, called)
    assert thought == free(called) and answer == "" and done.stop_reason == "tool_use"
    assert [e.name for e in events if isinstance(e, CallStart)] == ["record"]
    assert json.loads("".join(e.json for e in events if isinstance(e, CallArguments))) in ({"ok": True}, {"ok": False})


def test_under_a_grammar_the_first_token_may_open_a_thought_and_blank_lines_may_follow_one() -> None:
    split = ThinkTags(open_id=1, close_id=2, blank_ids=frozenset({8})).split([9], budget=None)
    assert split.gate() == Gate(grammar=True, also=frozenset({1, 8}))  # (a blank line before it: below)
    split.take(1)
    assert split.gate().free and not split.gate().grammar
    split.take(5)
    split.take(2)
    assert split.gate() == Gate(grammar=True, also=frozenset({8}))  # the blank lines after the close tag
    split.take(8)
    assert split.gate() == Gate(grammar=True, also=frozenset({8}))
    split.take(7)
    assert split.gate() == Gate(grammar=True)  # the answer began: all the grammar's
    straight = ThinkTags(open_id=1, close_id=2).split([9], budget=None)
    straight.take(7)
    assert straight.gate() == Gate(grammar=True)
    # Thinking switched off: the template closed an empty thought, and the turn opens no other.
    tags = ThinkTags(open_id=1, close_id=2, blank_ids=frozenset({8}))
    assert tags.split([9, 1, 8, 2, 8], budget=None).gate() == Gate(grammar=True)
    assert tags.split([9, 1, 8, 2, 8], budget=None).take(1) == "answer"
    earlier = tags.split([1, 5, 2, 9], budget=None)  # an earlier turn's thought: this one may open its own
    assert earlier.gate() == Gate(grammar=True, also=frozenset({1, 8}))


def test_blank_lines_before_the_open_tag_are_the_tag_s_and_the_thought_still_opens() -> None:
    """GLM-4.5's templates write its turns "<|assistant|>\n<think>": the newline its first token, then
    the open tag. The blank lines are the tag's (not shown, fed to no grammar), two at most."""
    tags = ThinkTags(open_id=1, close_id=2, blank_ids=frozenset({8}))
    split = tags.split([9], budget=None)
    assert [split.take(t) for t in (8, 1, 5, 2)] == ["tag", "tag", "thought", "tag"] and split.answered
    direct = tags.split([9], budget=None)
    assert [direct.take(t) for t in (8, 8)] == ["tag", "tag"]
    assert direct.gate() == Gate(grammar=True, also=frozenset({1}))  # a third blank is the grammar's to allow
    assert [direct.take(t) for t in (8, 1)] == ["answer", "answer"]  # and begins the answer: no thought opens


def test_under_a_grammar_a_harmony_header_opens_the_analysis_or_the_final_answer() -> None:
    split = HARMONY.split([7, 1, 11], budget=None)
    gates = []
    for token in (2, 10, 3, 20, 4, 1, 11, 2, 12, 3):
        gates.append(split.gate())
        split.take(token)
    assert [sorted(g.also) for g in gates] == [[2], [10, 12], [3], [], [], [1], [11], [2], [12], [3]]
    assert not any(g.grammar for g in gates) and gates[3].free and gates[4].free
    assert split.gate() == Gate(grammar=True)  # the final channel's text
    final = HARMONY.split([7, 1, 11], budget=None)
    for token in (2, 12, 3):
        final.take(token)
    assert final.gate() == Gate(grammar=True) and not final.answered


def test_where_calls_are_allowed_a_harmony_header_may_open_one_and_the_calls_grammar_holds_the_rest() -> None:
    auto = HARMONY.split([7, 1, 11], budget=None, calls="auto")
    assert auto.take(2) == "tag" and auto.gate().also == {10, 12, 13}  # analysis, final or commentary
    assert auto.take(13) == "tag" and auto.calling and auto.gate() == Gate(grammar=True)
    assert auto.take(40) == "answer" and auto.take(3) == "answer"  # " to=functions.x", <|message|>: the call's
    required = HARMONY.split([7, 1, 11], budget=None, calls="required")
    assert required.take(2) == "tag" and required.gate().also == {10, 13}  # no final answer: think, or call
    for token in (10, 3, 20):
        required.take(token)
    assert required.thinking and required.gate().free and not required.calling
    after = HARMONY.split([7, 1, 11], budget=None, calls="required")
    for token in (2, 10, 3, 20, 4, 1, 11, 2):  # a thought, then the next header: only a call may follow
        after.take(token)
    assert after.gate() == Gate(grammar=False, also=frozenset({13}))
    spent = HARMONY.split([1, 11, 2, 10, 3], budget=2, calls="required")
    assert spent.take(20) == "thought"
    forced = []
    while (token := spent.forced()) is not None:  # the budget closes the thought and opens a call
        forced.append(token)
        spent.take(token)
    assert forced == [4, 1, 11, 2, 13] and spent.calling
    assert not HARMONY.split([7, 1, 11], budget=None).calling  # (calls not allowed: none is opened)


def test_a_model_without_tags_is_untouched(tiny_bundle_path: Path, trusted_keys: Path) -> None:
    eng = Engine(firmware.load(tiny_bundle_path, trusted_keys), EngineConfig(intra_op_threads=1))
    try:
        assert eng.thought_format is None
        _, answer, done, _ = _run(eng, GenerationRequest(messages=(QUESTION,), max_tokens=12, temperature=0,
                                                         thinking=True, thinking_budget=4))  # fmt: skip
        assert answer and done.thought_tokens == 0
    finally:
        eng.close()


@pytest.mark.parametrize("budget", [0, 1, True, 2.5])
def test_a_budget_below_the_tags_is_refused(engine: Engine, budget: object) -> None:
    with pytest.raises(InvalidRequest) as err:
        engine.prepare(_ask(8, thinking_budget=budget))
    assert err.value.param == "thinking_budget"


@pytest.fixture(scope="module")
def gpt_oss(trusted_keys: Path) -> Iterator[Engine]:
    from firmware.toolchain.tiny import tiny_bundle

    eng = Engine(firmware.load(tiny_bundle("gpt_oss"), trusted_keys), EngineConfig(intra_op_threads=1))
    yield eng
    eng.close()


def test_gpt_oss_analysis_is_the_thought_and_the_final_channel_the_answer(gpt_oss: Engine) -> None:
    fmt = gpt_oss.thought_format
    assert isinstance(fmt, Harmony)
    assert "Reasoning: high" in gpt_oss.prepare(GenerationRequest(messages=(QUESTION,), reasoning_effort="high")).text
    analysis = Message("assistant", "<|channel|>analysis<|message|>Let me think")  # a prefilled analysis
    request = GenerationRequest(messages=(QUESTION, analysis), max_tokens=40, temperature=0, thinking_budget=10)
    thought, answer, done, events = _run(gpt_oss, request)
    assert thought and answer and done.output_tokens == 40
    # 9 of analysis, then the budget's <|end|> and the final channel's header (not shown), then the answer
    assert done.thought_tokens == 9 + 1 + len(fmt.final_header)
    kinds = [type(e).__name__ for e in events if isinstance(e, TextDelta | ThoughtDelta)]
    assert kinds == sorted(kinds, key=lambda k: k != "ThoughtDelta")  # the thought, then the answer
    alone, _, _, _ = _run(gpt_oss, dataclasses.replace(request, thinking_budget=None, max_tokens=9))
    assert thought == alone


def test_gpt_oss_text_with_no_header_is_answer(gpt_oss: Engine) -> None:
    # The tiny model's random weights write no channel: after a header's length of tokens, text.
    _, answer, done, _ = _run(gpt_oss, GenerationRequest(messages=(QUESTION,), max_tokens=24, temperature=0))
    assert answer and done.thought_tokens == MAX_HEADER_TOKENS


def test_gpt_oss_under_a_grammar_thinks_then_answers_in_the_final_channel(gpt_oss: Engine) -> None:
    # The generation prompt ends in `<|start|>assistant`: the header may only open the analysis or
    # the final channel, and after a thought only the final one; the final channel's text is the grammar's.
    schema = OutputRules(json_schema=OK)
    for opener in ((QUESTION,), (QUESTION, Message("assistant", "<|channel|>analysis<|message|>Let me think"))):
        request = GenerationRequest(messages=opener, max_tokens=60, temperature=0, thinking_budget=10, output=schema)
        thought, answer, done, _ = _run(gpt_oss, request)
        assert json.loads(answer) in ({"ok": True}, {"ok": False}) and done.stop_reason == "end_turn"
        assert "<|" not in thought + answer


CITY = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}
CITIES = Tool("get_weather", "The weather in a city now.", CITY)
ANALYSIS = Message("assistant", "<|channel|>analysis<|message|>Let me think")  # a prefilled analysis


@pytest.mark.parametrize("choice", [ToolChoice("required"), ToolChoice("tool", "get_weather"), ToolChoice("auto")])
def test_gpt_oss_calls_a_tool_in_a_commentary_message_of_its_own(gpt_oss: Engine, choice: ToolChoice) -> None:
    """As gpt-oss was trained to: `<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>`
    and the arguments, after a thought or without one; the header and markers never reach the client."""
    rules = OutputRules((CITIES, Tool("get_time", "The time now.", {"type": "object", "properties": {}})), choice)
    for opener in ((QUESTION,), (QUESTION, ANALYSIS)):
        request = GenerationRequest(messages=opener, max_tokens=60, temperature=0, thinking_budget=10, output=rules,
                                    logprobs=0)  # fmt: skip
        thought, answer, done, events = _run(gpt_oss, request)
        calls = [e.name for e in events if isinstance(e, CallStart)]
        if choice.mode == "auto" and not calls:  # a text answer in the final channel
            assert answer and done.stop_reason in ("end_turn", "max_tokens")
            continue
        assert calls == ["get_weather"] if choice.mode == "tool" else len(calls) == 1
        arguments = json.loads("".join(e.json for e in events if isinstance(e, CallArguments)))
        assert arguments in ({"city": "Paris"}, {"city": "Rome"}) if calls == ["get_weather"] else arguments == {}
        assert done.stop_reason == "tool_use" and answer == "" and "<|" not in thought
        # The answer's tokens are the call's message after its channel's name (decoding drops the markers).
        written = "".join(e.token for e in events if isinstance(e, TokenLogprob))
        assert written.lstrip().startswith(f"to=functions.{calls[0]} json{{")


def test_gemma4_thinks_in_a_channel_whose_name_is_no_part_of_the_thought(trusted_keys: Path) -> None:
    """Gemma 4 writes `<|channel>thought\n` the thought `<channel|>` the answer; with thinking off its
    generation prompt closes an empty one."""
    from firmware.toolchain.tiny import tiny_bundle

    eng = Engine(firmware.load(tiny_bundle("gemma4"), trusted_keys), EngineConfig(intra_op_threads=1))
    try:
        tok, fmt = eng.tokenizer, eng.thought_format
        assert isinstance(fmt, ThinkTags) and fmt.open_id == tok.token_id("<|channel>")
        assert fmt.label_ids == tuple(tok.encode("thought\n")[0])
        written = [fmt.open_id, *fmt.label_ids, *tok.encode("Two and two.")[0], fmt.close_id,
                   *tok.encode("Four")[0]]  # fmt: skip
        off = eng.prepare(GenerationRequest(messages=(QUESTION,), thinking=False))
        on = eng.prepare(GenerationRequest(messages=(QUESTION,), thinking=True))
        assert off.text.endswith("<|turn>model\n<|channel>thought\n<channel|>") and "<|think|>" in on.text
        split = fmt.split(on.ids, budget=None)
        kinds = [split.take(t) for t in written]
        thought = tok.decode([t for t, k in zip(written, kinds, strict=True) if k == "thought"])
        answer = tok.decode([t for t, k in zip(written, kinds, strict=True) if k == "answer"])
        assert (thought, answer) == ("Two and two.", "Four") and split.answered
        assert [fmt.split(off.ids, budget=None).take(t) for t in written[:2]] == ["answer", "answer"]
        # A thought that does not name its channel is all thought.
        unnamed = fmt.split(on.ids, budget=None)
        assert [unnamed.take(t) for t in (fmt.open_id, *tok.encode("Two")[0])][1:] == ["thought"] * len(
            tok.encode("Two")[0])
        # The engine streams it apart: the name, like the tags, is shown nowhere.
        thought, answer, done, _ = _run(eng, GenerationRequest(messages=(QUESTION, Message(
            "assistant", "<|channel>")), max_tokens=12, temperature=0, thinking=True, thinking_budget=6))
        assert done.thought_tokens == 6 and "thought\n" not in thought + answer
    finally:
        eng.close()


def test_a_text_marker_s_split_forces_the_marker_s_tokens_and_the_generation_ends_the_thought() -> None:
    marker = TextMarker("[END]", "", opening_ids=(3, 4), close_ids=(8, 9, 10), blank_ids=frozenset({8}))
    assert not marker.split([4, 3], budget=None).thinking and marker.split([9, 3, 4], budget=None).thinking
    split = marker.split([9, 3, 4], budget=5)
    assert split.gate().free and split.forced() is None and split.take(20) == "thought"
    assert split.take(21) == "thought" and split.forced() == 8  # the budget: the marker's tokens, then the answer
    assert [split.take(t) for t in (8, 9)] == ["thought"] * 2 and split.forced() == 10
    assert split.take(10) == "thought" and split.tokens == 5 and split.forced() is None
    split.end()  # the generation found the marker in the text of the last
    assert split.gate() == Gate(grammar=True, also=frozenset({8}))  # the blank lines after the marker are its own
    assert [split.take(8) for _ in range(MAX_BLANK_TOKENS)] == ["answer"] * MAX_BLANK_TOKENS
    assert split.gate() == Gate(grammar=True)  # past them, all the grammar's
    free = marker.split([3, 4], budget=None)
    assert isinstance(free, MarkerSplit) and [free.take(t) for t in (20, 9, 10)] == ["thought"] * 3
    free.end()  # the generation found the marker in the thought's text
    assert (free.thinking, free.answered, free.take(20)) == (False, True, "answer")
    assert free.gate() == Gate(grammar=True)


@pytest.fixture(scope="module")
def apriel(trusted_keys: Path) -> Iterator[Engine]:
    """The tiny LLaVA, with Apriel 1.6's template: its generation prompt opens a thought written as
    text (\"Here are my reasoning steps:\"), which "[BEGIN FINAL RESPONSE]" ends."""
    from firmware.toolchain.tiny import tiny_bundle

    eng = Engine(firmware.load(tiny_bundle("llava"), trusted_keys), EngineConfig(intra_op_threads=1))
    yield eng
    eng.close()


def test_a_thought_written_as_text_is_streamed_apart_until_its_marker(apriel: Engine) -> None:
    fmt = apriel.thought_format
    assert isinstance(fmt, TextMarker) and (fmt.marker, fmt.answer_end) == ("[BEGIN FINAL RESPONSE]", "")
    ask = GenerationRequest(messages=(QUESTION,), max_tokens=90, temperature=0, thinking_budget=50)
    thought, answer, done, events = _run(apriel, ask)
    assert thought and answer and done.thought_tokens == 50 and done.output_tokens == 90
    assert "BEGIN" not in thought + answer and thought == thought.rstrip() and answer == answer.lstrip()
    kinds = [type(e).__name__ for e in events if isinstance(e, TextDelta | ThoughtDelta)]
    assert kinds == sorted(kinds, key=lambda k: k != "ThoughtDelta")  # the thought, then the answer
    free = 50 - len(fmt.close_ids)  # the budget's marker is forced after this many tokens of thought
    alone, none, _, _ = _run(apriel, dataclasses.replace(ask, thinking_budget=None, max_tokens=free))
    assert (thought, none) == (alone, "")  # greedy: the budget cut the same thought short
    # Under a grammar the thought runs free and the answer is held; a prefilled answer is all answer.
    held = dataclasses.replace(ask, output=OutputRules(json_schema=OK))
    thought2, answer2, done2, _ = _run(apriel, held)
    assert thought2 and done2.thought_tokens == 50 and "BEGIN" not in thought2
    assert json.loads(answer2) in ({"ok": True}, {"ok": False}) and done2.stop_reason == "end_turn"
    prefilled = GenerationRequest(messages=(QUESTION, Message("assistant", "The for statement")), max_tokens=8,
                                  temperature=0)  # fmt: skip
    thought3, answer3, done3, _ = _run(apriel, prefilled)
    assert thought3 == "" and answer3 and done3.thought_tokens == 0
    # Its template has no switch: thinking off, the marker comes at once.
    thought4, answer4, done4, _ = _run(apriel, dataclasses.replace(ask, thinking=False, thinking_budget=None))
    assert thought4 == "" and answer4 and done4.thought_tokens == len(fmt.close_ids)


def test_the_end_a_template_asks_an_answer_for_ends_the_turn_and_is_shown_nowhere(apriel: Engine) -> None:
    """Apriel 1.5's template asks for the answer between [BEGIN FINAL RESPONSE] and [END FINAL
    RESPONSE]: the second ends the turn, as the end of the turn would (the tiny model never writes
    it: a piece of its own answer stands in for it)."""
    fmt = apriel.thought_format
    assert isinstance(fmt, TextMarker)
    v15 = apriel.template.spelled.replace("[BEGIN FINAL RESPONSE].", "[BEGIN FINAL RESPONSE] ... [END FINAL RESPONSE].")
    ended = TextMarker.of(apriel.tokenizer, v15, apriel.template.generation_prompt)
    assert ended == dataclasses.replace(fmt, answer_end="[END FINAL RESPONSE]")
    ask = GenerationRequest(messages=(QUESTION,), max_tokens=90, temperature=0, thinking_budget=50)
    _, answer, _, _ = _run(apriel, ask)
    cut = answer[6:10]
    try:
        apriel.thought_format = dataclasses.replace(fmt, answer_end=cut)
        _, cut_short, done, _ = _run(apriel, ask)
        assert cut_short == answer[: answer.index(cut)] and (done.stop_reason, done.stop_sequence) == ("end_turn", None)
        stop = answer[2:5]
        _, stopped, done, _ = _run(apriel, dataclasses.replace(ask, stop_sequences=(stop,)))
        assert (stopped, done.stop_reason) == (answer[: answer.index(stop)], "stop_sequence")  # the request's own
    finally:
        apriel.thought_format = fmt


def test_a_client_s_template_variables_reach_the_chat_template(engine: Engine) -> None:
    """chat_template_kwargs as vLLM passes them: SmolLM3's template reads `enable_thinking` (and its
    `/no_think` in the system prompt) whether it comes as the switch or as a variable; the
    switch, where both are given, decides; names the engine gives the template are refused."""
    plain = Message("user", "Hi."),
    off = engine.prepare(GenerationRequest(messages=plain, thinking=False)).ids
    on = engine.prepare(GenerationRequest(messages=plain, thinking=True)).ids
    assert off != on
    as_variable = GenerationRequest(messages=plain, template_variables=(("enable_thinking", False),))
    assert engine.prepare(as_variable).ids == off
    overridden = dataclasses.replace(as_variable, thinking=True)
    assert engine.prepare(overridden).ids == on
    for name in ("messages", "bos_token", "not a name"):
        with pytest.raises(InvalidRequest) as err:
            engine.prepare(GenerationRequest(messages=plain, template_variables=((name, 1),)))
        assert err.value.param == "chat_template_kwargs"
