"""Tools, structured output and prefill: the grammar and call parser alone, constrained rows in a
real batch on the tiny model, and the official clients against the demo firmware (every call and
every structured answer validates against its schema)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import numpy as np
import openai
import pytest
from answers import finished, sse_events
from clients import MODEL, anthropic_client, openai_client
from daemon_thread import RunningDaemon
from tool_cases import CASES, TOOLS

import firmware
from appliance.api.anthropic import ANTHROPIC
from appliance.api.dialect import Call
from appliance.api.errors import ApiError
from appliance.api.openai import OPENAI
from appliance.api.tools import Answer, CallOut
from appliance.devsetup import DevSetup
from appliance.engine import Engine, EngineConfig, Finished, GenerationRequest, Message, TextDelta
from appliance.engine.chat import spelled_out
from appliance.engine.constraint import GrammarCompiler
from appliance.engine.errors import InvalidRequest
from appliance.engine.sampling import Sampler, penalize
from appliance.engine.tools import (
    HERMES,
    LLAMA3_JSON,
    QWEN_XML,
    CallArguments,
    CallFormat,
    CallParser,
    CallStart,
    OutputRules,
    PastCall,
    RepeatGuard,
    TextPart,
    Tool,
    ToolChoice,
    call_format,
    call_parser,
    format_calls,
    grammar,
    schema_block,
)

WEATHER = Tool("get_weather", "Weather in a city", {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]})  # fmt: skip
CLOCK = Tool("get_time", "The time", {})


# --- the format, the grammar and the parser, without a model ----------------------------------


def format_call(name: str, arguments: dict[str, Any] | str, fmt: CallFormat = HERMES) -> str:
    return fmt.format(name, arguments if isinstance(arguments, str) else json.dumps(arguments))


def _parse(output: str, chunk: int, calls_only: bool = False, fmt: CallFormat = HERMES,
           tools: tuple[Tool, ...] = ()) -> tuple[str, list[tuple[str, str]], int]:  # fmt: skip
    """`output` as the model writes it, through the parser as the engine feeds it: a format's
    marker token, where the output begins with it, is told (`mark`), and decoding drops its
    special tokens."""
    parser, text, calls = call_parser(fmt, calls_only, tools), "", []
    if fmt.marker and output.startswith(fmt.marker):
        parser.mark()
    output = fmt.visible(output)
    pieces = [output[i : i + chunk] for i in range(0, len(output), chunk)]
    for part in [p for piece in pieces for p in parser.push(piece)] + parser.flush():
        if isinstance(part, TextPart):
            text += part.text
        elif isinstance(part, CallStart):
            calls.append((part.name, ""))
        elif isinstance(part, CallArguments):
            name, args = calls[part.index]
            calls[part.index] = (name, args + part.json)
    return text, calls, parser.complete


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1000])
def test_the_call_parser_splits_text_and_calls_however_the_output_is_chunked(chunk: int) -> None:
    tricky = {"q": "a } b { \" ] [", "nested": {"list": [1, {"x": "\\"}]}}
    two = format_call("get_weather", {"city": "Paris", "unit": "c"}) + "\n" + format_call("search", tricky)
    assert _parse(two, chunk) == ("", [("get_weather", '{"city": "Paris", "unit": "c"}'),
                                       ("search", json.dumps(tricky))], 2)  # fmt: skip
    assert _parse("Hello <b>there</b> {not a call}", chunk) == ("Hello <b>there</b> {not a call}", [], 0)
    assert _parse("<tool", chunk) == ("<tool", [], 0)  # ended before it could be a call: it was text
    assert _parse("<tool", chunk, calls_only=True) == ("", [], 0)  # only calls allowed: a call cut off, dropped
    cut = format_call("get_weather", {"city": "Paris"}).split("is")[0]  # max_tokens inside the arguments
    text, calls, complete = _parse(cut, chunk)
    assert text == "" and calls == [("get_weather", '{"city": "Par')] and complete == 0


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_mistral_calls_are_parsed_after_its_marker(chunk: int) -> None:
    mistral = call_format("[TOOL_CALLS]", {"[TOOL_CALLS]": 7}.get)
    paris, tricky = '{"city": "Paris", "unit": "c"}', '{"q": "a ] b", "list": [1, "}"]}'
    calls = [PastCall("get_weather", paris), PastCall("search", tricky)]
    written = format_calls(calls, mistral)
    assert written == f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {paris}}}, {{"name": "search", ' \
                      f'"arguments": {tricky}}}]'
    two = [("get_weather", paris), ("search", tricky)]
    assert _parse(written, chunk, fmt=mistral) == ("", two, 2)
    assert _parse(written.replace("] [", "]["), chunk, fmt=mistral)[1:] == (two, 2)  # the first space dropped
    assert _parse("[1, 2] are numbers", chunk, fmt=mistral) == ("[1, 2] are numbers", [], 0)
    # Without the marker, what looks like calls is text (the grammar allows no such text anyway).
    assert _parse(mistral.visible(written), chunk, fmt=mistral) == (mistral.visible(written), [], 0)
    assert call_format("[TOOL_CALLS]", {}.get) is HERMES  # no such token
    granite = call_format("{{ '<|tool_call|>' }}", {"<|tool_call|>": 9}.get)  # IBM Granite 3.x's
    assert (granite.name, granite.marker_id) == ("granite", 9)
    written = format_calls(calls, granite)
    assert written.startswith('<|tool_call|>[{"name": "get_weather"') and written.endswith("}]")
    assert _parse(written, chunk, fmt=granite)[1:] == (two, 2)


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_nemotron_calls_are_read_between_its_tags_as_text_or_as_special_tokens(chunk: int) -> None:
    """Nemotron Nano 2 lists a turn's calls between <TOOLCALL> tags: text in a vocabulary that
    decodes them (the parser reads them), special tokens in one that drops them (the marker)."""
    from firmware.toolchain.tiny import NEMOTRON_H_CHAT_TEMPLATE

    ids = {"<TOOLCALL>": 14, "</TOOLCALL>": 15}
    paris = '{"city": "Paris", "unit": "c"}'
    calls = [PastCall("get_weather", paris), PastCall("get_weather", '{"city": "Rome"}')]
    text = call_format(NEMOTRON_H_CHAT_TEMPLATE, ids.get, lambda _: False)
    written = format_calls(calls, text)
    assert (text.name, text.marker) == ("nemotron", "") and written == (
        f'<TOOLCALL>[{{"name": "get_weather", "arguments": {paris}}}, {{"name": "get_weather", '
        '"arguments": {"city": "Rome"}}]</TOOLCALL>')  # fmt: skip
    assert _parse(written, chunk, fmt=text) == ("", [("get_weather", paris), ("get_weather", '{"city": "Rome"}')], 2)
    assert _parse("<TOOL>s are tags", chunk, fmt=text) == ("<TOOL>s are tags", [], 0)
    special = call_format(NEMOTRON_H_CHAT_TEMPLATE, ids.get)
    assert (special.name, special.marker_id) == ("nemotron", 14)
    assert _parse(format_calls(calls, special), chunk, fmt=special)[1:] == (_parse(written, chunk, fmt=text)[1:])


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_apriel_calls_are_read_from_their_list_after_a_line_break(chunk: int) -> None:
    """Apriel lists a turn's calls as Nemotron Nano 2 does, between tags of its own, after a line break."""
    from firmware.toolchain.tiny import APRIEL_CHAT_TEMPLATE

    fmt = call_format(APRIEL_CHAT_TEMPLATE, {}.get)
    paris = '{"city": "Paris", "unit": "c"}'
    written = format_calls([PastCall("get_weather", paris), PastCall("get_time", "{}")], fmt)
    assert (fmt.name, fmt.lead) == ("apriel", "\n") and written == (
        f'<tool_calls>[{{"name": "get_weather", "arguments": {paris}}}, {{"name": "get_time", "arguments": {{}}}}]'
        "</tool_calls>")  # fmt: skip
    for lead in ("", "\n"):  # (after its thought, which the split takes apart)
        assert _parse(lead + written, chunk, fmt=fmt) == ("", [("get_weather", paris), ("get_time", "{}")], 2)
    assert _parse("<tool_calls> are tags", chunk, fmt=fmt) == ("<tool_calls> are tags", [], 0)
    special = call_format(APRIEL_CHAT_TEMPLATE, {"<tool_calls>": 14, "</tool_calls>": 15}.get)
    assert (special.name, special.marker_id, special.lead) == ("apriel", 14, "\n")
    assert call_format(APRIEL_CHAT_TEMPLATE.replace("]</tool_calls>", "]"), {}.get) is HERMES


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_apertus_calls_are_read_keyed_by_their_names_between_its_tokens(chunk: int) -> None:
    from firmware.toolchain.tiny import APERTUS_CHAT_TEMPLATE

    fmt = call_format(APERTUS_CHAT_TEMPLATE, {"<|tools_prefix|>": 20, "<|tools_suffix|>": 21}.get)
    paris = '{"city": "Paris", "unit": "c"}'
    written = format_calls([PastCall("get_weather", paris), PastCall("get_time", "{}")], fmt)
    assert (fmt.name, fmt.marker_id) == ("apertus", 20)
    assert written == f'<|tools_prefix|>[{{"get_weather": {paris}}}, {{"get_time": {{}}}}]<|tools_suffix|>'
    assert _parse(written, chunk, fmt=fmt) == ("", [("get_weather", paris), ("get_time", "{}")], 2)
    # Without the marker, what looks like calls is text (the grammar allows no such text anyway).
    assert _parse('[{"a": {}}] is a list', chunk, fmt=fmt) == ('[{"a": {}}] is a list', [], 0)
    assert call_format(APERTUS_CHAT_TEMPLATE, {}.get) is HERMES  # no such tokens


COMMAND_IDS = {"<|START_ACTION|>": 30, "<|END_ACTION|>": 31, "<|START_RESPONSE|>": 32, "<|END_RESPONSE|>": 33}


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_command_r7b_calls_are_read_numbered_one_to_a_line_between_its_tokens(chunk: int) -> None:
    from firmware.toolchain.tiny import COMMAND_R7B_CHAT_TEMPLATE

    fmt = call_format(COMMAND_R7B_CHAT_TEMPLATE, COMMAND_IDS.get)
    paris = '{"city": "Paris", "unit": "c"}'
    written = format_calls([PastCall("get_weather", paris), PastCall("get_time", "{}")], fmt)
    assert (fmt.name, fmt.marker_id) == ("command", 30)
    assert written == ('<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": '
                       f'{paris}}},\n    {{"tool_call_id": "1", "tool_name": "get_time", "parameters": {{}}}}\n]'
                       "<|END_ACTION|>")  # fmt: skip
    two = [("get_weather", paris), ("get_time", "{}")]
    assert _parse(written, chunk, fmt=fmt) == ("", two, 2)
    # The model numbers its calls on from the conversation's earlier ones.
    assert _parse(written.replace('"0"', '"12"').replace('"1"', '"13"'), chunk, fmt=fmt) == ("", two, 2)
    for not_an_id in ('"c0"', '""', '"12345"'):
        assert _parse(written.replace('"0"', not_an_id), chunk, fmt=fmt)[1] == []
    # Without the marker, what looks like calls is text (the grammar allows no such text anyway).
    assert _parse(fmt.visible(written), chunk, fmt=fmt) == (fmt.visible(written), [], 0)
    assert call_format(COMMAND_R7B_CHAT_TEMPLATE, {}.get) is HERMES  # no such tokens


def test_command_r7b_s_grammar_holds_its_numbered_calls_and_allows_its_text_between_its_response_tokens(
        trusted_keys: Path) -> None:  # fmt: skip
    from firmware.toolchain.tiny import tiny_bundle

    bundle = firmware.load(tiny_bundle("cohere2"), trusted_keys)
    compiler = GrammarCompiler(bundle.tokenizer_path, bundle.model.vocab_size, bundle.model.eos_token_ids)
    engine = Engine(bundle, EngineConfig(intra_op_threads=1))
    try:
        fmt = engine.template.call_format
    finally:
        engine.close()
    assert fmt.name == "command" and fmt.text_wrap is not None
    (_, start), (_, end) = fmt.text_wrap

    def accepts(rules: OutputRules, pieces: list[str | int]) -> bool:
        lark = grammar(rules, fmt)
        assert lark is not None
        constraint = compiler.constraint(lark, "tools" if rules.tools else rules.schema_field)
        tokens = [t for p in pieces for t in ([p] if isinstance(p, int) else compiler.tokenizer.tokenize_str(p))]
        return all(constraint.matcher.consume_token(t) for t in tokens) and bool(constraint.matcher.is_accepting())

    auto = OutputRules((WEATHER, CLOCK))
    action = dict(fmt.specials)["<|START_ACTION|>"], dict(fmt.specials)["<|END_ACTION|>"]
    call = '[\n    {"tool_call_id": "3", "tool_name": "get_time", "parameters": {}}\n]'
    assert accepts(auto, [action[0], call, action[1]])
    assert not accepts(auto, [action[0], call.replace('"3"', '"x"'), action[1]])
    assert accepts(auto, [start, "It is sunny.", end]) and accepts(auto, ["It is sunny."])
    assert not accepts(auto, [start, "It is sunny."])  # opened, so closed
    schema = OutputRules(json_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    assert accepts(schema, [start, '{"n": 3}', end]) and not accepts(schema, [start, "three", end])


def test_lfm2_5_s_template_lists_tools_without_lfm2_s_tokens_and_its_model_writes_python_calls() -> None:
    """LFM2.5-Instruct's template lists the tools as "List of tools: [...]" with no special token
    around them (LFM2's has <|tool_list_start|>); its model writes LFM2's Python calls all the same."""
    lfm25 = '{%- if tools -%}{{ "<|im_start|>system\nList of tools: [" + (tools | map("tojson") | join(", ")) + "]" }}'
    ids = {"<|tool_call_start|>": 10, "<|tool_call_end|>": 11}
    assert call_format(lfm25, ids.get).name == "python"
    assert call_format(lfm25, {}.get) is HERMES  # a vocabulary without LFM2's call tokens: not LFM2's


def test_a_tag_the_tokenizer_decodes_as_text_is_text_to_the_grammar(trusted_keys: Path) -> None:
    """llguidance takes every added token written as a tag for a special one; Nemotron's <TOOLCALL>
    and Qwen's <tool_call> decode as text. A grammar whose text begins with one forced that token
    and then refused it as special: every forced call failed ("the schema is too costly")."""
    from appliance.engine.tokenizer import TextTokenizer
    from firmware.toolchain.tiny import tiny_bundle

    bundle = firmware.load(tiny_bundle("nemotron_h"), trusted_keys)
    compiler = GrammarCompiler(bundle.tokenizer_path, bundle.model.vocab_size, bundle.model.eos_token_ids)
    tokenizer = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    opens, think, eos = (tokenizer.token_id(t) for t in ("<TOOLCALL>", "<think>", "<SPECIAL_12>"))
    assert opens is not None and think is not None and eos is not None
    assert not any(compiler.tokenizer.is_special_token(t) for t in (opens, think))
    assert compiler.tokenizer.is_special_token(eos)
    constraint = compiler.constraint('start: "<TOOLCALL>[" "x"', "tools")
    logits = np.zeros(bundle.model.vocab_size, dtype=np.float32)
    assert np.isfinite(constraint.apply(logits)[opens])
    constraint.accept(opens)  # (refused before: llguidance consumed it as a special token)


KIMI_IDS = {"<|tool_calls_section_begin|>": 40, "<|tool_calls_section_end|>": 41, "<|tool_call_begin|>": 42,
            "<|tool_call_argument_begin|>": 43, "<|tool_call_end|>": 44}


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_kimi_k2_calls_are_read_named_and_numbered_between_its_tokens(chunk: int) -> None:
    """Kimi K2 numbers each call after its name, counting the conversation's calls; decoding drops
    its tokens, so the parser reads `functions.get_weather:12{...}functions.get_time:13{}`."""
    from firmware.toolchain.tiny import KIMI_K2_CHAT_TEMPLATE

    fmt = call_format(KIMI_K2_CHAT_TEMPLATE, KIMI_IDS.get)
    assert (fmt.name, fmt.marker_id) == ("kimi", 40)
    paris, tricky = '{"city": "Paris", "unit": "c"}', '{"q": "a:1 ] b {", "list": [1, "}"]}'
    written = format_calls([PastCall("get_weather", paris), PastCall("search", tricky)], fmt)
    assert written == ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                       f"<|tool_call_argument_begin|>{paris}<|tool_call_end|><|tool_call_begin|>functions.search:1"
                       f"<|tool_call_argument_begin|>{tricky}<|tool_call_end|><|tool_calls_section_end|>")  # fmt: skip
    two = [("get_weather", paris), ("search", tricky)]
    assert _parse(written, chunk, fmt=fmt) == ("", two, 2)
    assert _parse(written.replace(":0<", ":12<").replace(":1<", ":13<"), chunk, fmt=fmt) == ("", two, 2)
    for not_an_id in (":<", ":x<", ":12345<"):  # a call without its number, or with more than CALL_ID_DIGITS
        assert _parse(written.replace(":0<", not_an_id), chunk, fmt=fmt)[1] == []
    cut = written[: written.index("Par")]  # max_tokens inside the first call's arguments
    assert _parse(cut, chunk, calls_only=True, fmt=fmt)[1] == [("get_weather", '{"city": "')]
    # Without the marker, what looks like calls is text.
    assert _parse(fmt.visible(written), chunk, fmt=fmt) == (fmt.visible(written), [], 0)
    assert call_format(KIMI_K2_CHAT_TEMPLATE, {}.get) is HERMES  # a vocabulary without Kimi's tokens
    missing = {token: i for token, i in KIMI_IDS.items() if token != "<|tool_call_argument_begin|>"}
    assert call_format(KIMI_K2_CHAT_TEMPLATE, missing.get) is HERMES


DEEPSEEK_IDS = {"<｜tool▁calls▁begin｜>": 40, "<｜tool▁calls▁end｜>": 41, "<｜tool▁call▁begin｜>": 42,
                "<｜tool▁sep｜>": 43, "<｜tool▁call▁end｜>": 44}


@pytest.mark.parametrize("chunk", [1, 3, 1000])
@pytest.mark.parametrize("special", [True, False])
@pytest.mark.parametrize(("template", "name", "written"), [
    ("DEEPSEEK_R1_CHAT_TEMPLATE", "deepseek",
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{paris}\n```<｜tool▁call▁end｜>"
     "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{tricky}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    ("DEEPSEEK_V31_CHAT_TEMPLATE", "deepseek_v3_1",
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{paris}<｜tool▁call▁end｜>"
     "<｜tool▁call▁begin｜>search<｜tool▁sep｜>{tricky}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
])  # fmt: skip
def test_deepseek_calls_are_read_between_its_tool_tokens(chunk: int, special: bool, template: str, name: str,
                                                         written: str) -> None:  # fmt: skip
    """DeepSeek V3's and R1's calls (a fenced JSON block after the call's type and name) and V3.1's
    (the arguments right after the name), their tokens special (named by id in the grammar) or
    text that decoding keeps: the parser reads them either way."""
    from firmware.toolchain import tiny

    fmt = call_format(getattr(tiny, template), DEEPSEEK_IDS.get, lambda _: special)
    assert fmt.name == name and dict(fmt.specials) == (DEEPSEEK_IDS if special else {})
    paris, tricky = '{"city": "Paris", "unit": "c"}', '{"q": "a\\n```<｜tool▁call▁end｜>", "list": [1, "}"]}'
    written = written.format(paris=paris, tricky=tricky)
    assert format_calls([PastCall("get_weather", paris), PastCall("search", tricky)], fmt) == written
    two = [("get_weather", paris), ("search", tricky)]
    assert _parse(written, chunk, fmt=fmt) == ("", two, 2)
    cut = written[: written.index("Par")]  # max_tokens inside the first call's arguments
    assert _parse(cut, chunk, calls_only=True, fmt=fmt)[1] == [("get_weather", '{"city": "')]
    assert _parse("The tool▁calls token is <｜tool▁calls▁begin｜>.", chunk, fmt=fmt)[1] == []
    rules = grammar(OutputRules((WEATHER,), ToolChoice("required")), fmt)
    assert rules is not None and ("<[40]> call" if special else '"<｜tool▁calls▁begin｜>" call') in rules
    assert call_format(getattr(tiny, template).replace("<｜tool▁sep｜>", "<sep>"), DEEPSEEK_IDS.get) is HERMES


@pytest.mark.parametrize("chunk", [1, 3, 1000])
@pytest.mark.parametrize("ids", [{"｜DSML｜": 50}, {}])
def test_deepseek_v3_2_calls_say_which_parameters_are_strings(chunk: int, ids: dict[str, int]) -> None:
    """DeepSeek V3.2's DSML: each parameter says whether its value is a string (text as it is,
    streamed) or not (JSON), after a blank line where it follows the thought or text; V4 names
    its block tool_calls."""
    from firmware.toolchain.tiny import DEEPSEEK_V32_CHAT_TEMPLATE

    fmt = call_format(DEEPSEEK_V32_CHAT_TEMPLATE, ids.get)
    assert fmt.name == "dsml" and dict(fmt.specials) == ids
    note = Tool("write", "", {"type": "object", "properties": {"path": {"type": "string"}, "lines": {
        "type": "integer"}, "tags": {"type": "array"}, "mode": {"enum": ["a", "w"]}}})  # fmt: skip
    tricky = '{"path": "a </｜DSML｜param\\n\\"b\\"", "lines": 2, "tags": ["x", 1], "mode": "w"}'
    written = ("<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"write\">\n"
               '<｜DSML｜parameter name="path" string="true">a </｜DSML｜param\n"b"</｜DSML｜parameter>\n'
               '<｜DSML｜parameter name="lines" string="false">2</｜DSML｜parameter>\n'
               '<｜DSML｜parameter name="tags" string="false">["x", 1]</｜DSML｜parameter>\n'
               '<｜DSML｜parameter name="mode" string="true">w</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
               '<｜DSML｜invoke name="get_time">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>')  # fmt: skip
    assert format_calls([PastCall("write", tricky), PastCall(CLOCK.name, "{}")], fmt) == written
    for lead in ("", "\n\n"):
        assert _parse(lead + written, chunk, fmt=fmt, tools=(note, CLOCK)) == ("", [("write", tricky),
                                                                                   (CLOCK.name, "{}")], 2)  # fmt: skip
    # The model says a value is a string, or not, whatever the schema says (none here: no tool given).
    loose = written.replace('"lines" string="false">2', '"lines" string="true">2')
    assert _parse(loose, chunk, fmt=fmt)[1][0] == ("write", tricky.replace('"lines": 2', '"lines": "2"'))
    rules = grammar(OutputRules((note,), ToolChoice("required")), fmt)
    assert rules is not None
    for key, kind in (("path", "true"), ("lines", "false"), ("tags", "false"), ("mode", "true")):
        assert f'"{key}" "\\" string=\\"{kind}\\">"' in rules.replace(" <[50]> ", " ").replace("<[50]>", "")
    v4 = DEEPSEEK_V32_CHAT_TEMPLATE.replace("function_calls", "tool_calls")
    assert call_format(v4, ids.get).open == "<｜DSML｜tool_calls>\n"
    assert call_format(DEEPSEEK_V32_CHAT_TEMPLATE.replace('string="', 'kind="'), ids.get) is HERMES


def _element_calls_round_trip(template: str, ids: dict[str, int], name: str, call: tuple[Tool, str], chunk: int,
                              written: str) -> CallFormat:  # fmt: skip
    """The format `template` asks for (`ids`: the vocabulary's special tokens) is `name`'s; `call`
    (its tool and arguments) and a call of CLOCK are written as `written`, and read back from it
    (after a line break too, as where they follow text)."""
    fmt = call_format(template, ids.get)
    assert fmt.name == name and dict(fmt.specials) == ids
    tool, arguments = call
    assert format_calls([PastCall(tool.name, arguments), PastCall(CLOCK.name, "{}")], fmt) == written
    for lead in ("", "\n"):
        assert _parse(lead + written, chunk, fmt=fmt, tools=(tool, CLOCK)) == ("", [(tool.name, arguments),
                                                                                    (CLOCK.name, "{}")], 2)  # fmt: skip
    return fmt


@pytest.mark.parametrize("chunk", [1, 3, 1000])
@pytest.mark.parametrize("ids", [{"<minimax:tool_call>": 50, "</minimax:tool_call>": 51}, {}])
def test_minimax_m2_calls_are_read_from_their_invoke_and_parameter_elements(chunk: int, ids: dict[str, int]) -> None:
    """MiniMax-M2 writes a turn's calls as <invoke> elements of <parameter> elements between its
    tags (special tokens, kept for the parser, or text), after a newline where it follows text."""
    from firmware.toolchain.tiny import MINIMAX_M2_CHAT_TEMPLATE

    weather = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"},
                                                                        "days": {"type": "integer"}}})  # fmt: skip
    fmt = _element_calls_round_trip(
        MINIMAX_M2_CHAT_TEMPLATE, ids, "minimax", (weather, '{"city": "Paris: <b>", "days": 3}'), chunk,
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris: <b></parameter>\n'
        '<parameter name="days">3</parameter>\n</invoke>\n<invoke name="get_time">\n</invoke>\n</minimax:tool_call>')
    assert _parse("<invoke is not a call", chunk, fmt=fmt) == ("<invoke is not a call", [], 0)
    assert call_format(MINIMAX_M2_CHAT_TEMPLATE.replace("<invoke name=", "<call name="), ids.get) is HERMES


MISTRAL_SMALL_CALLS = "{{- '[TOOL_CALLS]' + tool['function']['name'] + '[ARGS]' + arguments }}"


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_later_mistral_calls_are_parsed_from_their_markers_and_names(chunk: int) -> None:
    """Mistral Small 3.x, Magistral and Devstral write [TOOL_CALLS]name[ARGS]{...} for each call;
    decoding drops both special tokens, so the parser sees the name run into the arguments."""
    fmt = call_format(MISTRAL_SMALL_CALLS, {"[TOOL_CALLS]": 7, "[ARGS]": 8}.get)
    assert (fmt.name, fmt.marker_id) == ("mistral_args", 7)
    paris, tricky = '{"city": "Paris", "unit": "c"}', '{"q": "a ] b {", "list": [1, "}"]}'
    written = format_calls([PastCall("get_weather", paris), PastCall("search", tricky)], fmt)
    assert written == f"[TOOL_CALLS]get_weather[ARGS]{paris}[TOOL_CALLS]search[ARGS]{tricky}"
    assert _parse(written, chunk, fmt=fmt) == ("", [("get_weather", paris), ("search", tricky)], 2)
    assert _parse("get_weather{} is a call's text", chunk, fmt=fmt) == ("get_weather{} is a call's text", [], 0)
    cut = written[: written.index("Par")]  # max_tokens inside the first call's arguments
    assert _parse(cut, chunk, fmt=fmt) == ("", [("get_weather", '{"city": "')], 0)
    assert _parse(cut, chunk, calls_only=True, fmt=fmt)[1] == [("get_weather", '{"city": "')]
    # Without the [ARGS] token a template's [TOOL_CALLS] is v0.3's list, or (with no token) Hermes.
    assert call_format(MISTRAL_SMALL_CALLS, {"[TOOL_CALLS]": 7}.get) is HERMES
    assert call_format("[TOOL_CALLS] [ARGS]", {"[ARGS]": 8}.get) is HERMES


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_qwen35_calls_are_read_from_their_parameters_as_their_schema_types_them(
        chunk: int, compiler: GrammarCompiler) -> None:  # fmt: skip
    """Qwen3.5 and Qwen3-Coder write each argument as an element whose text is its value: a string
    as it is (quotes and newlines too), anything else as JSON or Python's str(). The arguments come
    back as the JSON object a client expects, typed by the tool's schema, a string's text streaming
    as it comes; the grammar holds each value to its property's schema and lets a string run until
    its element closes."""
    from firmware.toolchain.tiny import QWEN35_CHAT_TEMPLATE

    fmt = call_format(QWEN35_CHAT_TEMPLATE, {}.get)
    assert fmt is QWEN_XML
    book = Tool("book", "", {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "nights": {"type": "integer"}, "pets": {"type": "boolean"},
        "rooms": {"type": "array", "items": {"type": "string"}}, "note": {}}})  # fmt: skip
    args = {"city": 'Paris "centre"\n</x>', "nights": 3, "pets": True, "rooms": ["a", "b"], "note": "1.5"}
    written = format_calls([PastCall("book", json.dumps(args)), PastCall("book", '{"city": "Rome"}')], fmt)
    assert written.startswith('<tool_call>\n<function=book>\n<parameter=city>\nParis "centre"\n</x>\n</parameter>\n'
                              "<parameter=nights>\n3\n</parameter>\n<parameter=pets>\nTrue\n</parameter>\n"
                              '<parameter=rooms>\n["a", "b"]\n</parameter>\n')  # fmt: skip
    text, calls, complete = _parse(written, chunk, fmt=fmt, tools=(book,))
    assert (text, complete) == ("", 2)
    assert [json.loads(a) for _, a in calls] == [{**args, "note": 1.5}, {"city": "Rome"}]  # untyped: JSON where it is
    first = written[: written.index("\n<tool_call>")]
    required = OutputRules((book,), ToolChoice("required"))
    assert _accepts(compiler, required, first, fmt) and _accepts(compiler, required, written, fmt)
    assert _accepts(compiler, OutputRules((book,)), "It is sunny.", fmt)
    for wrong in ('{"nights": 3}', '{"city": "P", "nights": "three"}', '{"city": "P", "pets": "maybe"}'):
        assert not _accepts(compiler, required, fmt.format("book", wrong), fmt), wrong
    nothing = OutputRules((Tool("now", "", {"type": "object", "properties": {}, "additionalProperties": False}),),
                          ToolChoice("required"))  # fmt: skip
    assert _accepts(compiler, nothing, fmt.format("now", "{}"), fmt)
    assert not _accepts(compiler, nothing, fmt.format("now", '{"tz": "UTC"}'), fmt)
    # A string streams as it comes (max_tokens here, inside it), all but what may begin its close.
    cut = written[: written.index("centre")]
    assert _parse(cut, chunk, fmt=fmt, tools=(book,)) == ("", [("book", '{"city": "Paris \\"')], 0)
    assert _parse(cut + "\n</par", chunk, fmt=fmt, tools=(book,))[1] == [("book", '{"city": "Paris \\"')]


async def _events(engine: Engine, request: GenerationRequest) -> list[Any]:
    return [e async for e in engine.submit(request)]


def test_a_strict_tool_holds_qwen35_s_text_parameters_to_their_patterns_and_lengths(
        compiler: GrammarCompiler, trusted_keys: Path) -> None:  # fmt: skip
    """A string parameter is plain text in Qwen3.5's calls, not JSON: a strict tool holds it to its
    pattern (searched unless anchored at both ends) and lengths; a format, which text cannot hold,
    or a pattern anchored inside is refused; a tool without strict leaves them unenforced. The
    tiny Qwen3.5 writes a whole call that way (a stop lexeme whose regex could not go on let it
    end its output instead of closing the element)."""
    from firmware.toolchain.tiny import tiny_bundle

    schema = {"type": "object", "required": ["code"], "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"}, "note": {"type": ["string", "null"], "maxLength": 5},
        "path": {"type": "string", "pattern": "/tmp/"}}}  # fmt: skip
    strict = OutputRules((Tool("file", "", schema, strict=True),), ToolChoice("required"))
    lenient = OutputRules((Tool("file", "", schema),), ToolChoice("required"))

    def call(**args: str) -> str:
        return QWEN_XML.format("file", json.dumps(args))

    for right in (call(code="ABC"), call(code="XYZ", note="short", path="a /tmp/ b"), call(code="ABC", note="None")):
        assert _accepts(compiler, strict, right, QWEN_XML), right
    for wrong in (call(code="abc"), call(code="ABCD"), call(code="ABC", note="longer"), call(code="ABC", path="/t/")):
        assert not _accepts(compiler, strict, wrong, QWEN_XML), wrong
        assert _accepts(compiler, lenient, wrong, QWEN_XML), wrong
    for refused, what in (({"type": "string", "format": "email"}, "format 'email'"),
                          ({"type": "string", "pattern": "^a|b$"}, "anchors or alternatives")):  # fmt: skip
        tool = Tool("file", "", {"type": "object", "properties": {"to": refused}}, strict=True)
        with pytest.raises(InvalidRequest, match=f"parameter 'to' has .*{re.escape(what)}"):
            grammar(OutputRules((tool,)), QWEN_XML)
        assert grammar(OutputRules((dataclasses.replace(tool, strict=False),)), QWEN_XML)

    bounded = {**schema, "properties": {k: v for k, v in schema["properties"].items() if k != "path"}}  # (nor rambling)
    engine = Engine(firmware.load(tiny_bundle("qwen3_5"), trusted_keys), EngineConfig(intra_op_threads=1))
    try:
        rules = OutputRules((Tool("file", "", bounded, strict=True),), ToolChoice("required"))
        events = asyncio.run(_events(engine, GenerationRequest((Message("user", "Send it."),), max_tokens=80,
                                                               temperature=0, output=rules)))  # fmt: skip
    finally:
        engine.close()
    jsonschema.validate(json.loads("".join(e.json for e in events if isinstance(e, CallArguments))), bounded)
    assert isinstance(events[-1], Finished) and events[-1].stop_reason == "tool_use"


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_lfm2_calls_are_read_from_their_python_arguments(chunk: int, trusted_keys: Path) -> None:
    """LFM2 writes a turn's calls as a Python list between two special tokens, each call's
    arguments as keyword arguments. They come back as the JSON object a client expects (Python's
    True and None, or JSON's spelling, a positional argument named by the schema); the grammar
    holds them in the schema's order, each value to its property's schema, strings included."""
    from appliance.engine.tokenizer import TextTokenizer
    from firmware.toolchain.tiny import tiny_bundle

    bundle = firmware.load(tiny_bundle("lfm2"), trusted_keys)
    fmt = call_format(bundle.chat_template, TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path).token_id)
    assert (fmt.name, fmt.python) == ("python", True)
    book = Tool("book", "", {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "nights": {"type": "integer"}, "pets": {"type": "boolean"},
        "rooms": {"type": "array", "items": {"type": "string"}}, "note": {"type": ["string", "null"]},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"}}})  # fmt: skip
    args = {"city": 'Paris "centre" (x), [y]\n\'é\'', "nights": -3, "pets": True, "rooms": ["a)", "b"], "note": None}
    written = format_calls([PastCall("book", json.dumps(args)), PastCall("book", '{"city": "Rome"}')], fmt)
    assert written == ('<|tool_call_start|>[book(city="Paris \\"centre\\" (x), [y]\\n\'é\'", nights=-3, pets=True, '
                       'rooms=["a)", "b"], note=None), book(city="Rome")]<|tool_call_end|>')  # fmt: skip
    text, calls, complete = _parse(written, chunk, fmt=fmt, tools=(book,))
    assert (text, complete) == ("", 2)
    assert [json.loads(a) for _, a in calls] == [args, {"city": "Rome"}]
    unconstrained = "<|tool_call_start|>[book('Oslo :)', pets=true, rooms=('a',), note=null)]<|tool_call_end|>"
    assert [json.loads(a) for _, a in _parse(unconstrained, chunk, fmt=fmt, tools=(book,))[1]] == [
        {"city": "Oslo :)", "pets": True, "rooms": ["a"], "note": None}]  # fmt: skip
    assert _parse("It is sunny (mostly).", chunk, fmt=fmt, tools=(book,)) == ("It is sunny (mostly).", [], 0)

    compiler = GrammarCompiler(bundle.tokenizer_path, bundle.model.vocab_size, bundle.model.eos_token_ids)
    start, end = (i for _, i in fmt.specials)

    def accepts(rules: OutputRules, calls: str) -> bool:
        lark = grammar(rules, fmt)
        assert lark is not None
        matcher = compiler.constraint(lark, "tools").matcher
        ids = [start, *compiler.tokenizer.tokenize_str(calls), end]
        return all(matcher.consume_token(t) for t in ids) and bool(matcher.is_accepting())

    required = OutputRules((book,), ToolChoice("required"))
    assert accepts(required, fmt.visible(written)) and accepts(required, '[book(city="P", code="ABC")]')
    for wrong in ('[book(nights=3)]', '[book(nights=3, city="P")]', '[book(city="P", pets=true)]',
                  '[book(city="P", nights="3")]', '[book(city="P", code="abc")]', '[book(city="P", size=1)]',
                  '[book(city="P",)]', '[book(, city="P")]'):  # fmt: skip
        assert not accepts(required, wrong), wrong
    anything = Tool("log", "", {"type": "object", "properties": {"a": {}, "b": {"type": "boolean"}}})
    for right in ("[log()]", "[log(b=False)]", '[log(a={"x": [1, null]}, b=True)]'):
        assert accepts(OutputRules((anything,), ToolChoice("required")), right), right
    assert not accepts(OutputRules((anything,), ToolChoice("required")), "[log(b=False, a=1)]")
    nothing = OutputRules((Tool("now", "", {"type": "object", "properties": {}, "additionalProperties": False}),),
                          ToolChoice("required"))  # fmt: skip
    assert accepts(nothing, "[now()]") and not accepts(nothing, '[now(tz="UTC")]')


# A tool of three typed parameters, and arguments whose text holds a quote, a newline and a tag.
BOOK = Tool("book", "", {"type": "object", "required": ["city"], "properties": {
    "city": {"type": "string"}, "nights": {"type": "integer"}, "pets": {"type": "boolean"}}})  # fmt: skip
BOOKED = {"city": 'Paris "centre"\n</x>', "nights": 3, "pets": True}


def _format_of(name: str, trusted_keys: Path) -> tuple[firmware.Bundle, CallFormat]:
    """A fixture's bundle and the call format its template and vocabulary give."""
    from appliance.engine.tokenizer import TextTokenizer
    from firmware.toolchain.tiny import tiny_bundle

    bundle = firmware.load(tiny_bundle(name), trusted_keys)
    tokenizer = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    return bundle, call_format(spelled_out(bundle.chat_template), tokenizer.token_id)


def _two_bookings(fmt: CallFormat) -> str:
    """BOOKED's call, then a call of the city alone, as `fmt` writes them."""
    return format_calls([PastCall("book", json.dumps(BOOKED)), PastCall("book", '{"city": "Rome"}')], fmt)


def _grammar_accepts(bundle: firmware.Bundle, fmt: CallFormat, rules: OutputRules, output: str) -> bool:
    """Whether `rules`' grammar in `fmt` takes `output`, its special tokens as their ids, the rest as
    the vocabulary tokenizes it."""
    compiler = GrammarCompiler(bundle.tokenizer_path, bundle.model.vocab_size, bundle.model.eos_token_ids)
    lark = grammar(rules, fmt)
    assert lark is not None
    matcher, special = compiler.constraint(lark, "tools").matcher, dict(fmt.specials)
    pieces = [p for p in re.split("(" + "|".join(map(re.escape, special)) + ")", output) if p] if special else [output]
    tokens = [t for p in pieces for t in ([special[p]] if p in special else compiler.tokenizer.tokenize_str(p))]
    return all(matcher.consume_token(t) for t in tokens) and bool(matcher.is_accepting())


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_seed_oss_calls_are_read_from_its_parameters_between_its_tokens(chunk: int, trusted_keys: Path) -> None:
    """Seed-OSS writes each call between two special tokens of its own, its parameters as Qwen3.5's
    are but without the newlines around their values; they come back as the JSON object a client
    expects, and the grammar holds them to the tool's schema in that framing."""
    from firmware.toolchain.tiny import SEED_CHAT_TEMPLATE

    bundle, fmt = _format_of("seed_oss", trusted_keys)
    assert (fmt.name, fmt.params, fmt.marker) == ("seed_xml", True, "<seed:tool_call>")
    assert call_format(SEED_CHAT_TEMPLATE, {}.get) is QWEN_XML  # a vocabulary without its tokens
    written = _two_bookings(fmt)
    assert written == ('<seed:tool_call>\n<function=book>\n<parameter=city>Paris "centre"\n</x></parameter>\n'
                       "<parameter=nights>3</parameter>\n<parameter=pets>True</parameter>\n</function>\n"
                       "</seed:tool_call>\n<seed:tool_call>\n<function=book>\n<parameter=city>Rome</parameter>\n"
                       "</function>\n</seed:tool_call>")  # fmt: skip
    text, calls, complete = _parse(written, chunk, fmt=fmt, tools=(BOOK,))
    assert (text, complete) == ("", 2)
    assert [json.loads(a) for _, a in calls] == [BOOKED, {"city": "Rome"}]
    assert _parse("It is sunny.", chunk, fmt=fmt, tools=(BOOK,)) == ("It is sunny.", [], 0)  # no marker: text

    required = OutputRules((BOOK,), ToolChoice("required"))
    assert _grammar_accepts(bundle, fmt, required, written)
    for wrong in ('{"nights": 3}', '{"city": "P", "nights": "three"}', '{"city": "P", "pets": "maybe"}'):
        assert not _grammar_accepts(bundle, fmt, required, format_calls([PastCall("book", wrong)], fmt)), wrong
    qwen_framed = written.replace("<parameter=nights>3</parameter>", "<parameter=nights>\n3\n</parameter>")
    assert not _grammar_accepts(bundle, fmt, required, qwen_framed)
    assert _grammar_accepts(bundle, fmt, OutputRules((BOOK,)), "It is sunny.")


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_hy3_calls_are_read_between_the_tags_its_template_builds(chunk: int, trusted_keys: Path) -> None:
    """Hy3's template builds each tag of its own by `.format` of one suffix. Spelled out, they ask
    for GLM-4.5's keys and values, each call between two tags after its name and a separator, a
    turn's calls between two more: special tokens that decoding keeps for the parser and the grammar
    names by id. Its thought's tags are found so too."""
    from appliance.engine.reasoning import ThinkTags, thought_format
    from appliance.engine.tokenizer import TextTokenizer

    bundle, fmt = _format_of("hy_v3", trusted_keys)
    assert (fmt.name, fmt.params, len(fmt.specials)) == ("hy3", True, 9)
    written = _two_bookings(fmt)
    assert written == ("<tool_calls:opensource>\n<tool_call:opensource>book<tool_sep:opensource>\n"
                       '<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Paris "centre"\n</x>'
                       "</arg_value:opensource>\n<arg_key:opensource>nights</arg_key:opensource>\n"
                       "<arg_value:opensource>3</arg_value:opensource>\n<arg_key:opensource>pets</arg_key:opensource>"
                       "\n<arg_value:opensource>true</arg_value:opensource>\n</tool_call:opensource>\n"
                       "<tool_call:opensource>book<tool_sep:opensource>\n<arg_key:opensource>city</arg_key:opensource>"
                       "\n<arg_value:opensource>Rome</arg_value:opensource>\n</tool_call:opensource>\n"
                       "</tool_calls:opensource>")  # fmt: skip
    text, calls, complete = _parse(written, chunk, fmt=fmt, tools=(BOOK,))
    assert (text, complete) == ("", 2) and [json.loads(a) for _, a in calls] == [BOOKED, {"city": "Rome"}]
    empty = format_calls([PastCall(CLOCK.name, "{}")], fmt)  # (the template writes no keys: a line break ends the name)
    assert empty.endswith("<tool_sep:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>")
    assert _parse(empty, chunk, fmt=fmt, tools=(CLOCK,)) == ("", [(CLOCK.name, "{}")], 1)
    assert _parse("It is sunny.", chunk, fmt=fmt, tools=(BOOK,)) == ("It is sunny.", [], 0)
    required = OutputRules((BOOK,), ToolChoice("required"))
    assert _grammar_accepts(bundle, fmt, required, written)
    for wrong in ('{"nights": 3}', '{"city": "P", "nights": "three"}'):
        assert not _grammar_accepts(bundle, fmt, required, format_calls([PastCall("book", wrong)], fmt)), wrong
    # As published, the tags are nowhere in the source: neither the format nor the thought is found.
    tokenizer = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    assert call_format(bundle.chat_template, tokenizer.token_id) is HERMES
    assert thought_format(tokenizer, bundle.chat_template) is None
    tags = thought_format(tokenizer, spelled_out(bundle.chat_template))
    assert isinstance(tags, ThinkTags) and tags.open_id == tokenizer.token_id("<think:opensource>")


def test_a_template_s_formatted_strings_are_spelled_out_where_their_name_is_a_string() -> None:
    source = ("{%- set S = ':x' -%}{%- set N = 3 -%}{% set D = \"-d\" %}{{ '<a{}>'.format(S) + \"<b{}>\".format(D) }}"
              "{{ '<c{}>'.format(N) + '<e{}>'.format(T) }}")  # fmt: skip
    assert spelled_out(source) == ("{%- set S = ':x' -%}{%- set N = 3 -%}{% set D = \"-d\" %}{{ '<a:x>' + \"<b-d>\" }}"
                                   "{{ '<c{}>'.format(N) + '<e{}>'.format(T) }}")  # fmt: skip


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_glm_calls_are_read_from_their_keys_and_values_between_special_tokens(chunk: int,
                                                                             trusted_keys: Path) -> None:  # fmt: skip
    """GLM-4.5 writes each call's name after <tool_call>, then each argument as a key and a value
    between tags (a value that is not a string as JSON), all special tokens: decoding keeps them in
    the text the parser reads, the grammar names them by id and holds the values to the tool's
    schema, and a newline may come before the first call (after a thought) as before the others."""
    from appliance.engine.tokenizer import TextTokenizer
    from firmware.toolchain.tiny import GLM45_CHAT_TEMPLATE, GLM47_CHAT_TEMPLATE

    bundle, fmt = _format_of("glm4_moe", trusted_keys)
    assert (fmt.name, fmt.params, len(fmt.specials), fmt.lead) == ("glm", True, 6, "\n")
    written = _two_bookings(fmt)
    assert written == ('<tool_call>book\n<arg_key>city</arg_key>\n<arg_value>Paris "centre"\n</x></arg_value>\n'
                       "<arg_key>nights</arg_key>\n<arg_value>3</arg_value>\n<arg_key>pets</arg_key>\n"
                       "<arg_value>true</arg_value>\n</tool_call>\n<tool_call>book\n<arg_key>city</arg_key>\n"
                       "<arg_value>Rome</arg_value>\n</tool_call>")  # fmt: skip
    for lead in ("", "\n"):
        text, calls, complete = _parse(lead + written, chunk, fmt=fmt, tools=(BOOK,))
        assert (text, complete) == ("", 2)
        assert [json.loads(a) for _, a in calls] == [BOOKED, {"city": "Rome"}]
    assert _parse("\nIt is sunny.", chunk, fmt=fmt, tools=(BOOK,)) == ("\nIt is sunny.", [], 0)
    # GLM-4.7's template writes no newlines around a call's parts; a vocabulary without the tags
    # (a base model's) has them written as text.
    tokenizer = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    glm47 = call_format(GLM47_CHAT_TEMPLATE, tokenizer.token_id)
    assert (glm47.name, glm47.lead, glm47.param_head_end) == ("glm", "", "</arg_key><arg_value>")
    for arguments in ('{"city": "Rome", "nights": 2}', "{}"):
        once = format_calls([PastCall("book", arguments)], glm47)
        assert "\n" not in once
        assert _parse(once, chunk, fmt=glm47, tools=(BOOK,)) == ("", [("book", json.dumps(json.loads(arguments)))], 1)
    assert call_format(GLM45_CHAT_TEMPLATE, {}.get).specials == ()

    required = OutputRules((BOOK,), ToolChoice("required"))
    assert _grammar_accepts(bundle, fmt, required, written) and _grammar_accepts(bundle, fmt, required, "\n" + written)
    for wrong in ('{"nights": 3}', '{"city": "P", "nights": "three"}', '{"city": "P", "pets": "maybe"}'):
        assert not _grammar_accepts(bundle, fmt, required, format_calls([PastCall("book", wrong)], fmt)), wrong
    assert not _grammar_accepts(bundle, fmt, required, written.replace("</arg_key>\n<arg_value>",
                                                                       "</arg_key><arg_value>"))  # fmt: skip
    assert _grammar_accepts(bundle, glm47, required, format_calls([PastCall("book", '{"city": "Rome"}')], glm47))
    strict = OutputRules((dataclasses.replace(BOOK, strict=True, schema={**BOOK.schema, "properties": {
        "city": {"type": "string", "pattern": "^[A-Z][a-z]+$"}}}),), ToolChoice("required"))  # fmt: skip
    assert _grammar_accepts(bundle, fmt, strict, format_calls([PastCall("book", '{"city": "Rome"}')], fmt))
    assert not _grammar_accepts(bundle, fmt, strict, format_calls([PastCall("book", '{"city": "rome"}')], fmt))
    assert _grammar_accepts(bundle, fmt, OutputRules((BOOK,)), "It is sunny.")
    assert _grammar_accepts(bundle, fmt, OutputRules((BOOK,)), "\nIt is sunny.")


GEMMA_IDS = {"<|tool_call>": 1, "<tool_call|>": 2, '<|"|>': 3}


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_gemma4_calls_are_read_from_its_own_notation(chunk: int, trusted_keys: Path) -> None:
    """Gemma 4 writes each call between two special tokens, its arguments keys bare and strings
    between a third (which decoding keeps in the answer's text for the parser). They come back as
    the JSON a client expects, and the grammar holds them to the tool's schema in that notation."""
    from appliance.engine.tokenizer import StreamDecoder, TextTokenizer
    from firmware.toolchain.tiny import GEMMA4_CHAT_TEMPLATE, tiny_bundle

    fmt = call_format(GEMMA4_CHAT_TEMPLATE, GEMMA_IDS.get)
    assert (fmt.name, fmt.gemma, fmt.kept) == ("gemma4", True, {1: "<|tool_call>", 2: "<tool_call|>", 3: '<|"|>'})
    assert call_format(GEMMA4_CHAT_TEMPLATE, {}.get) is HERMES  # a vocabulary without its tokens
    book = Tool("book", "", {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "nights": {"type": "integer"}, "pets": {"type": "boolean"},
        "rooms": {"type": "array", "items": {"type": "string"}}, "note": {"type": ["string", "null"]},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}}}})  # fmt: skip
    args = {"city": 'Paris, "centre" {x}: [y]\n', "nights": -3, "pets": True, "rooms": ["a,b", "c"], "note": None,
            "where": {"lat": 48.85}}  # fmt: skip
    written = format_calls([PastCall("book", json.dumps(args)), PastCall("book", '{"city": "Rome"}')], fmt)
    assert written == ('<|tool_call>call:book{city:<|"|>Paris, "centre" {x}: [y]\n<|"|>,nights:-3,note:None,'
                       'pets:true,rooms:[<|"|>a,b<|"|>,<|"|>c<|"|>],where:{lat:48.85}}<tool_call|>'
                       '<|tool_call>call:book{city:<|"|>Rome<|"|>}<tool_call|>')  # fmt: skip
    text, calls, complete = _parse(written, chunk, fmt=fmt, tools=(book,))
    assert (text, complete) == ("", 2)
    assert [json.loads(a) for _, a in calls] == [args, {"city": "Rome"}]
    bare = "<|tool_call>call:book{city:Oslo,nights:2,pets:True}<tool_call|>"  # quotes left out
    assert [json.loads(a) for _, a in _parse(bare, chunk, fmt=fmt)[1]] == [{"city": "Oslo", "nights": 2, "pets": True}]
    assert _parse("It is sunny, {mostly}.", chunk, fmt=fmt) == ("It is sunny, {mostly}.", [], 0)

    bundle = firmware.load(tiny_bundle("gemma4"), trusted_keys)
    tokenizer = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    fmt = call_format(bundle.chat_template, tokenizer.token_id)
    decoder = StreamDecoder(tokenizer, fmt.kept)  # the answer's text as the engine decodes it: the tokens kept
    special = dict(fmt.specials)
    ids = [i for piece in re.split(r"(<\|tool_call>|<tool_call\|>|<\|\"\|>)", written) if piece
           for i in ([special[piece]] if piece in special else tokenizer.encode(piece)[0])]
    assert "".join(decoder.push(i) for i in ids) + decoder.flush() == written
    compiler = GrammarCompiler(bundle.tokenizer_path, bundle.model.vocab_size, bundle.model.eos_token_ids)

    def accepts(rules: OutputRules, calls: str) -> bool:
        lark = grammar(rules, fmt)
        assert lark is not None
        matcher = compiler.constraint(lark, "tools").matcher
        pieces = [p for p in re.split(r"(<\|tool_call>|<tool_call\|>|<\|\"\|>)", calls) if p]
        tokens = [t for p in pieces for t in ([special[p]] if p in special else compiler.tokenizer.tokenize_str(p))]
        return all(matcher.consume_token(t) for t in tokens) and bool(matcher.is_accepting())

    required = OutputRules((book,), ToolChoice("required"))
    assert accepts(required, written) and accepts(required, fmt.format("book", '{"city": "P", "where": {}}'))
    for wrong in ('{"nights": 3}', '{"city": "P", "nights": "3"}', '{"city": "P", "pets": "yes"}',
                  '{"city": "P", "size": 1}', '{"city": 3}', '{"city": "P", "rooms": [1]}'):  # fmt: skip
        assert not accepts(required, fmt.format("book", wrong)), wrong
    assert not accepts(required, "<|tool_call>call:book{nights:1,city:<|\"|>P<|\"|>}<tool_call|>")  # sorted keys
    assert accepts(OutputRules((book,)), "It is sunny.")
    anything = OutputRules((Tool("log", "", {"type": "object", "properties": {"a": {}, "b": {"type": "boolean"}}}),),
                           ToolChoice("required"))  # fmt: skip
    for right in ("{}", "{b:false}", '{a:{x:[1,None,<|"|>s<|"|>]},b:true}'):
        assert accepts(anything, f"<|tool_call>call:log{right}<tool_call|>"), right
    assert not accepts(anything, "<|tool_call>call:log{b:1}<tool_call|>")
    clock = OutputRules((CLOCK,), ToolChoice("required"))  # no schema: any arguments
    assert accepts(clock, '<|tool_call>call:get_time{tz:<|"|>UTC<|"|>}<tool_call|>')
    nothing = OutputRules((Tool("now", "", {"type": "object", "properties": {}, "additionalProperties": False}),),
                          ToolChoice("required"))  # fmt: skip
    assert accepts(nothing, "<|tool_call>call:now{}<tool_call|>")
    assert not accepts(nothing, '<|tool_call>call:now{tz:<|"|>UTC<|"|>}<tool_call|>')
    strict = Tool("code", "", {"type": "object", "properties": {"c": {"type": "string", "pattern": "^[A-Z]$"}}},
                  strict=True)  # fmt: skip
    with pytest.raises(InvalidRequest, match="'pattern' cannot be held in strict mode"):
        grammar(OutputRules((strict,)), fmt)
    assert grammar(OutputRules((dataclasses.replace(strict, strict=False),)), fmt)

    # Its template takes the results as the `tool_responses` of the turn that made the calls, a
    # JSON object's as its own, and the answer that followed them in that turn too.
    engine = Engine(bundle, EngineConfig(intra_op_threads=1))
    try:
        assert engine.template.takes_tool_responses
        called = PastCall("get_weather", '{"city": "Paris", "unit": "c"}')
        turns = (Message("user", "Weather in Paris?"), Message("assistant", "", (called,)),
                 Message("user", "", results=(('{"temp": 18, "sky": "clear"}', False),)),
                 Message("assistant", "It is 18 C."), Message("user", "Thanks."))  # fmt: skip
        text = engine.prepare(GenerationRequest(turns, output=OutputRules((WEATHER,)))).text
        assert ('<tool_call|><|tool_response>response:get_weather{sky:<|"|>clear<|"|>,temp:18}<tool_response|>'
                "It is 18 C.<turn|>\n<|turn>user\nThanks.<turn|>\n<|turn>model\n") in text
    finally:
        engine.close()


HARMONY_IDS = {"<|start|>": 1, "<|channel|>": 2, "<|message|>": 3, "<|end|>": 4, "<|constrain|>": 5}


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_gpt_oss_calls_are_read_from_the_message_after_their_channel_name(chunk: int) -> None:
    """What follows `<|channel|>commentary` (reasoning.ChannelSplit reads the header up to there):
    the recipient, then `<|constrain|>json<|message|>` and the arguments, one call a turn."""
    template = "{{ '<|start|>assistant to=functions.' + name + '<|channel|>commentary json<|message|>' }}"
    fmt = call_format(template, HARMONY_IDS.get)
    assert (fmt.name, fmt.channel, fmt.parallel) == ("harmony", "commentary", False)
    written = fmt.format("get_weather", '{"city": "Paris"}')
    assert written == ' to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
    assert _parse(written, chunk, calls_only=True, fmt=fmt) == ("", [("get_weather", '{"city": "Paris"}')], 1)
    assert _parse(written.lstrip(), chunk, calls_only=True, fmt=fmt)[1:] == ([("get_weather", '{"city": "Paris"}')], 1)
    lark = grammar(OutputRules((WEATHER,), ToolChoice("required")), fmt)
    assert lark is not None and '" to=functions.get_weather " <[5]> "json" <[3]> args_0' in lark
    assert call_format(template, {**HARMONY_IDS, "<|end|>": None}.get) is HERMES  # no harmony without its markers


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_llama_3_calls_are_parsed_in_its_own_json(chunk: int) -> None:
    call = format_call("get_weather", {"city": "Paris", "unit": "c"}, LLAMA3_JSON)
    assert call == '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}'
    assert _parse(call, chunk, fmt=LLAMA3_JSON) == ("", [("get_weather", '{"city": "Paris", "unit": "c"}')], 1)
    assert _parse("Hello {not a call}", chunk, fmt=LLAMA3_JSON) == ("Hello {not a call}", [], 0)
    assert _parse('{"nam', chunk, fmt=LLAMA3_JSON) == ('{"nam', [], 0)
    assert _parse(format_call("get_weather", {"city": "Paris"}), chunk, fmt=LLAMA3_JSON)[1] == []  # Hermes: text


def _guarded(output: str, chunk: int, last: bool = True) -> tuple[list[tuple[str, str]], bool]:
    """The calls a client is sent of `output` (fed `chunk` characters at a time), and whether a
    repeat ended the turn."""
    parser, guard, calls = CallParser(), RepeatGuard(), []
    pieces = [output[i : i + chunk] for i in range(0, len(output), chunk)]
    for piece in pieces:
        for part in guard.admit(parser.push(piece), parser.complete):
            if isinstance(part, CallStart):
                calls.append((part.name, ""))
            elif isinstance(part, CallArguments):
                name, args = calls[part.index]
                calls[part.index] = (name, args + part.json)
        if guard.repeated:
            break
    if last and not guard.repeated:
        for part in guard.rest():
            assert isinstance(part, CallArguments | CallStart)
            if isinstance(part, CallStart):
                calls.append((part.name, ""))
            else:
                calls[part.index] = (calls[part.index][0], calls[part.index][1] + part.json)
    return calls, guard.repeated


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_a_call_repeated_in_its_turn_ends_the_turn_and_is_never_sent(chunk: int) -> None:
    in_paris = ("get_weather", '{"city": "Paris", "unit": "c"}')
    in_rome = ("get_weather", '{"city": "Rome", "unit": "c"}')
    paris, rome = format_call(in_paris[0], in_paris[1]), format_call(in_rome[0], in_rome[1])
    assert _guarded("\n".join([paris, rome, paris, rome, paris]), chunk) == ([in_paris, in_rome], True)
    assert _guarded(paris + "\n" + paris, chunk) == ([in_paris], True)
    assert _guarded(paris + "\n" + rome, chunk) == ([in_paris, in_rome], False)
    cut = (paris + "\n" + rome)[:-20]  # max_tokens inside the second call: sent as far as it got, at the end
    calls, repeated = _guarded(cut, chunk)
    assert not repeated and len(calls) == 2 and calls[1][1] == in_rome[1][: len(calls[1][1])]
    held, _ = _guarded(cut, chunk, last=False)
    assert len(held) == 1  # until then the second call is held back
    cut_repeat = (paris + "\n" + paris)[:-20]  # max_tokens inside a repeat: dropped, and the turn's calls are whole
    assert _guarded(cut_repeat, chunk) == ([in_paris], True)


@pytest.fixture(scope="module")
def compiler(tiny_bundle_path: Path, trusted_keys: Path) -> GrammarCompiler:
    bundle = firmware.load(tiny_bundle_path, trusted_keys)
    return GrammarCompiler(bundle.tokenizer_path, bundle.model.vocab_size, bundle.model.eos_token_ids)


def _accepts(compiler: GrammarCompiler, rules: OutputRules, output: str, fmt: CallFormat = HERMES) -> bool:
    lark = grammar(rules, fmt)
    assert lark is not None
    constraint = compiler.constraint(lark, "tools" if rules.tools else rules.schema_field)
    return all(constraint.matcher.consume_token(t) for t in compiler.tokenizer.tokenize_str(output)) and bool(
        constraint.matcher.is_accepting())


def test_the_grammar_allows_what_the_tool_choice_allows_and_nothing_else(compiler: GrammarCompiler) -> None:
    call = format_call("get_weather", {"city": "Paris", "unit": "c"})
    bad_args = format_call("get_weather", {"city": "Paris", "unit": "kelvin"})
    clock = format_call("get_time", {})
    auto = OutputRules((WEATHER, CLOCK))
    assert _accepts(compiler, auto, "It is sunny.") and _accepts(compiler, auto, call)
    assert _accepts(compiler, auto, call + "\n" + clock)  # parallel calls
    assert not _accepts(compiler, auto, bad_args)  # arguments outside the schema
    assert not _accepts(compiler, auto, "<tool_call>\nnot json")  # no half-written call as text
    required = OutputRules((WEATHER, CLOCK), ToolChoice("required", parallel=False))
    assert _accepts(compiler, required, clock) and not _accepts(compiler, required, "It is sunny.")
    assert not _accepts(compiler, required, call + "\n" + clock)  # parallel calls disabled
    named = OutputRules((WEATHER, CLOCK), ToolChoice("tool", "get_time"))
    assert _accepts(compiler, named, clock) and not _accepts(compiler, named, call)
    some = OutputRules((WEATHER, CLOCK), ToolChoice("auto", allowed=("get_time",)))  # OpenAI's allowed_tools
    assert _accepts(compiler, some, clock) and _accepts(compiler, some, "It is sunny.")
    assert not _accepts(compiler, some, call)

    none = OutputRules((WEATHER,), ToolChoice("none"))
    assert _accepts(compiler, none, "It is sunny.") and not _accepts(compiler, none, call)
    schema = OutputRules(json_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    assert _accepts(compiler, schema, '{"n": 3}')
    assert not _accepts(compiler, schema, '{"n": 3, "extra": 1}')  # closed: no invented keys
    assert not _accepts(compiler, schema, "three")


def test_a_llama_3_grammar_holds_its_calls_and_allows_one_a_turn(compiler: GrammarCompiler) -> None:
    call = format_call("get_weather", {"city": "Paris", "unit": "c"}, LLAMA3_JSON)
    clock = format_call("get_time", {}, LLAMA3_JSON)
    auto = OutputRules((WEATHER, CLOCK))
    assert _accepts(compiler, auto, "It is sunny.", LLAMA3_JSON) and _accepts(compiler, auto, call, LLAMA3_JSON)
    assert not _accepts(compiler, auto, call + "; " + clock, LLAMA3_JSON)  # its templates refuse parallel calls
    assert not _accepts(compiler, auto, '{"name": "get_weather", "arguments": {}}', LLAMA3_JSON)  # not as text


def test_a_mistral_grammar_holds_its_calls_to_its_marker_token(trusted_keys: Path) -> None:
    from appliance.engine.tokenizer import TextTokenizer
    from firmware.toolchain.tiny import tiny_bundle

    bundle = firmware.load(tiny_bundle("mistral"), trusted_keys)
    compiler = GrammarCompiler(bundle.tokenizer_path, bundle.model.vocab_size, bundle.model.eos_token_ids)
    fmt = call_format(bundle.chat_template, TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path).token_id)
    assert fmt.marker_id is not None
    call = fmt.open + fmt.format("get_weather", '{"city": "Paris", "unit": "c"}') + fmt.end

    def accepts(rules: OutputRules, ids: list[int]) -> bool:
        lark = grammar(rules, fmt)
        assert lark is not None
        matcher = compiler.constraint(lark, "tools").matcher
        return all(matcher.consume_token(t) for t in ids) and bool(matcher.is_accepting())

    text = compiler.tokenizer.tokenize_str
    for rules in (OutputRules((WEATHER,)), OutputRules((WEATHER,), ToolChoice("required"))):
        assert accepts(rules, [fmt.marker_id, *text(call)])
        assert not accepts(rules, text(call))  # the calls' text without the token the model writes first
    assert accepts(OutputRules((WEATHER,)), text("It is sunny."))


def test_any_json_object_is_asked_for_in_words_a_schema_as_itself() -> None:
    # Shown {"type": "object"} (OpenAI's json_object), the demo model answered with that very object.
    assert schema_block({"type": "object"}) == "Answer with a JSON object only."
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert schema_block(schema).endswith(json.dumps(schema))


def test_a_schema_that_cannot_be_compiled_is_a_client_error_naming_the_field(compiler: GrammarCompiler) -> None:
    from appliance.engine import InvalidRequest

    rules = OutputRules(json_schema={"$ref": "#/$defs/nowhere"}, schema_field="output_config")
    lark = grammar(rules)
    assert lark is not None
    with pytest.raises(InvalidRequest, match="output_config: the schema cannot be used"):
        compiler.constraint(lark, rules.schema_field)
    # One llguidance panics on (a Rust panic, which `except Exception` would let through).
    rules = OutputRules(json_schema={"type": "object", "required": "\U0001f642" * 50}, schema_field="response_format")
    lark = grammar(rules)
    assert lark is not None
    with pytest.raises(InvalidRequest, match=r"response_format: .* compiler failed on it"):
        compiler.constraint(lark, rules.schema_field)


def test_a_keyword_the_grammar_cannot_hold_is_left_unenforced_unless_strict(compiler: GrammarCompiler) -> None:
    """OpenAI and Anthropic do not constrain a schema that is not strict at all, and agents' tool
    lists carry keywords like uniqueItems: refusing the request for them broke the agent. Strict
    schemas are still held in full, or refused in the client's terms (not our grammar's text)."""
    from appliance.engine import InvalidRequest

    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}

    def accepts(rules: OutputRules, text: str) -> bool:
        return _accepts(compiler, rules, text)

    lenient = OutputRules(json_schema=unique)
    assert accepts(lenient, "[1, 1]")  # what it cannot hold, it lets through
    assert not accepts(lenient, '["a"]')  # what it can, it holds
    strict = OutputRules(json_schema=unique, schema_strict=True)
    with pytest.raises(InvalidRequest) as refused:
        accepts(strict, "[1, 2]")
    assert str(refused.value) == ('response_format: the schema cannot be used to constrain output: '
                                  'Unimplemented keys: ["uniqueItems"]')
    # What no leniency can save is refused either way: here an unclosed character class.
    for strict_flag in (False, True):
        broken = OutputRules(json_schema={"type": "string", "pattern": "(["}, schema_strict=strict_flag)
        with pytest.raises(InvalidRequest) as refused:
            accepts(broken, '"a"')
        assert str(refused.value).endswith("regex parse error:\n    ([\n     ^\nerror: unclosed character class")


def test_a_grammar_failing_mid_batch_ends_its_own_request_and_the_worker_serves_on(
    tiny_bundle_path: Path, trusted_keys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from appliance.engine import GenerationFailed, constraint

    engine = Engine(firmware.load(tiny_bundle_path, trusted_keys), EngineConfig(prefix_cache_bytes=0))
    question = (Message("user", "Tell me something."),)
    free = GenerationRequest(question, max_tokens=24, temperature=0.0)
    schema = GenerationRequest(question, max_tokens=40, temperature=0.0,
                               output=OutputRules(json_schema=SMALL_SCHEMAS[0]))  # fmt: skip
    real_fill, fills = constraint.fill_next_token_bitmask, [0]

    def failing_fill(*args: Any) -> None:  # the mask is filled beside the batch's model run
        fills[0] += 1
        if fills[0] == 3:
            raise RuntimeError("injected mask failure")
        real_fill(*args)

    async def run(request: GenerationRequest) -> str:
        stream = engine.submit(request, prompt=await asyncio.to_thread(engine.prepare, request))
        return "".join([e.text async for e in stream if isinstance(e, TextDelta)])

    async def together() -> list[str | BaseException]:
        return await asyncio.wait_for(asyncio.gather(run(free), run(schema), return_exceptions=True), 120)

    try:
        alone = asyncio.run(run(free))
        monkeypatch.setattr(constraint, "fill_next_token_bitmask", failing_fill)
        text, failed = asyncio.run(together())
        monkeypatch.undo()
        assert text == alone  # the free row beside it runs to its end, unchanged
        assert isinstance(failed, GenerationFailed) and "injected mask failure" in str(failed)
        jsonschema.validate(json.loads(asyncio.run(asyncio.wait_for(run(schema), 120))), SMALL_SCHEMAS[0])
    finally:
        engine.close()


def test_penalties_and_min_p_change_what_they_should() -> None:
    logits = np.array([4.0, 3.0, 2.0, -1.0], dtype=np.float32)
    out = penalize(logits, [0, 0, 1], [], frequency=0.5, presence=0.25, repetition=1.0)
    assert out.tolist() == [4.0 - 1.0 - 0.25, 3.0 - 0.5 - 0.25, 2.0, -1.0]
    out = penalize(logits, [], [0, 3], frequency=0.0, presence=0.0, repetition=2.0)
    assert out.tolist() == [2.0, 3.0, 2.0, -2.0]  # positive divided, negative multiplied
    # Relative to the top token: 1, e^-1 = 0.37, e^-2 = 0.14, e^-5.
    assert {Sampler(1.0, seed=s, min_p=0.5)(logits) for s in range(200)} == {0}
    assert {Sampler(1.0, seed=s, min_p=0.3)(logits) for s in range(200)} == {0, 1}
    assert {Sampler(1.0, seed=s)(logits) for s in range(200)} >= {0, 1, 2}


# --- the dialects: calls in, calls out ---------------------------------------------------------


def test_anthropic_tool_turns_reach_the_model_in_its_tool_format() -> None:
    call = ANTHROPIC.parse({"model": "m", "max_tokens": 50, "tools": [{"name": "get_weather", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}}}], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, {
            "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
            {"type": "text", "text": "18 C"}]}, {"type": "tool_result", "tool_use_id": "toolu_2", "content": "down",
                                                 "is_error": True}]}]}, ["m"])  # fmt: skip
    msgs = call.request.messages
    assert msgs[1].content == "Let me look." and msgs[1].calls == (PastCall("get_weather", '{"city": "Paris"}'),)
    assert msgs[2].content == "" and msgs[2].results == (("18 C", False), ("down", True))
    assert call.request.output.tools[0].name == "get_weather" and call.request.output.choice.mode == "auto"
    with pytest.raises(ApiError, match=r"tool_choice\.name"):
        ANTHROPIC.parse({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                         "tools": [{"name": "a", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "b"}},
                        ["m"])  # fmt: skip


def test_openai_tool_turns_reach_the_model_in_its_tool_format() -> None:
    call = OPENAI.parse({"model": "m", "tools": [{"type": "function", "function": {"name": "get_weather"}}],
                         "tool_choice": "required", "parallel_tool_calls": False, "messages": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "25 C"}]}, ["m"])  # fmt: skip
    msgs = call.request.messages
    assert [m.role for m in msgs] == ["user", "assistant", "user"]  # the two results are one turn
    assert msgs[1].content == "" and msgs[1].calls == (PastCall("get_weather", '{"city": "Paris"}'),
                                                       PastCall("get_weather", '{"city": "Rome"}'))  # fmt: skip
    assert msgs[2].content == "" and msgs[2].results == (("18 C", False), ("25 C", False))
    assert call.request.output.choice == ToolChoice("required", None, parallel=False)
    fmt = OPENAI.parse({"model": "m", "messages": [{"role": "user", "content": "x"}],
                        "response_format": {"type": "json_object"}}, ["m"])  # fmt: skip
    assert fmt.request.output.json_schema == {"type": "object"}


PLAIN_CALL = Call(GenerationRequest((Message("user", "hi"),)), stream=False, model="m")


def test_answers_with_calls_in_each_dialects_shape() -> None:
    whole = CallOut("toolu_1", "get_weather", '{"city": "Paris"}')
    cut = CallOut("toolu_2", "get_weather", '{"city": "Ro')
    a = ANTHROPIC.response("m", PLAIN_CALL, [(Answer("", [whole, cut]), finished("tool_use"))])
    assert a["content"] == [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]
    assert a["stop_reason"] == "tool_use"
    o = OPENAI.response("m", PLAIN_CALL, [(Answer("", [whole]), finished("tool_use"))])
    choice = o["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [{"id": "toolu_1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]  # fmt: skip


def test_streams_open_a_block_per_call() -> None:
    call = ANTHROPIC.parse({"model": "m", "max_tokens": 5, "stream": True,
                            "messages": [{"role": "user", "content": "hi"}]}, ["m"])  # fmt: skip
    enc = ANTHROPIC.stream("m", 12, call)
    c = CallOut("toolu_1", "f")
    done = finished("tool_use")
    raw = enc.start() + enc.delta("Hm.") + enc.call_start(c) + enc.call_arguments(c, '{"a"') + enc.call_arguments(
        c, ": 1}") + enc.finish_choice(done) + enc.end(done)
    events = sse_events(raw)
    assert [(e["type"], e.get("index")) for e in events] == [
        ("message_start", None), ("ping", None), ("content_block_start", 0), ("content_block_delta", 0),
        ("content_block_stop", 0), ("content_block_start", 1), ("content_block_delta", 1),
        ("content_block_delta", 1), ("content_block_stop", 1), ("message_delta", None), ("message_stop", None)]
    assert events[5]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    assert events[6]["delta"] == {"type": "input_json_delta", "partial_json": '{"a"'}
    ocall = OPENAI.parse({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}, ["m"])
    oenc = OPENAI.stream("m", 12, ocall)
    body = oenc.start() + oenc.call_start(c) + oenc.call_arguments(c, "{}") + oenc.finish_choice(done) + oenc.end(done)
    chunks = sse_events(body)
    assert chunks[1]["choices"][0]["delta"]["tool_calls"] == [
        {"index": 0, "id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": ""}}]
    assert chunks[2]["choices"][0]["delta"]["tool_calls"] == [{"index": 0, "function": {"arguments": "{}"}}]
    assert chunks[3]["choices"][0]["finish_reason"] == "tool_calls"


# --- constrained rows in a real batch (the tiny model, random weights: only the grammar holds it) --


SMALL_SCHEMAS = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "green"]}},
     "required": ["ok", "color"]},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"inner": {"type": "object", "properties": {"n": {"enum": [1, 2, 3]}},
                                                "required": ["n"]}}, "required": ["inner"]},
]  # fmt: skip


# Tools whose arguments are finite: random weights would otherwise write a free string forever.
PICK = Tool("pick", "", {"type": "object", "properties": {"c": {"enum": ["a", "b"]}}, "required": ["c"]})
SWITCH = Tool("switch", "", {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]})


def test_constrained_and_free_rows_share_a_batch_and_each_keeps_its_own_rules(tiny_bundle_path: Path,
                                                                              trusted_keys: Path) -> None:  # fmt: skip
    engine = Engine(firmware.load(tiny_bundle_path, trusted_keys), EngineConfig(prefix_cache_bytes=0))
    question = (Message("user", "Tell me something."),)
    free = GenerationRequest(question, max_tokens=24, temperature=0.0)
    constrained = [GenerationRequest(question, max_tokens=120, temperature=0.8, seed=i,
                                     output=OutputRules(json_schema=schema))
                   for i, schema in enumerate(SMALL_SCHEMAS)]  # fmt: skip
    forced = GenerationRequest(question, max_tokens=120, temperature=0.8, seed=7,
                               output=OutputRules((PICK, SWITCH), ToolChoice("required", parallel=False)))  # fmt: skip

    async def run(request: GenerationRequest) -> tuple[list[object], Finished]:
        stream = engine.submit(request, prompt=await asyncio.to_thread(engine.prepare, request))
        events = [e async for e in stream]
        assert stream.finished is not None
        return events, stream.finished

    async def together() -> list[tuple[list[object], Finished]]:
        return await asyncio.gather(*(run(r) for r in [free, *constrained, forced]))

    try:
        alone, _ = asyncio.run(run(free))
        results = asyncio.run(together())
    finally:
        engine.close()
    texts = ["".join(e.text for e in events if isinstance(e, TextDelta)) for events in (alone, results[0][0])]
    assert texts[0] == texts[1]  # a free row is untouched by its neighbours' masks
    for (events, done), schema in zip(results[1:4], SMALL_SCHEMAS, strict=True):
        text = "".join(e.text for e in events if isinstance(e, TextDelta))
        assert done.stop_reason == "end_turn", text
        jsonschema.validate(json.loads(text), schema)
    events, done = results[4]
    assert done.stop_reason == "tool_use"
    calls: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, CallStart):
            calls[e.index] = [e.name, ""]
        elif isinstance(e, CallArguments):
            calls[e.index][1] += e.json
    ((name, args),) = calls.values()
    jsonschema.validate(json.loads(args), (PICK if name == "pick" else SWITCH).schema)


def test_constrained_output_is_the_same_with_the_prompt_from_the_prefix_pool(tiny_bundle_path: Path,
                                                                            trusted_keys: Path) -> None:  # fmt: skip
    engine = Engine(firmware.load(tiny_bundle_path, trusted_keys),
                    EngineConfig(prefix_cache_bytes=64 << 20, prefix_block_tokens=8))  # fmt: skip
    long = (Message("user", "Pick a colour and say whether it is fine. " * 6),)
    request = GenerationRequest(long, max_tokens=60, temperature=0.0, output=OutputRules(json_schema=SMALL_SCHEMAS[0]))

    async def run() -> tuple[str, int]:
        stream = engine.submit(request, prompt=await asyncio.to_thread(engine.prepare, request))
        text = "".join([e.text async for e in stream if isinstance(e, TextDelta)])
        assert stream.finished is not None
        return text, stream.finished.trace.reused_tokens

    try:
        (cold, none_reused), (warm, reused) = asyncio.run(run()), asyncio.run(run())
    finally:
        engine.close()
    assert none_reused == 0 and reused > 0
    assert warm == cold
    jsonschema.validate(json.loads(cold), SMALL_SCHEMAS[0])


def test_a_final_assistant_message_is_continued_not_answered(tiny_bundle_path: Path, trusted_keys: Path) -> None:
    engine = Engine(firmware.load(tiny_bundle_path, trusted_keys), EngineConfig(prefix_cache_bytes=0))
    try:
        user = Message("user", "What is the capital of France?")
        text = engine.prepare(GenerationRequest((user, Message("assistant", "The capital of France is")))).text
        assert text.endswith("The capital of France is")
        fresh = engine.prepare(GenerationRequest((user,))).text
        assert engine.prepare(GenerationRequest((user, Message("assistant", "")))).text == fresh
        assert engine.prepare(GenerationRequest((user, Message("assistant", " \n")))).text == fresh
    finally:
        engine.close()


def test_a_template_that_trims_messages_still_continues_the_final_one_as_sent(trusted_keys: Path) -> None:
    from firmware.toolchain.tiny import tiny_bundle

    engine = Engine(firmware.load(tiny_bundle("llama_rope_llama3"), trusted_keys), EngineConfig(intra_op_threads=1))
    try:  # Llama 3's template trims every message: the prefill's newline is put back
        user = Message("user", "What is the capital of France?")
        text = engine.prepare(GenerationRequest((user, Message("assistant", "<think>\n")))).text
        assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n<think>\n")
    finally:
        engine.close()


@pytest.mark.parametrize("chunk", [1, 3, 1000])
@pytest.mark.parametrize("ids", [{"<function": 50, "<param": 51, "</param>": 52, "</function>": 53}, {}])
def test_minicpm5_calls_are_read_from_their_function_and_param_elements(chunk: int, ids: dict[str, int]) -> None:
    """MiniCPM5 writes each call as a <function> element of <param> elements (its tags special
    tokens, kept for the parser, or text), a string holding <, & or a line break inside CDATA, a
    line break between two calls and after text."""
    from firmware.toolchain.tiny import MINICPM5_CHAT_TEMPLATE

    note = Tool("write", "", {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"},
                                                               "lines": {"type": "integer"}}})  # fmt: skip
    tricky = '{"path": "a.txt", "text": "x < y &\\n</param> ]]", "lines": 2}'
    fmt = _element_calls_round_trip(
        MINICPM5_CHAT_TEMPLATE, ids, "minicpm5", (note, tricky),
        chunk, '<function name="write"><param name="path">a.txt</param><param name="text"><![CDATA[x < y &\n</param> '
        ']]]]></param><param name="lines">2</param></function>\n<function name="get_time"></function>')
    # A value in CDATA where the tool's schema does not say it is a string, and one the model did
    # not wrap: each read as it is.
    loose = '<function name="w"><param name="a"><![CDATA[1 < 2]]></param><param name="b">x</param></function>'
    assert _parse(loose, chunk, fmt=fmt) == ("", [("w", '{"a": "1 < 2", "b": "x"}')], 1)
    assert _parse("<function is not a call", chunk, fmt=fmt) == ("<function is not a call", [], 0)
    assert call_format(MINICPM5_CHAT_TEMPLATE.replace('<param name="', '<arg name="'), ids.get) is HERMES


@pytest.mark.parametrize(("fixture", "fmt", "listed", "earlier", "result"), [
    ("llama_rope_llama3", "llama3_json", '"parameters": dictionary of argument name',
     '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris", '
     '"unit": "c"}}<|eot_id|>', "<|start_header_id|>ipython<|end_header_id|>\n\n18 C<|eot_id|>"),
    ("mistral", "mistral", "[AVAILABLE_TOOLS] [{",  # its template wants 9-character ids, ours (chat._call_id)
     '[/INST][TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}, '
     '"id": "call00000"}]</s>',
     '[TOOL_RESULTS] {"content": 18 C, "call_id": "call00000"}[/TOOL_RESULTS]'),
    ("mistral3_vl", "mistral_args", "[AVAILABLE_TOOLS][{",  # Mistral Small 3.x
     '[/INST][TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "c"}</s>', "[TOOL_RESULTS]18 C[/TOOL_RESULTS]"),
    ("qwen3_5", "qwen_xml", "<tools>\n{",
     "<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call><|im_end|>",
     "<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>"),
    ("lfm2", "python", "List of tools: <|tool_list_start|>[{",
     '<|im_start|>assistant\n<|tool_call_start|>[get_weather(city="Paris", unit="c")]<|tool_call_end|><|im_end|>',
     "<|im_start|>tool\n<|tool_response_start|>18 C<|tool_response_end|><|im_end|>"),
    ("lfm2_vl", "python", "List of tools: <|tool_list_start|>[{",
     '<|im_start|>assistant\n<|tool_call_start|>[get_weather(city="Paris", unit="c")]<|tool_call_end|><|im_end|>',
     "<|im_start|>tool\n<|tool_response_start|>18 C<|tool_response_end|><|im_end|>"),
    ("seed_oss", "seed_xml", '{"type": "function", "function": {"name": "get_weather"',
     "<seed:bos>assistant\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n"
     "<parameter=unit>c</parameter>\n</function>\n</seed:tool_call><seed:eos>", "<seed:bos>tool\n18 C<seed:eos>"),
    ("apertus", "apertus", 'Tool Capabilities:\n{"name": "get_weather"',  # the results in the turn of the calls
     '<|assistant_start|><|tools_prefix|>[{"get_weather": {"city": "Paris", "unit": "c"}}]<|tools_suffix|>',
     "<|tools_suffix|>[18 C]<|assistant_start|>"),
    ("nemotron_h", "nemotron", '<AVAILABLE_TOOLS>[{"name": "get_weather"',
     '<SPECIAL_11>Assistant\n<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}]'
     "</TOOLCALL>\n<SPECIAL_12>", "<SPECIAL_11>User\n<TOOL_RESPONSE>[18 C]</TOOL_RESPONSE>"),
    ("cohere2", "command", '## Available Tools\n```json\n[\n    {"name": "get_weather"',  # Command R7B
     '<|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|><|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": '
     '"get_weather", "parameters": {"city": "Paris", "unit": "c"}}\n]<|END_ACTION|>',
     '<|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[\n    {"tool_call_id": "0", "results": {"0": "18 C"}, "is_error": null}'
     "\n]<|END_TOOL_RESULT|>"),
    ("glm4_moe", "glm", '<tools>\n{"type": "function", "function": {"name": "get_weather"',
     "<|assistant|>\n<think></think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>"
     "\n<arg_key>unit</arg_key>\n<arg_value>c</arg_value>\n</tool_call>",
     "<|observation|>\n<tool_response>\n18 C\n</tool_response>"),
    ("glm4_moe_lite", "glm", '<tools>\n{"type": "function", "function": {"name": "get_weather"',  # GLM-4.7's
     "<|assistant|>\n<think></think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
     "<arg_key>unit</arg_key><arg_value>c</arg_value></tool_call>",
     "<|observation|>\n<tool_response>\n18 C\n</tool_response>"),
    ("deepseek_v3", "kimi", '<|im_system|>tool_declare<|im_middle|>[{"type": "function", "function": {"name": '
     '"get_weather"', "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>"
     'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris", "unit": "c"}<|tool_call_end|>'
     "<|tool_calls_section_end|><|im_end|>", "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n"
     "18 C<|im_end|>"),  # Kimi K2
    ("minimax_m2", "minimax", '<tools>\n<tool>{"name": "get_weather"',
     ']~b]ai\n\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
     '<parameter name="unit">c</parameter>\n</invoke>\n</minimax:tool_call>[e~[\n',
     "]~b]tool\n<response>18 C</response>[e~[\n"),
    ("minicpm5_moe", "minicpm5", '<tools>\n{"type": "function", "function": {"name": "get_weather"',
     '<|im_start|>assistant\n<function name="get_weather"><param name="city">Paris</param><param name="unit">c'
     "</param></function><|im_end|>", "<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>"),
    # Templates that list no tools: ours do, in a system block asking for the model's own format.
    ("deepseek_v2", "deepseek_v3_1", 'To call a function, answer in this format, its arguments a JSON object:\n'
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜><function-name><｜tool▁sep｜><arguments-object><｜tool▁call▁end｜>",
     "<｜Assistant｜><think></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
     '{"city": "Paris", "unit": "c"}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>',
     "<｜tool▁output▁begin｜>18 C<｜tool▁output▁end｜>"),  # DeepSeek V3.1
    ("llama_wide", "deepseek", '<tools>\n{"type": "function", "function": {"name": "get_weather"',  # R1's distills
     "<｜User｜>Weather in Paris?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
     'get_weather\n```json\n{"city": "Paris", "unit": "c"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
     "<｜end▁of▁sentence｜>"
     "<｜tool▁outputs▁begin｜>",  # (content None: no empty answer after the calls)
     "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>18 C<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"),
    ("minicpm3", "dsml", '<functions>\n{"name": "get_weather"',  # DeepSeek V3.2's
     '<｜Assistant｜></think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
     '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
     '<｜DSML｜parameter name="unit" string="true">c</｜DSML｜parameter>\n'
     "</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>",
     "\n\n<function_results>\n<result>18 C</result>\n</function_results>\n\n</think>"),
    ("hy_v3", "hy3", '<tools>\n{"type": "function", "function": {"name": "get_weather"',  # tags built by .format
     "<｜hy_Assistant:opensource｜><think:opensource></think:opensource><tool_calls:opensource>\n"
     "<tool_call:opensource>get_weather<tool_sep:opensource>\n<arg_key:opensource>city</arg_key:opensource>\n"
     "<arg_value:opensource>Paris</arg_value:opensource>\n<arg_key:opensource>unit</arg_key:opensource>\n"
     "<arg_value:opensource>c</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>"
     "<｜hy_eos:opensource｜>",
     "<tool_responses:opensource>\n<tool_response:opensource>\n18 C\n</tool_response:opensource>\n"
     "</tool_responses:opensource><｜hy_Assistant:opensource｜><think:opensource></think:opensource>"),
    ("llava", "apriel", '<available_tools>\n{"type": "function", "function": {"name": "get_weather"',  # Apriel's
     '\n<|begin_assistant|>\n\n<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}, '
     '"id": "call00000"}]</tool_calls>\n<|end|>\n',
     "<|begin_tool_result|>\n18 C\n\n<|begin_assistant|>\nHere are my reasoning steps:\n"),
    ("helium", "hermes", '<tools> {"type": "function", "function": {"name": "get_weather"',  # Hermes 2 Pro's tool_use
     '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
     "</tool_call><|im_end|>\n",
     "<|im_start|>tool\n<tool_response>\n18 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
    ("gemma4", "gemma4", "<|tool>declaration:get_weather{",  # the results in the turn of the calls, which goes on
     '<|turn>model\n<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,unit:<|"|>c<|"|>}<tool_call|>',
     '<tool_call|><|tool_response>response:get_weather{value:<|"|>18 C<|"|>}<tool_response|><|channel>thought\n'
     "<channel|>"),
])  # fmt: skip
def test_a_model_is_shown_its_calls_and_held_to_them_in_its_own_format(trusted_keys: Path, fixture: str, fmt: str,
                                                                       listed: str, earlier: str, result: str) -> None:
    from firmware.toolchain.tiny import tiny_bundle

    engine = Engine(firmware.load(tiny_bundle(fixture), trusted_keys), EngineConfig(intra_op_threads=1))
    try:
        assert engine.template.call_format.name == fmt
        called = PastCall("get_weather", '{"city": "Paris", "unit": "c"}')
        turns = (Message("user", "Weather in Paris?"), Message("assistant", "", (called,)),
                 Message("user", "", results=(("18 C", False),)))  # fmt: skip
        cities = Tool("get_weather", "Weather in a city", {"type": "object", "properties": {  # a short call
            "city": {"enum": ["Paris", "Rome"]}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]})
        # (DeepSeek's templates write no generation prompt after results: the model may think first,
        # and the tiny one, free to, thinks until max_tokens)
        # (Apriel's template opens a thought, which the tiny one ends only when its budget forces the
        # marker: 23 tokens of the tiny vocabulary, as its calls are 90)
        budget = 8 if fixture in ("deepseek_v2", "llama_wide") else 30 if fmt == "apriel" else None
        longest = 400 if fmt in ("dsml", "apriel") else 120  # (a DSML call is 188 tokens of the tiny vocabulary)
        request = GenerationRequest(turns, max_tokens=longest, temperature=0, thinking_budget=budget,
                                    output=OutputRules((cities,), ToolChoice("required")))  # fmt: skip
        text = engine.prepare(request).text
        assert listed in text and earlier in text  # its tools, and the earlier call as it would write it
        assert result in text  # the call's result, in the template's tool turn where it has one

        async def run() -> list[Any]:
            return [e async for e in engine.submit(request)]

        events = asyncio.run(run())
        names = [e.name for e in events if isinstance(e, CallStart)]
        assert names and set(names) == {"get_weather"}  # (the tiny Gemma 4 makes two calls: parallel ones allowed)
        for index in range(len(names)):
            arguments = "".join(e.json for e in events if isinstance(e, CallArguments) and e.index == index)
            jsonschema.validate(json.loads(arguments), cities.schema)
        assert isinstance(events[-1], Finished) and events[-1].stop_reason == "tool_use"
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == ""
    finally:
        engine.close()


def test_a_model_s_tool_use_template_renders_conversations_with_tools_and_its_chat_template_the_others(
        trusted_keys: Path) -> None:  # fmt: skip
    """As transformers picks it when tools are given; here also where earlier turns hold calls or
    results, which a chat template without tools could only show as text."""
    from appliance.engine.chat import tool_use_template
    from firmware.toolchain.tiny import HERMES2_PRO_TOOL_USE_TEMPLATE, tiny_bundle

    engine = Engine(firmware.load(tiny_bundle("helium"), trusted_keys), EngineConfig(intra_op_threads=1))
    try:
        hello = (Message("user", "Hello."),)
        own = "You are a function calling AI model."
        assert own not in engine.prepare(GenerationRequest(hello)).text
        assert own in engine.prepare(GenerationRequest(hello, output=OutputRules((CLOCK,)))).text
        called = (*hello, Message("assistant", "", (PastCall(CLOCK.name, "{}"),)),
                  Message("user", "", results=(("noon", False),)))  # fmt: skip
        text = engine.prepare(GenerationRequest(called)).text
        assert "<|im_start|>tool\n<tool_response>\nnoon\n</tool_response>" in text
        # Command R's asks for a plan of actions (a `directly-answer` one among them) in a flow of its
        # own: the chat template and our system block serve those conversations.
        actions = ("{{ '## Available Tools\n' }}{%- for t in tools -%}{{ t.function.name }}{%- endfor -%}"
                   "{%- for m in messages -%}{{ m.role + ': ' + m.content }}{%- endfor -%}"
                   "{{ \"Write 'Action:' followed by a json-formatted list of actions\" }}")  # fmt: skip
        assert tool_use_template(actions, engine.tokenizer) is None
        assert tool_use_template(None, engine.tokenizer) is None
        hermes = tool_use_template(HERMES2_PRO_TOOL_USE_TEMPLATE, engine.tokenizer)
        assert hermes is not None and hermes.call_format is HERMES and hermes.takes_tool_role
    finally:
        engine.close()


def test_a_reasoning_effort_the_template_refuses_is_its_nearest_that_it_takes(tiny_bundle_path: Path,
                                                                            trusted_keys: Path) -> None:  # fmt: skip
    """Hy3's template takes low and high (and its own no_think) and refuses medium, which OpenAI's
    clients send: medium is rendered as high."""
    from appliance.engine.chat import ChatTemplate
    from appliance.engine.tokenizer import TextTokenizer

    bundle = firmware.load(tiny_bundle_path, trusted_keys)
    tokenizer = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    hy3 = ("{%- if reasoning_effort is defined and reasoning_effort not in ['high', 'low', 'no_think'] -%}"
           "{{ raise_exception('reasoning_effort error : ' + reasoning_effort) }}{%- endif -%}"
           "{%- for m in messages -%}{{ m.content }}{%- endfor -%}[{{ reasoning_effort | default('none') }}]")
    template = ChatTemplate(hy3, tokenizer)
    assert template.efforts == ("low", "high")
    hello = (Message("user", "Hi."),)
    assert [template.prompt(hello, effort=e).text for e in ("low", "medium", "high")] == ["Hi.[low]", "Hi.[high]",
                                                                                        "Hi.[high]"]  # fmt: skip
    assert ChatTemplate("{{ messages[0].content }}[{{ reasoning_effort }}]", tokenizer).prompt(
        hello, effort="medium").text == "Hi.[medium]"  # a template that takes any: as it is


# --- the official clients against the demo firmware -------------------------------------------


def _fan_out(fn: Any, items: list[Any]) -> list[Any]:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # eight at once: the engine batches them
        return list(pool.map(fn, items))


@pytest.mark.demo
def test_a_model_that_loops_on_its_call_sends_it_once_and_ends_the_turn(demo: tuple[RunningDaemon, DevSetup]
                                                                        ) -> None:  # fmt: skip
    # The demo model, asked for the weather with parallel calls allowed, writes the same call again
    # and again until max_tokens (two copies and "length" before): one call and "tool_calls" now.
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
    kw: dict[str, Any] = dict(model=MODEL, max_tokens=60, tools=[tool], tool_choice="required",
                              messages=[{"role": "user", "content": "Weather in Paris?"}])  # fmt: skip
    client = openai_client(*demo)
    choice = client.chat.completions.create(**kw).choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]  # type: ignore[union-attr]
    assert choice.finish_reason == "tool_calls" and calls == [("get_weather", '{"city": "Paris"}')]
    streamed: dict[int, str] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            streamed[d.index] = streamed.get(d.index, "") + (d.function.arguments or "" if d.function else "")
        finish = (chunk.choices[0].finish_reason if chunk.choices else None) or finish
    assert finish == "tool_calls" and streamed == {0: '{"city": "Paris"}'}
    schema = tool["function"]["parameters"]
    message = anthropic_client(*demo).messages.create(
        model=MODEL, max_tokens=60, tool_choice={"type": "any"}, messages=kw["messages"],
        tools=[{"name": "get_weather", "description": "Weather for a city", "input_schema": schema}])  # fmt: skip
    assert message.stop_reason == "tool_use" and [b.type for b in message.content] == ["tool_use"]


@pytest.mark.demo
def test_anthropic_forced_tool_calls_validate_whole_and_streamed(demo: tuple[RunningDaemon, DevSetup]) -> None:
    """Every call the demo model completes validates; one cut off by max_tokens is left out of a
    whole answer, never given half-written. Which prompts a 135M model completes in greedy decoding depends on the CPU's
    int8 kernels: on AMD EPYC all 20, on an Intel Xeon with AMX 19 (it writes "to_email_to_user..."
    into one address until max_tokens). So all but one must complete, whole and streamed alike."""
    client = anthropic_client(*demo)
    cut_off: list[tuple[str, bool]] = []

    def ask(case: tuple[tuple[dict[str, Any], str], bool]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        (tool, prompt), streamed = case
        kw: dict[str, Any] = dict(model=MODEL, max_tokens=200, messages=[{"role": "user", "content": prompt}],
                                  tools=[{"name": t["name"], "description": t["description"],
                                          "input_schema": t["schema"]} for t in TOOLS],
                                  tool_choice={"type": "tool", "name": tool["name"]})  # fmt: skip
        if streamed:
            with client.messages.stream(**kw) as stream:
                message = stream.get_final_message()
        else:
            message = client.messages.create(**kw)
        if message.stop_reason == "max_tokens":
            cut_off.append((prompt, streamed))
            # Whole, the unfinished call is left out (it has no input to give); streamed, its pieces went out.
            assert streamed or message.content == [], message
            return []
        assert message.stop_reason == "tool_use", message
        uses = [b for b in message.content if b.type == "tool_use"]  # parallel calls are allowed
        assert uses and all(u.name == tool["name"] and u.id.startswith("toolu_") for u in uses)
        return [(u.input, tool["schema"]) for u in uses]

    results = _fan_out(ask, [(case, streamed) for streamed in (False, True) for case in CASES])
    for arguments, schema in (pair for uses in results for pair in uses):
        jsonschema.validate(arguments, schema)  # every call parses and validates
    assert len({prompt for prompt, _ in cut_off}) <= 1, cut_off
    assert sorted(p for p, streamed in cut_off if streamed) == sorted(p for p, streamed in cut_off if not streamed)

    # The client runs the tool and sends the result: a text answer comes back.
    tools = [{"name": "get_weather", "description": "Weather in a city", "input_schema": TOOLS[0]["schema"]}]
    first = client.messages.create(model=MODEL, max_tokens=100, tools=tools, tool_choice={"type": "any"},
                                   messages=[{"role": "user", "content": "What's the weather in Paris?"}])  # fmt: skip
    use = next(b for b in first.content if b.type == "tool_use")
    second = client.messages.create(model=MODEL, max_tokens=60, tools=tools, messages=[
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": first.content},  # the SDK sends its own blocks back
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 C"}]},
    ], tool_choice={"type": "none"})  # fmt: skip
    assert second.stop_reason in ("end_turn", "max_tokens") and second.content[0].type == "text"
    assert second.content[0].text.strip()


@pytest.mark.demo
def test_anthropic_auto_gives_text_or_a_valid_call_never_a_broken_one(demo: tuple[RunningDaemon, DevSetup]) -> None:
    client = anthropic_client(*demo)
    tools = [{"name": t["name"], "description": t["description"], "input_schema": t["schema"]} for t in TOOLS]
    schemas = {t["name"]: t["schema"] for t in TOOLS}

    def ask(prompt: str) -> list[Any]:
        message = client.messages.create(model=MODEL, max_tokens=120, tools=tools,
                                         messages=[{"role": "user", "content": prompt}])  # fmt: skip
        return list(message.content) if message.stop_reason != "max_tokens" else []

    for content in _fan_out(ask, [prompt for _, prompt in CASES[::3]] + ["Hi! How are you?"]):
        for block in content:
            assert block.type in ("text", "tool_use")
            if block.type == "tool_use":
                jsonschema.validate(block.input, schemas[block.name])


@pytest.mark.demo
def test_anthropic_prefill_structured_output_and_model_retrieve(demo: tuple[RunningDaemon, DevSetup]) -> None:
    client = anthropic_client(*demo)
    msg = client.messages.create(model=MODEL, max_tokens=20, messages=[
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is"}])  # fmt: skip
    text = msg.content[0].text  # type: ignore[union-attr]
    assert text.strip() and not text.startswith("The capital of France is")
    assert "Paris" in text
    schema = TOOLS[1]["schema"]
    out = client.messages.create(model=MODEL, max_tokens=200, output_config={"format": {
        "type": "json_schema", "schema": schema}}, messages=[{"role": "user", "content": CASES[2][1]}])  # fmt: skip
    jsonschema.validate(json.loads(out.content[0].text), schema)  # type: ignore[union-attr]
    assert client.models.retrieve(MODEL).id == MODEL


@pytest.mark.demo
def test_a_tool_whose_schema_the_grammar_cannot_hold_in_full_is_called_unless_strict(
        demo: tuple[RunningDaemon, DevSetup]) -> None:  # fmt: skip
    """Each dialect, through its official client: a tool with uniqueItems (which the grammar cannot
    express) beside a plain one is called as usual; marked strict, the request is refused with a
    400 that names the tool and the keyword (and not our grammar's rules)."""
    import openai

    tags = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "integer"},
                                                      "uniqueItems": True}}, "required": ["tags"]}  # fmt: skip
    plain = {"type": "object", "properties": {"city": {"type": "string"}}}
    gpt, claude = openai_client(*demo), anthropic_client(*demo)
    ask = [{"role": "user", "content": "Tag it with 1, 2 and 3."}]

    def chat(strict: bool) -> Any:
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": plain}},
                 {"type": "function", "function": {"name": "tag", "parameters": tags, "strict": strict}}]
        return gpt.chat.completions.create(model=MODEL, max_tokens=60, messages=ask, tools=tools,  # type: ignore[arg-type]
                                           tool_choice={"type": "function", "function": {"name": "tag"}})  # fmt: skip

    def responses(strict: bool) -> Any:
        tools = [{"type": "function", "name": "tag", "parameters": tags, "strict": strict}]
        return gpt.responses.create(model=MODEL, max_output_tokens=60, input=ask, tools=tools,  # type: ignore[arg-type]
                                    tool_choice="required")  # fmt: skip

    def messages(strict: bool) -> Any:
        return claude.messages.create(model=MODEL, max_tokens=60, messages=ask,  # type: ignore[arg-type]
                                      tools=[{"name": "tag", "input_schema": tags, "strict": strict}],
                                      tool_choice={"type": "any"})  # fmt: skip

    called = chat(False).choices[0].message.tool_calls[0].function
    assert called.name == "tag"
    assert all(isinstance(t, int) for t in json.loads(called.arguments)["tags"])
    (item,) = [o for o in responses(False).output if o.type == "function_call"]
    assert isinstance(json.loads(item.arguments)["tags"], list)
    (use,) = [b for b in messages(False).content if b.type == "tool_use"]
    assert isinstance(use.input["tags"], list)
    for send, refused in ((chat, openai.BadRequestError), (responses, openai.BadRequestError),
                          (messages, anthropic.BadRequestError)):  # fmt: skip
        with pytest.raises(refused) as error:
            send(True)
        message = str(error.value)
        assert "tools: the schema of tool 'tag' cannot be used to constrain output" in message, message
        assert "uniqueItems" in message and "%json" not in message and "x-guidance" not in message, message


@pytest.mark.demo
@pytest.mark.demo
def test_allowed_tools_hold_calls_to_some_of_the_tools_all_shown(demo: tuple[RunningDaemon, DevSetup]) -> None:
    client = openai_client(*demo, unix=True)
    functions: Any = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                        "parameters": t["schema"]}} for t in TOOLS]  # fmt: skip
    messages: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    chosen = functions[-1]["function"]["name"]
    assert chosen != "get_weather"  # the call the question asks for is not among the allowed
    only: Any = [{"type": "function", "function": {"name": chosen}}]
    done = client.chat.completions.create(
        model=MODEL, max_tokens=200, messages=messages, tools=functions, parallel_tool_calls=False,
        tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": only}})  # fmt: skip
    assert [c.function.name for c in done.choices[0].message.tool_calls or []] == [chosen]  # type: ignore[union-attr]
    every = client.chat.completions.create(model=MODEL, max_tokens=1, messages=messages, tools=functions)
    assert every.usage is not None and done.usage is not None
    assert done.usage.prompt_tokens == every.usage.prompt_tokens  # every tool is shown, whichever may be called
    flat: Any = [{"type": "function", "name": f["function"]["name"], "parameters": f["function"]["parameters"]}
                 for f in functions]  # fmt: skip
    answer = client.responses.create(
        model=MODEL, max_output_tokens=200, input=messages, tools=flat, parallel_tool_calls=False,
        tool_choice={"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": chosen}]})
    assert [o.name for o in answer.output if o.type == "function_call"] == [chosen]
    launch: Any = [{"type": "function", "function": {"name": "launch"}}]
    for bad in ({"mode": "sometimes", "tools": only}, {"mode": "auto", "tools": launch}, {"mode": "auto", "tools": []}):
        with pytest.raises(openai.BadRequestError, match="tool_choice"):
            client.chat.completions.create(model=MODEL, max_tokens=5, messages=messages, tools=functions,
                                           tool_choice={"type": "allowed_tools", "allowed_tools": bad})  # type: ignore


def test_openai_required_tool_calls_and_json_schema_validate_20_of_20(demo: tuple[RunningDaemon, DevSetup]) -> None:
    client = openai_client(*demo)
    functions = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                   "parameters": t["schema"]}} for t in TOOLS]  # fmt: skip

    def call(case: tuple[tuple[dict[str, Any], str], bool]) -> tuple[str, str, str]:
        (tool, prompt), streamed = case
        # The case's tool and one other: which tool fits is the model's choice, and a 135M model's is poor.
        offered = [f for f in functions if f["function"]["name"] in (tool["name"], "get_weather")]
        kw: dict[str, Any] = dict(model=MODEL, max_tokens=200, messages=[{"role": "user", "content": prompt}],
                                  tools=offered, tool_choice="required", parallel_tool_calls=False)  # fmt: skip
        if not streamed:
            choice = client.chat.completions.create(**kw).choices[0]
            assert choice.finish_reason == "tool_calls"
            (tc,) = choice.message.tool_calls or []
            return tc.function.name, tc.function.arguments, tc.id  # type: ignore[union-attr]
        name, args, call_id, finish = "", "", "", None
        for chunk in client.chat.completions.create(stream=True, **kw):
            if not chunk.choices:
                continue
            for d in chunk.choices[0].delta.tool_calls or []:
                assert d.index == 0
                name += d.function.name or "" if d.function else ""
                args += d.function.arguments or "" if d.function else ""
                call_id = d.id or call_id
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls"
        return name, args, call_id

    schemas = {t["name"]: t["schema"] for t in TOOLS}
    for name, args, call_id in _fan_out(call, [(case, streamed) for streamed in (False, True) for case in CASES]):
        assert call_id.startswith("call_")
        jsonschema.validate(json.loads(args), schemas[name])

    def structured(case: tuple[tuple[dict[str, Any], str], bool]) -> tuple[str, dict[str, Any]]:
        (tool, prompt), streamed = case
        kw: dict[str, Any] = dict(model=MODEL, max_tokens=200, messages=[{"role": "user", "content": prompt}],
                                  response_format={"type": "json_schema", "json_schema": {
                                      "name": tool["name"], "schema": tool["schema"], "strict": True}})  # fmt: skip
        if not streamed:
            return client.chat.completions.create(**kw).choices[0].message.content or "", tool["schema"]
        chunks = client.chat.completions.create(stream=True, **kw)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), tool["schema"]

    for text, schema in _fan_out(structured, [(case, streamed) for streamed in (False, True) for case in CASES]):
        jsonschema.validate(json.loads(text), schema)

    # A tool's reply as role "tool", then a text answer.
    first = client.chat.completions.create(model=MODEL, max_tokens=100, tools=functions[:1], tool_choice="required",
                                           parallel_tool_calls=False,
                                           messages=[{"role": "user", "content": "Weather in Paris?"}])  # fmt: skip
    message = first.choices[0].message
    (tc,) = message.tool_calls or []
    second = client.chat.completions.create(model=MODEL, max_tokens=60, tools=functions[:1], messages=[
        {"role": "user", "content": "Weather in Paris?"}, message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tc.id, "content": "Sunny, 24 C"}], tool_choice="none")  # fmt: skip
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls
    assert client.models.retrieve(MODEL).id == MODEL
    prefilled = client.chat.completions.create(model=MODEL, max_tokens=20, messages=[
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is"}])  # fmt: skip
    assert "Paris" in (prefilled.choices[0].message.content or "")


@pytest.mark.demo
def test_the_anthropic_sdk_tool_runner_runs_a_two_step_loop_to_the_end(demo: tuple[RunningDaemon, DevSetup]) -> None:
    from anthropic import beta_tool

    client = anthropic_client(*demo)
    asked: list[str] = []

    @beta_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: the city name
        """
        asked.append(city)
        return f"Sunny, 24 C in {city}"

    # As the SDK runs it by default: it asks for a server-side thread, which this server refuses with the error
    # code that has the runner send the whole conversation instead.
    runner = client.beta.messages.tool_runner(
        model=MODEL, max_tokens=100, tools=[get_weather], max_iterations=4,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        messages=[{"role": "user", "content": "What's the weather in Paris?"}])  # fmt: skip
    replies = []
    for reply in runner:
        replies.append(reply)
        runner.set_messages_params(lambda p: {**p, "tool_choice": {"type": "none"}})  # a call first, then the answer
    assert [r.stop_reason for r in replies] == ["tool_use", "end_turn"] and len(asked) == 1
    assert replies[-1].content[0].type == "text" and replies[-1].content[0].text.strip()
    # A thread asked for outright is refused with that code, not silently dropped.
    thread = client.beta.messages.thread(model=MODEL, max_tokens=10)
    with pytest.raises(anthropic.BadRequestError, match="thread") as refused:
        thread.send({"role": "user", "content": "Hi"})
    assert refused.value.body["error"]["details"] == {"error_code": "thread_unsupported_request"}


def test_logprobs_are_the_models_own_and_a_raw_prompt_skips_the_template(tiny_bundle_path: Path,
                                                                        trusted_keys: Path) -> None:  # fmt: skip
    from appliance.engine.request import TokenLogprob

    engine = Engine(firmware.load(tiny_bundle_path, trusted_keys), EngineConfig(prefix_cache_bytes=0))
    question = (Message("user", "Tell me something."),)

    async def run(request: GenerationRequest) -> list[object]:
        return [e async for e in engine.submit(request)]

    try:
        events = asyncio.run(run(GenerationRequest(question, max_tokens=12, temperature=0.0, logprobs=4)))
        plain = asyncio.run(run(GenerationRequest(question, max_tokens=12, temperature=0.0)))
        raw = engine.prepare(GenerationRequest((), raw_prompt="Once upon a time"))
    finally:
        engine.close()
    tokens = [e for e in events if isinstance(e, TokenLogprob)]
    texts = ["".join(e.text for e in run if isinstance(e, TextDelta)) for run in (events, plain)]
    assert texts[0] == texts[1] and len(tokens) == 12  # asking for log probabilities changes nothing else
    for t in tokens:
        assert len(t.top) == 4 and t.top[0] == (t.token, t.logprob)  # greedy takes the most likely
        assert [lp for _, lp in t.top] == sorted((lp for _, lp in t.top), reverse=True)
        assert sum(np.exp(lp) for _, lp in t.top) <= 1.0 + 1e-6
    assert raw.text == "Once upon a time" and raw.message_starts == []


def test_chat_template_kwargs_are_the_thinking_switch_and_the_template_s_variables() -> None:
    from appliance.api.openai import OPENAI

    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    call = OPENAI.parse({**base, "chat_template_kwargs": {"enable_thinking": False, "thinking": True,
                                                          "custom": [1, "a"]}}, ["m"])  # fmt: skip
    assert call.request.thinking is False
    assert call.request.template_variables == (("thinking", True), ("custom", [1, "a"]))
    call = OPENAI.parse({**base, "reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}}, ["m"])
    assert call.request.thinking is True  # the API's own field decides
    assert OPENAI.parse(base, ["m"]).request.template_variables == ()


def test_plain_completions_parse_echo_and_answer_in_the_legacy_shape() -> None:
    from appliance.api.completions import COMPLETIONS
    from appliance.engine.request import PromptLogprobs, TokenLogprob

    call = COMPLETIONS.parse({"model": "m", "prompt": ["Once"], "max_tokens": 3, "echo": True, "stop": "\n"}, ["m"])
    assert call.request.raw_prompt == "Once" and call.request.messages == () and call.echo
    assert call.request.stop_sequences == ("\n",) and call.request.prompt_logprobs is None
    call = dataclasses.replace(call, echo_texts=("Once",))  # (the app's, once the engine has read the prompt)
    scoring = COMPLETIONS.parse({"model": "m", "prompt": "Once", "echo": True, "logprobs": 1, "max_tokens": 0}, ["m"])
    assert scoring.request.prompt_logprobs == 1 and scoring.request.logprobs == 1 and scoring.request.max_tokens == 0
    for not_scoring in ({"echo": True}, {"logprobs": 1}, {}):  # max_tokens 0 is for scoring the prompt alone
        with pytest.raises(ApiError, match="max_tokens: 0") as err:
            COMPLETIONS.parse({"model": "m", "prompt": "Once", "max_tokens": 0, **not_scoring}, ["m"])
        assert err.value.param == "max_tokens"
    lp = [TokenLogprob(" upon", -0.5, ((" upon", -0.5), (" more", -1.5))), TokenLogprob(" a", -0.1)]
    plain = COMPLETIONS.parse({"model": "m", "prompt": "Once", "logprobs": 2}, ["m"])
    doc = COMPLETIONS.response("m", plain, [(Answer(" upon a", [], lp), finished("max_tokens"))])
    choice = doc["choices"][0]
    assert doc["object"] == "text_completion" and choice["text"] == " upon a" and choice["finish_reason"] == "length"
    assert choice["logprobs"] == {"tokens": [" upon", " a"], "token_logprobs": [-0.5, -0.1],
                                  "top_logprobs": [{" upon": -0.5, " more": -1.5}, {}], "text_offset": [0, 5]}
    doc = COMPLETIONS.response("m", call, [(Answer(" upon"), finished("end_turn"))])
    assert doc["choices"][0]["text"] == "Once upon"
    # A scored prompt: its tokens first (the first without a log probability, as OpenAI's), then the answer's.
    scored = dataclasses.replace(scoring, echo_texts=("Once",))
    prompt = PromptLogprobs("On", (TokenLogprob("ce", -2.0, (("ce", -2.0),)),))
    doc = COMPLETIONS.response("m", scored, [(Answer(" a", [], lp[1:], "", prompt), finished("max_tokens"))])
    assert doc["choices"][0]["text"] == "Once a"
    assert doc["choices"][0]["logprobs"] == {"tokens": ["On", "ce", " a"], "token_logprobs": [None, -2.0, -0.1],
                                             "top_logprobs": [None, {"ce": -2.0}, {}], "text_offset": [0, 2, 4]}
