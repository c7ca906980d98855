"""Tool calls and structured output, as the model sees and writes them.

A call is written in the format the model was trained on, found from its chat template
(`call_format`): the Hermes format that Qwen, SmolLM3 and many fine-tunes use,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Llama 3.1-3.3's JSON, `{"name": "get_weather", "parameters": {"city": "Paris"}}`, which their
templates ask for, Mistral's `[TOOL_CALLS] [{"name": ..., "arguments": ...}]` (Granite's alike after
`<|tool_call|>`), Mistral's later `[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}`, or gpt-oss's
message of its own on the commentary channel, ` to=functions.get_weather
<|constrain|>json<|message|>{...}` after the channel's name (its header is the thought split's:
reasoning.py), Qwen3.5's and Qwen3-Coder's XML, each argument an element whose text is its value
(`QWEN_XML`), LFM2's Python calls, `<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>`
(`CallFormat.python`), Nemotron Nano 2's list between its tags, `<TOOLCALL>[{"name": "get_weather",
"arguments": {...}}]</TOOLCALL>`, or Apertus' between its tokens, each call keyed by its name:
`<|tools_prefix|>[{"get_weather": {...}}]<|tools_suffix|>`, or Command R7B's numbered list,
`<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {...}}\n]<|END_ACTION|>`
(its text answer between `<|START_RESPONSE|>` and `<|END_RESPONSE|>`: `CallFormat.text_wrap`), or Kimi
K2's, each call after a token of its own, named and numbered, `<|tool_calls_section_begin|>
<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{...}<|tool_call_end|>
<|tool_calls_section_end|>` (without the line breaks), or MiniMax-M2's elements between its tags,
`<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n</invoke>
\n</minimax:tool_call>` (`MINIMAX_CALLS`), or DeepSeek's between its tool tokens (`DEEPSEEK_TOKENS`:
V3's and R1's arguments fenced, V3.1's bare) or in its DSML (V3.2's and V4's elements, each
parameter saying whether it is a string). A
model that would write a call its own way and is held to another answers in text instead, in
`auto`. Earlier calls reach the template as `tool_calls` where it renders them, else as text in the
same format; their results in the template's tool turn or as Hermes' `<tool_response>` blocks
(chat.py). The tools reach the model through the chat template (when it takes `tools`) or a system
block of ours (which asks for the Hermes format, or the model's own where its template writes earlier
calls so: DeepSeek V3.1's and R1's distills' list no tools), and the output is held to a grammar built from the
request: free text, a JSON schema, or calls whose names and arguments are those the tools allow. So
a parser that expects exactly that format (`CallParser`) is enough to turn the output back into
calls, even on a 135M model.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from appliance.engine.errors import InvalidRequest

MAX_PARALLEL_CALLS = 8  # calls in one turn when parallel calls are allowed: a small model may otherwise loop
# Where a format's `head` holds the call's id, which the model numbers its calls with (Command R7B's
# count the conversation's calls; Kimi K2's follows the name, in `args_open`): digits, as many as
# CALL_ID_DIGITS.
CALL_ID = "{id}"
CALL_ID_DIGITS = 4


@dataclass(frozen=True)
class CallFormat:
    """How a model writes a turn's calls: `marker` (a special token) and `open`, then each call as
    `head` + name + `args_open` + the arguments' JSON + `close`, `separator` between two, and `end`
    after the last. Any of these may hold the format's `specials`, tokens of the vocabulary that
    decoding drops: the grammar names them by id, and the parser reads the text without them."""

    name: str
    opening: str  # what text never begins with, as a call does (a call is never half-written as text)
    head: str
    args_open: str
    close: str
    separator: str  # between two calls of a turn
    parallel: bool = True  # the model writes more than one call in a turn
    open: str = ""
    end: str = ""
    marker: str = ""  # a special token before the calls, as the model writes it
    specials: tuple[tuple[str, int], ...] = ()  # (text, id in the model's vocabulary) of each special token
    # Harmony's (gpt-oss): a call is a message of its own on this channel, whose header opens it
    # (reasoning.ChannelSplit); the format is what follows the channel's name, and the text answer
    # is another message, on the final channel.
    channel: str = ""
    # The arguments are written as parameters (QWEN_XML), not as a JSON object: each
    # `param_open` + its name + `param_head_end` + its value + `param_close`; a value that is not a
    # string as Python's str() writes it, or (`param_values_json`) as JSON.
    params: bool = False
    param_open: str = "<parameter="
    param_head_end: str = ">\n"
    param_close: str = "\n</parameter>\n"
    param_values_json: bool = False
    # Where set, a string value's head ends so, any other's with param_head_end (DeepSeek V3.2's
    # `string="true"` and `string="false"`).
    param_string_head_end: str = ""
    # What the model may write before its first call, or not (GLM-4.5's newline after its thought).
    lead: str = ""
    # The arguments are written as Python's keyword arguments (LFM2's calls), not as a JSON object.
    python: bool = False
    # The arguments are written in Gemma 4's notation (`gemma_arguments`), not as JSON.
    gemma: bool = False
    # The format's special tokens are kept in the answer's text (`StreamDecoder`'s `kept`), where the
    # parser reads them: Gemma 4's (a string's delimiters are one) and GLM-4.5's (its parameters' tags).
    keeps_specials: bool = False
    # A string parameter holding <, & or a line break is written inside CDATA_WRAP (MiniCPM5's).
    cdata: bool = False
    # Special tokens the model writes its text answer between (Command R7B's <|START_RESPONSE|> and
    # <|END_RESPONSE|>), which a grammar for the answer allows around it.
    text_wrap: tuple[tuple[str, int], tuple[str, int]] | None = None

    def format(self, name: str, arguments: str, index: int = 0) -> str:
        """A call as the model would have written it (`arguments`: JSON text), the turn's `index`-th."""
        if self.params:
            arguments = xml_params(arguments, self)
        elif self.python:
            arguments = python_kwargs(arguments)
        elif self.gemma:
            arguments = gemma_arguments(arguments)
        head, args_open = (part.replace(CALL_ID, str(index)) for part in (self.head, self.args_open))
        return f"{head}{name}{args_open}{arguments}{self.close}"

    def param_head_end_for(self, text: bool) -> str:
        """What ends a parameter's head before its value, written as text or not."""
        return self.param_string_head_end if text and self.param_string_head_end else self.param_head_end

    @property
    def json_arguments(self) -> bool:
        """Whether a call's arguments are written as their JSON object."""
        return not (self.params or self.python or self.gemma)

    @property
    def marker_id(self) -> int | None:
        return dict(self.specials).get(self.marker) if self.marker else None

    @property
    def kept(self) -> dict[int, str]:
        """The special tokens that decoding keeps in the answer's text (id -> text): the parser reads them."""
        return {token: text for text, token in self.specials} if self.keeps_specials else {}

    def visible(self, text: str) -> str:
        """`text` as decoding gives it back: without the special tokens it does not keep."""
        if self.keeps_specials:
            return text
        for special, _ in self.specials:
            text = text.replace(special, "")
        return text

    def lark(self, text: str) -> str:
        """`text` as a sequence of the grammar: its special tokens by id, a call's id as digits, the
        rest as strings."""
        ids = dict(self.specials)
        pieces = re.split("(" + "|".join(map(re.escape, [*ids, CALL_ID])) + ")", text)
        return " ".join(f"<[{ids[p]}]>" if p in ids else f"/[0-9]{{1,{CALL_ID_DIGITS}}}/" if p == CALL_ID
                        else json.dumps(p, ensure_ascii=False) for p in pieces if p)  # fmt: skip


HERMES = CallFormat("hermes", "<tool_call>", '<tool_call>\n{"name": "', '", "arguments": ', "}\n</tool_call>", "\n")
# Their templates refuse more than one call in a turn ("This model only supports single tool-calls at once").
LLAMA3_JSON = CallFormat("llama3_json", '{"name"', '{"name": "', '", "parameters": ', "}", "; ", parallel=False)
# Formats that list a turn's calls after a special token, [{"name": ..., "arguments": ...}, ...]:
# (name, the token, what opens the list, what in a template says it writes calls otherwise).
# Mistral 7B v0.3's, NeMo's and Ministral's; IBM Granite 3.x's.
LISTED_CALLS = (("mistral", "[TOOL_CALLS]", " [", "[ARGS]"), ("granite", "<|tool_call|>", "[", ""))
# Mistral's later templates (Mistral Small 3.x, Magistral, Devstral) write each call after its own
# marker, with a special token between the name and the arguments: [TOOL_CALLS]name[ARGS]{...}.
MISTRAL_ARGS = ("[TOOL_CALLS]", "[ARGS]")
# Qwen3.5's and Qwen3-Coder's templates write each argument as an element of the call, its value as
# text: a string as it is, an object or a list as JSON, anything else as Python's str() of it.
#   <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>
QWEN_XML = CallFormat("qwen_xml", "<tool_call>", "<tool_call>\n<function=", ">\n", "</function>\n</tool_call>", "\n",
                      params=True)  # fmt: skip
PARAM_OPEN = QWEN_XML.param_open
# ByteDance's Seed-OSS writes each call between two special tokens of its own, its parameters
# without Qwen's newlines around their values:
#   <seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>\n</seed:tool_call>
SEED_CALL = ("<seed:tool_call>", "</seed:tool_call>")
# LFM2's templates list the tools (between special tokens, or LFM2.5-Instruct's without them); its
# models write a turn's calls as a Python list of calls between two more special tokens:
#   <|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>
PYTHON_CALLS = ("<|tool_call_start|>", "<|tool_call_end|>")
PYTHON_TOOL_LISTS = ("<|tool_list_start|>", "List of tools: [")
# Swiss AI's Apertus lists a turn's calls between two special tokens, each call an object whose one
# key is the tool's name: <|tools_prefix|>[{"get_weather": {"city": "Paris"}}]<|tools_suffix|>.
APERTUS_CALLS = ("<|tools_prefix|>", "<|tools_suffix|>")
# Cohere's Command R7B (and Command A) list a turn's calls, numbered, between two special tokens,
# one to a line, and write a text answer between two others:
#   <|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {...}}\n]<|END_ACTION|>
COMMAND_ACTIONS = ("<|START_ACTION|>", "<|END_ACTION|>")
COMMAND_RESPONSES = ("<|START_RESPONSE|>", "<|END_RESPONSE|>")
# gpt-oss writes `<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{...}`,
# one call a turn (<|call|> ends the turn: the caller runs it and sends its result back).
HARMONY_MARKERS = ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>", "<|end|>")
# Gemma 4 writes each call between two special tokens, its arguments in a notation of its own (keys
# bare, strings between a third special token), one after another:
#   <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>
GEMMA_CALL = ("<|tool_call>", "<tool_call|>")
GEMMA_QUOTE = '<|"|>'
# NVIDIA's Nemotron Nano 2 lists a turn's calls between tags of its own, text where its vocabulary
# decodes them (special tokens, which decoding drops, where it has them so):
#   <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>
NEMOTRON_CALLS = ("<TOOLCALL>", "</TOOLCALL>")
# ServiceNow's Apriel (1.5 and 1.6 Thinker) lists them so between tags of its own, after a line break:
#   \n<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_calls>
APRIEL_CALLS = ("<tool_calls>", "</tool_calls>")
# (name, its tags, what it may write before them)
TAGGED_LISTS = (("nemotron", NEMOTRON_CALLS, ""), ("apriel", APRIEL_CALLS, "\n"))
# Moonshot's Kimi K2 writes a turn's calls between two special tokens, each call between two more, its
# name after "functions." and numbered (the conversation's calls counted) before a token that opens
# its arguments' JSON:
#   <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{...}
#   <|tool_call_end|><|tool_calls_section_end|>
KIMI_TOKENS = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
               "<|tool_call_argument_begin|>", "<|tool_call_end|>")
# Zhipu's GLM-4.5, 4.6 and 4.7 write each call's name after a tag, then each argument as a key and a
# value between tags, all special tokens of their vocabulary, a value that is not a string as JSON:
#   <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>
# (GLM-4.7's without the newlines), after a newline where it follows the thought or text.
GLM_TAGS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
# MiniMax-M2 writes a turn's calls between two tags (special tokens where its vocabulary has them so),
# each an <invoke> element of <parameter> elements, a value that is not a string as JSON:
#   <minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n</invoke>\n
#   </minimax:tool_call> (without the last line break), after a newline where it follows text.
MINIMAX_CALLS = ("<minimax:tool_call>", "</minimax:tool_call>")
MINIMAX_INVOKE, MINIMAX_PARAMETER = '<invoke name="', '<parameter name="'
# OpenBMB's MiniCPM5 writes each call as a <function> element of <param> elements, a value that is
# not a string as Python's str() writes it, a string holding <, & or a line break inside CDATA_WRAP,
# a line break between two calls and after text:
#   <function name="get_weather"><param name="city">Paris</param><param name="days">3</param></function>
MINICPM5_TAGS = ('<function name="', '<param name="', "</param>", "</function>")
# DeepSeek writes a turn's calls between two tokens of its vocabulary, each call between two more
# (text to decoding where the vocabulary does not mark them special). V2.5's, V3's and R1's
# (and R1's distills') name the call's type, then the tool, its arguments a fenced JSON block, a
# line break between two calls:
#   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{...}\n```<｜tool▁call▁end｜>
#   <｜tool▁calls▁end｜>
# V3.1's name the tool alone, its arguments right after the separator, nothing between two calls:
#   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{...}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
DEEPSEEK_TOKENS = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
                   "<｜tool▁call▁end｜>")  # fmt: skip
DEEPSEEK_FENCE = ("\n```json\n", "\n```")
# DeepSeek V3.2's and V4's "DSML" (V3.2's between <｜DSML｜function_calls> tags, V4's <｜DSML｜tool_calls>),
# after a blank line: each call an <invoke> element of <parameter> elements, each saying whether its
# value is a string (written as it is) or not (JSON):
#   \n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n
#   <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n
#   <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>
DSML = "｜DSML｜"
DSML_HEAD_ENDS = ('" string="true">', '" string="false">')  # a string's parameter, any other's
DSML_TAGS = ('invoke name="', 'parameter name="', *DSML_HEAD_ENDS)
# Tencent's Hy3 writes a turn's calls as GLM-4.5 writes each (GLM_TAGS), but between two more tags, the
# name ended by a separator, every tag suffixed as its template builds them (chat.spelled_out), a
# value that is not a string as JSON:
#   <tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n
#   <arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Paris</arg_value:opensource>\n
#   </tool_call:opensource>\n</tool_calls:opensource>
HY3_TAGS = tuple(f"{tag[:-1]}:opensource>" for tag in ("<tool_calls>", "</tool_calls>", *GLM_TAGS, "<tool_sep>"))
MINICPM5_SPECIALS = ("<function", "<param", "</param>", "</function>")  # (llama.cpp keeps them as tokens)
CDATA_WRAP = ("<![CDATA[", "]]>")


def call_format(template: str, token_id: Callable[[str], int | None],
                special: Callable[[str], bool] = lambda _: True) -> CallFormat:  # fmt: skip
    """The call format a chat template that takes `tools` asks its model for (`token_id`: the
    vocabulary's id of a token, or None; `special`: whether decoding drops a token)."""
    if '"parameters": dictionary of argument name' in template:  # Llama 3.1, 3.2 and 3.3, as published
        return LLAMA3_JSON
    (opens, closes), (open_id, close_id) = SEED_CALL, (token_id(t) for t in SEED_CALL)
    if open_id is not None and close_id is not None and opens in template and "<function=" in template:
        return CallFormat("seed_xml", opens, "\n<function=", ">\n", "</function>\n" + closes, "\n" + opens,
                          marker=opens, specials=((opens, open_id), (closes, close_id)), params=True,
                          param_head_end=">", param_close="</parameter>\n")  # fmt: skip
    if "<function=" in template and PARAM_OPEN in template:
        return QWEN_XML
    # (Its header is read by reasoning.Harmony, which needs <|start|> and <|end|> as well.)
    start, channel, constrain, message, end = (token_id(t) for t in HARMONY_MARKERS)
    header = None not in (start, channel, end)
    if header and message is not None and "<|channel|>" in template and "functions." in template:
        specials = (("<|message|>", message),) + (() if constrain is None else (("<|constrain|>", constrain),))
        args_open = (" <|constrain|>json" if constrain is not None else " json") + "<|message|>"
        return CallFormat("harmony", " to=functions.", " to=functions.", args_open, "", "", parallel=False,
                          specials=specials, channel="commentary")  # fmt: skip
    if all(tag in template for tag in HY3_TAGS):
        opens, closes, call, call_end, key, key_end, value, value_end, sep = HY3_TAGS
        return CallFormat("hy3", opens, call, f"{sep}\n", f"{call_end}\n", "", open=f"{opens}\n", end=closes,
                          params=True, param_open=key, param_head_end=f"{key_end}\n{value}",
                          param_close=f"{value_end}\n", param_values_json=True,
                          specials=_special_tags(HY3_TAGS, token_id, special), keeps_specials=True)  # fmt: skip
    if all(tag in template for tag in GLM_TAGS[2:]) and "<tool_call>" in template:
        return _glm_format(template, token_id, special)
    if all(tag in template for tag in (*MINIMAX_CALLS, MINIMAX_INVOKE, MINIMAX_PARAMETER)):
        opens, closes = MINIMAX_CALLS
        return CallFormat("minimax", opens, MINIMAX_INVOKE, '">\n', "</invoke>\n", "", open=opens + "\n", end=closes,
                          lead="\n", params=True, param_open=MINIMAX_PARAMETER, param_head_end='">',
                          param_close="</parameter>\n", param_values_json=True,
                          specials=_special_tags(MINIMAX_CALLS, token_id, special), keeps_specials=True)  # fmt: skip
    if DSML in template and all(tag in template for tag in DSML_TAGS):
        block = "tool_calls" if "tool_calls>" in template else "function_calls"
        opens, closes = f"<{DSML}{block}>", f"</{DSML}{block}>"
        string, other = DSML_HEAD_ENDS
        return CallFormat("dsml", opens, f'<{DSML}invoke name="', '">\n', f"</{DSML}invoke>\n", "", open=opens + "\n",
                          end=closes, lead="\n\n", params=True, param_open=f'<{DSML}parameter name="',
                          param_head_end=other, param_string_head_end=string, param_close=f"</{DSML}parameter>\n",
                          param_values_json=True, specials=_special_tags((DSML,), token_id, special),
                          keeps_specials=True)  # fmt: skip
    if all(tag in template for tag in MINICPM5_TAGS):
        call, param, param_close, close = MINICPM5_TAGS
        specials = _special_tags(MINICPM5_SPECIALS, token_id, special)
        return CallFormat("minicpm5", call, call, '">', close, "\n", lead="\n", params=True, param_open=param,
                          param_head_end='">', param_close=param_close, cdata=True, specials=specials,
                          keeps_specials=True)  # fmt: skip
    (opens, closes), quote = GEMMA_CALL, GEMMA_QUOTE
    open_id, close_id, quote_id = (token_id(t) for t in (opens, closes, quote))
    if open_id is not None and close_id is not None and quote_id is not None and opens + "call:" in template:
        return CallFormat("gemma4", opens, opens + "call:", "", closes, "", gemma=True, keeps_specials=True,
                          specials=((opens, open_id), (closes, close_id), (quote, quote_id)))  # fmt: skip
    (opens, closes), (open_id, close_id) = PYTHON_CALLS, (token_id(t) for t in PYTHON_CALLS)
    if open_id is not None and close_id is not None and any(t in template for t in (opens, *PYTHON_TOOL_LISTS)):
        return CallFormat("python", opens, "", "(", ")", ", ", open="[", end="]" + closes, marker=opens,
                          specials=((opens, open_id), (closes, close_id)), python=True)  # fmt: skip
    (opens, closes), (open_id, close_id) = COMMAND_ACTIONS, (token_id(t) for t in COMMAND_ACTIONS)
    if open_id is not None and close_id is not None and opens in template and '"tool_name"' in template:
        (starts, ends), (start_id, end_id) = COMMAND_RESPONSES, (token_id(t) for t in COMMAND_RESPONSES)
        wrap = ((starts, start_id), (ends, end_id)) if start_id is not None and end_id is not None else None
        return CallFormat("command", opens, '{"tool_call_id": "' + CALL_ID + '", "tool_name": "', '", "parameters": ',
                          "}", ",\n    ", open="[\n    ", end="\n]" + closes, marker=opens,
                          specials=((opens, open_id), (closes, close_id), *(wrap or ())),
                          text_wrap=wrap)  # fmt: skip
    (opens, closes), (open_id, close_id) = APERTUS_CALLS, (token_id(t) for t in APERTUS_CALLS)
    if open_id is not None and close_id is not None and opens in template:
        return CallFormat("apertus", opens, '{"', '": ', "}", ", ", open="[", end="]" + closes, marker=opens,
                          specials=((opens, open_id), (closes, close_id)))  # fmt: skip
    kimi = {token: token_id(token) for token in KIMI_TOKENS}
    if None not in kimi.values() and KIMI_TOKENS[0] in template:
        opens, closes, call, args, call_end = KIMI_TOKENS
        specials = tuple((token, i) for token, i in kimi.items() if i is not None)
        return CallFormat("kimi", opens, call + "functions.", f":{CALL_ID}{args}", call_end, "", end=closes,
                          marker=opens, specials=specials)  # fmt: skip
    if all(token in template for token in DEEPSEEK_TOKENS):
        return _deepseek_format(template, token_id, special)
    marker, args = MISTRAL_ARGS
    marker_id, args_id = token_id(marker), token_id(args)
    if marker_id is not None and args_id is not None and marker in template and args in template:
        return CallFormat("mistral_args", marker, "", args, "", marker, marker=marker,
                          specials=((marker, marker_id), (args, args_id)))  # fmt: skip
    for name, (opens, closes), lead in TAGGED_LISTS:
        open_id, close_id = token_id(opens), token_id(closes)
        if opens + "[" not in template or "]" + closes not in template:
            continue
        if open_id is not None and close_id is not None and special(opens) and special(closes):
            return CallFormat(name, '[{"name"', '{"name": "', '", "arguments": ', "}", ", ", open="[",
                              end="]" + closes, marker=opens, lead=lead,
                              specials=((opens, open_id), (closes, close_id)))  # fmt: skip
        return CallFormat(name, opens, '{"name": "', '", "arguments": ', "}", ", ", open=opens + "[",
                          end="]" + closes, lead=lead)  # fmt: skip
    for name, marker, open_, unlike in LISTED_CALLS:
        marker_id = token_id(marker)
        if marker_id is not None and marker in template and not (unlike and unlike in template):
            return CallFormat(name, '[{"name"', '{"name": "', '", "arguments": ', "}", ", ", open=open_, end="]",
                              marker=marker, specials=((marker, marker_id),))  # fmt: skip
    return HERMES


def _glm_format(template: str, token_id: Callable[[str], int | None], special: Callable[[str], bool]) -> CallFormat:
    """GLM-4.5's calls (GLM_TAGS), with the newlines its template writes around them (GLM-4.7's
    writes none); its tags that are special tokens of the vocabulary are named by id in the
    grammar and kept in the text the parser reads."""
    line = "\n" if "</arg_key>\n<arg_value>" in template else ""
    return CallFormat("glm", "<tool_call>", "<tool_call>", line, "</tool_call>", line, lead=line, params=True,
                      param_open="<arg_key>", param_head_end=f"</arg_key>{line}<arg_value>",
                      param_close=f"</arg_value>{line}", param_values_json=True,
                      specials=_special_tags(GLM_TAGS, token_id, special), keeps_specials=True)  # fmt: skip


def _deepseek_format(template: str, token_id: Callable[[str], int | None],
                     special: Callable[[str], bool]) -> CallFormat:  # fmt: skip
    """DeepSeek's calls (DEEPSEEK_TOKENS), fenced as V3's and R1's templates write them or bare as
    V3.1's do; its tokens that are special tokens of the vocabulary are named by id in the grammar
    and kept in the text the parser reads."""
    opens, closes, call, sep, call_end = DEEPSEEK_TOKENS
    specials = _special_tags(DEEPSEEK_TOKENS, token_id, special)
    fence_open, fence_close = DEEPSEEK_FENCE
    if fence_open.strip() in template:
        return CallFormat("deepseek", opens, f"{call}function{sep}", fence_open, fence_close + call_end, "\n",
                          open=opens, end=closes, specials=specials, keeps_specials=True)  # fmt: skip
    return CallFormat("deepseek_v3_1", opens, call, sep, call_end, "", open=opens, end=closes, specials=specials,
                      keeps_specials=True)  # fmt: skip


def _special_tags(tags: Sequence[str], token_id: Callable[[str], int | None],
                  special: Callable[[str], bool]) -> tuple[tuple[str, int], ...]:  # fmt: skip
    """(tag, id) of those of a format's `tags` that are special tokens of the vocabulary (GLM-4.5's,
    MiniMax-M2's, MiniCPM5's, DeepSeek's: the others, text to decoding, are text to the grammar too)."""
    ids = {tag: token_id(tag) for tag in tags}
    return tuple((tag, i) for tag, i in ids.items() if i is not None and special(tag))


@dataclass(frozen=True)
class PastCall:
    """An earlier call of the conversation, as a client sends it back."""

    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    schema: Mapping[str, Any]  # JSON schema of the arguments (an object)
    strict: bool = False  # every keyword of the schema enforced, or the request refused (see `grammar`)

    def as_function(self) -> dict[str, Any]:
        """The OpenAI/Hugging Face shape that chat templates take in `tools`."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": dict(self.schema)}}


@dataclass(frozen=True)
class ToolChoice:
    mode: str = "auto"  # "auto": text or calls; "required": at least one call; "none": text only; "tool": `name`
    name: str | None = None
    parallel: bool = True  # more than one call in a turn
    # The tools the model may call, of all it is shown (OpenAI's allowed_tools: the list, and so the
    # prompt and its cached prefix, stays the same from turn to turn); None: any of them.
    allowed: tuple[str, ...] | None = None

    def callable(self, tools: tuple[Tool, ...]) -> tuple[Tool, ...]:
        names = (self.name,) if self.mode == "tool" else self.allowed
        return tools if names is None else tuple(t for t in tools if t.name in names)


@dataclass(frozen=True)
class OutputRules:
    """What the answer may be: the request's tools and choice, and a JSON schema for a text answer."""

    tools: tuple[Tool, ...] = ()
    choice: ToolChoice = field(default_factory=ToolChoice)
    json_schema: Mapping[str, Any] | None = None  # the text answer must be JSON valid against it
    schema_field: str = "response_format"  # what the client called it, for errors
    schema_strict: bool = False  # json_schema's every keyword enforced, or the request refused
    # Else the text answer's own Lark rule: one of given strings, or a regular expression (choice_rule,
    # regex_rule: vLLM's guided choice and regex).
    answer_rule: str | None = None

    @property
    def constrained(self) -> bool:
        return bool(self.tools) or self.json_schema is not None or self.answer_rule is not None

    @property
    def calls_allowed(self) -> bool:
        return bool(self.tools) and self.choice.mode != "none"


def _argument_values(arguments: str) -> dict[str, Any]:
    """A call's arguments (JSON text of an object) as a mapping; empty where they are not an object."""
    try:
        values = json.loads(arguments)
    except ValueError:
        return {}
    return values if isinstance(values, dict) else {}


def xml_params(arguments: str, fmt: CallFormat = QWEN_XML) -> str:
    """A call's arguments (JSON text of an object) as parameters, as the templates of QWEN_XML (and
    Seed-OSS's and GLM-4.5's, whose framing `fmt` says) write them."""
    values = _argument_values(arguments)
    return "".join(f"{fmt.param_open}{key}{fmt.param_head_end_for(isinstance(value, str))}"
                   f"{_param_text(value, fmt.param_values_json, fmt.cdata)}{fmt.param_close}"
                   for key, value in values.items())  # fmt: skip


def _param_text(value: Any, as_json: bool = False, cdata: bool = False) -> str:
    """A value as Jinja writes it in those templates: a string as it is (inside CDATA_WRAP where
    `cdata` and it holds <, & or a line break), `tojson` for an object or a list, else `string`
    (Python's str: True, None, 1.5), or `tojson` for anything (`as_json`)."""
    if isinstance(value, str):
        return value.join(CDATA_WRAP) if cdata and any(c in value for c in "<&\n") else value
    return json.dumps(value, ensure_ascii=False) if as_json or isinstance(value, dict | list) else str(value)


def param_json(text: str, schema: Mapping[str, Any] | None) -> str:
    """A parameter's text as the JSON value its schema's type reads it as (what a client expects
    of the call's arguments): a string's text as it is; a boolean, a number, null, an object or a
    list from what the model wrote (JSON, or Python's spelling of it); a string where it is
    neither."""
    kinds = _kinds(schema or {})
    word = text.strip()
    if _is_text(kinds) or (not kinds and all(isinstance(v, str) for v in (schema or {}).get("enum", [0]))):
        return "null" if "null" in kinds and word in ("None", "null") else json.dumps(text, ensure_ascii=False)
    if word in _JSON_NAMES:
        return json.dumps(_JSON_NAMES[word])
    try:
        return json.dumps(json.loads(word), ensure_ascii=False)
    except ValueError:
        return json.dumps(text, ensure_ascii=False)


def python_kwargs(arguments: str) -> str:
    """A call's arguments (JSON text of an object) as Python's keyword arguments, as LFM2 writes
    them: `city="Paris", nights=3, pets=True`."""
    values = _argument_values(arguments)
    return ", ".join(f"{key}={_python_literal(value)}" for key, value in values.items())


def _python_literal(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_python_literal(str(k))}: {_python_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(map(_python_literal, value)) + "]"
    return json.dumps(value, ensure_ascii=False)  # a string in double quotes, as JSON escapes it; a number


_JSON_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def python_arguments(text: str, properties: Sequence[str] = ()) -> str | None:
    """The JSON object of a call's Python arguments (`text`, what is between its parentheses), or
    None where they are not Python's literals: keyword arguments by name, positional ones by the
    schema's `properties` in order; JSON's spellings of true, false and null are read too."""
    try:
        call = ast.parse(f"f({text})", mode="eval").body
        assert isinstance(call, ast.Call)
        if len(call.args) > len(properties) or any(k.arg is None for k in call.keywords):
            return None
        values = {name: _literal(node) for name, node in zip(properties, call.args, strict=False)}
        values.update((str(k.arg), _literal(k.value)) for k in call.keywords)
        return json.dumps(values, ensure_ascii=False)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def gemma_arguments(arguments: str) -> str:
    """JSON arguments in Gemma 4's notation, as its chat template writes a call: an object's keys
    bare and in order, a string between GEMMA_QUOTE tokens, numbers and booleans as JSON writes
    them, null as Python's None."""
    return _gemma_value(_argument_values(arguments))


def _gemma_value(value: Any) -> str:
    if isinstance(value, str):
        return GEMMA_QUOTE + value + GEMMA_QUOTE
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "None"}[value]
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_gemma_value(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_gemma_value(v) for v in value) + "]"
    return json.dumps(value)


_GEMMA_WORD = re.compile(r"[^,:{}\[\]]+")  # a value Gemma 4 wrote without its quotes (up to what ends it)


def gemma_json(text: str) -> str | None:
    """Arguments Gemma 4 wrote (`{key:value,...}`, GEMMA_QUOTE around strings) as JSON text, or
    None where they are not its notation. A key may be quoted too; a word outside quotes that is
    no number or literal is read as a string, as a small model may leave its quotes out."""
    pos = 0

    def value() -> Any:
        nonlocal pos
        if text.startswith(GEMMA_QUOTE, pos):
            end = text.find(GEMMA_QUOTE, pos + len(GEMMA_QUOTE))
            if end < 0:
                raise ValueError("an unclosed string")
            out, pos = text[pos + len(GEMMA_QUOTE) : end], end + len(GEMMA_QUOTE)
            return out
        if text.startswith("{", pos):
            pos += 1
            obj: dict[str, Any] = {}
            while not text.startswith("}", pos):
                if obj:
                    expect(",")
                key = value()
                expect(":")
                obj[str(key)] = value()
            pos += 1
            return obj
        if text.startswith("[", pos):
            pos += 1
            items: list[Any] = []
            while not text.startswith("]", pos):
                if items:
                    expect(",")
                items.append(value())
            pos += 1
            return items
        match = _GEMMA_WORD.match(text, pos)
        if match is None:
            raise ValueError(f"no value at {pos}")
        pos = match.end()
        word = match.group().strip()
        if word in _JSON_NAMES:
            return _JSON_NAMES[word]
        try:
            return json.loads(word)
        except ValueError:
            return word

    def expect(mark: str) -> None:
        nonlocal pos
        if not text.startswith(mark, pos):
            raise ValueError(f"{mark!r} expected at {pos}")
        pos += len(mark)

    try:
        parsed = value()
    except (ValueError, RecursionError):
        return None
    if pos != len(text) or not isinstance(parsed, dict):
        return None
    return json.dumps(parsed, ensure_ascii=False)


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float | bool | type(None)):
        return node.value
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        number = _literal(node.operand)
        if isinstance(number, int | float) and not isinstance(number, bool):
            return -number if isinstance(node.op, ast.USub) else number
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        return {str(_literal(k)): _literal(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    raise ValueError(f"not a literal: {ast.dump(node)[:80]}")


def format_calls(calls: Sequence[PastCall], fmt: CallFormat) -> str:
    """A turn's earlier calls as the model would have written them."""
    written = (fmt.format(c.name, c.arguments, i) for i, c in enumerate(calls))
    return fmt.marker + fmt.open + fmt.separator.join(written) + fmt.end


def format_results(results: Sequence[tuple[str, bool]]) -> str:
    """Tool results (content, is_error) as one user turn, as Hermes-format templates render them."""
    parts = []
    for content, is_error in results:
        body = f"Error: {content}" if is_error else content
        parts.append(f"<tool_response>\n{body}\n</tool_response>")
    return "\n".join(parts)


def system_block(tools: Sequence[Tool], fmt: CallFormat = HERMES) -> str:
    """How the tools reach a model whose chat template does not take them: in the Hermes format,
    or in the model's own (`fmt`, one whose arguments are JSON), shown as its template writes calls."""
    listing = "\n".join(json.dumps(t.as_function(), ensure_ascii=False) for t in tools)
    listed = ("You may call one or more functions to assist with the user query. The functions you can call, as "
              f"JSON schemas:\n<tools>\n{listing}\n</tools>\n")  # fmt: skip
    if fmt is HERMES:
        return listed + ('To call a function, answer with its name and arguments as JSON inside tags:\n<tool_call>\n'
                         '{"name": <function-name>, "arguments": <arguments-object>}\n</tool_call>')  # fmt: skip
    example = format_calls([PastCall("<function-name>", "<arguments-object>")], fmt)
    return listed + f"To call a function, answer in this format, its arguments a JSON object:\n{example}"


def schema_block(schema: Mapping[str, Any]) -> str:
    """How a JSON schema for the answer reaches the model. Any object (OpenAI's json_object) is
    said in words: shown the schema {"type": "object"}, small models answer with it."""
    if dict(schema) == {"type": "object"}:
        return "Answer with a JSON object only."
    return "Answer with JSON only, matching this JSON schema:\n" + json.dumps(schema, ensure_ascii=False)


def choice_rule(options: Sequence[str]) -> str:
    """An answer that is one of these strings, as they are."""
    return " | ".join(json.dumps(option, ensure_ascii=False) for option in options)


def regex_rule(pattern: str) -> str:
    """An answer the regular expression matches whole (its slashes escaped for Lark's /.../)."""
    return "/" + re.sub(r"(?<!\\)/", r"\/", pattern) + "/"


def grammar(rules: OutputRules, fmt: CallFormat = HERMES) -> str | None:
    """The Lark grammar (llguidance's dialect, with %json for schemas) the answer must match; None:
    unconstrained.

    A schema is enforced in full where the client asked for strict output; otherwise leniently:
    keywords the grammar cannot express (uniqueItems, not, if/then, contains...) are left
    unenforced rather than refusing the request, as OpenAI and Anthropic do not constrain a
    non-strict schema at all (an agent's tool list often carries such keywords)."""
    if not rules.constrained:
        return None
    if rules.json_schema is not None:
        text = "answer: " + schema_rule(rules.json_schema, rules.schema_strict)
    elif rules.answer_rule is not None:
        text = "answer: " + rules.answer_rule
    else:  # free text that does not begin as a call would (so a call is never half-written as text)
        lead = f"( |{fmt.lead})?".replace("\n", "\\n") if fmt.lead else " ?"
        text = f"answer: TEXT\nTEXT: /(.|\\n)*/ & ~/{lead}{re.escape(fmt.opening)}(.|\\n)*/"
    # The answer as it is, or between the tokens the model wraps its text in.
    wrapped = f" | {fmt.lark(fmt.text_wrap[0][0])} answer {fmt.lark(fmt.text_wrap[1][0])}" if fmt.text_wrap else ""
    text = f"text: answer{wrapped}\n{text}"
    if not rules.calls_allowed:
        return f"start: text\n{text}\n"
    tools = rules.choice.callable(rules.tools)
    lines = []
    for i, tool in enumerate(tools):
        parts = (fmt.lark(fmt.head + tool.name + fmt.args_open), f"args_{i}", fmt.lark(fmt.close))
        lines.append(f"call_{i}: " + " ".join(p for p in parts if p))
        schema = _object_schema(tool.schema)
        if not fmt.json_arguments and not schema.get("properties") \
                and schema.get("additionalProperties") is False:  # a tool that takes no arguments
            lines.append(f"args_{i}: " + ('"{}"' if fmt.gemma else '""'))  # (JSON's schema rule writes {})
        elif fmt.params:
            lines += _param_rules(f"args_{i}", schema, tool.strict, fmt)
        elif fmt.python:
            lines += _kwarg_rules(f"args_{i}", schema, tool.strict)
        elif fmt.gemma:
            lines += _gemma_rules(f"args_{i}", schema, tool.strict)
        else:
            lines.append(f"args_{i}: " + schema_rule(schema, tool.strict))
    if fmt.gemma:
        lines += [f"gemma_quote: {fmt.lark(GEMMA_QUOTE)}", *_GEMMA_SHARED]
    parallel = rules.choice.parallel and fmt.parallel
    more = f"({fmt.lark(fmt.separator)} call){{0,{MAX_PARALLEL_CALLS - 1}}}" if parallel else ""
    lead = f"({fmt.lark(fmt.lead)})?" if fmt.lead else ""
    calls = " ".join(p for p in (lead, fmt.lark(fmt.marker + fmt.open), "call", more, fmt.lark(fmt.end)) if p)
    start = "calls" if rules.choice.mode in ("required", "tool") else "text | calls"
    return "\n".join([f"start: {start}", text, f"calls: {calls}",
                      "call: " + " | ".join(f"call_{i}" for i in range(len(tools))), *lines]) + "\n"  # fmt: skip


def _param_rules(name: str, schema: Mapping[str, Any], strict: bool, fmt: CallFormat) -> list[str]:
    """Rules for a call's arguments as parameters (QWEN_XML): the schema's properties in its order,
    each optional unless required; a string's value is text that ends where its element closes
    (an enum's, one of its values; a strict tool's, held to its pattern and lengths), any other
    value JSON held to its schema (a boolean also in Python's spelling, as the templates write
    it). A schema that lists no properties takes any parameters of text (one that allows none is
    `grammar`'s). The parameters' framing is the format's (`param_open`, `param_head_end`,
    `param_close`, special tokens named by id)."""
    close, param_open = fmt.lark(fmt.param_close), fmt.lark(fmt.param_open)
    head_end, text_head_end = (fmt.lark(fmt.param_head_end_for(text)) for text in (False, True))
    # A string's text ends where its element's close is written: a lazy lexeme that the close
    # stops, or (a close that opens with a special token, which text never holds) any text,
    # which the close follows.
    special = any(fmt.param_close.startswith(t) for t, _ in fmt.specials)
    text, then = (": /(.|\\n)*/", f" {close}") if special else (f"[stop={close}]: /(.|\\n)*/", "")
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        return [f"{name}: ({param_open} /[A-Za-z0-9_.-]+/ {text_head_end} {name}_text{then})*", f"{name}_text{text}"]
    required = set(schema.get("required") or ())
    rules, parts = [], []
    for k, (key, sub) in enumerate(properties.items()):
        parts.append(f"{name}_p{k}" + ("" if key in required else "?"))
        sub = sub if isinstance(sub, Mapping) else {}
        body = _param_value(sub, strict)
        ends = text_head_end if body is None or _string_choices(sub) else head_end
        value, opening = f"{name}_v{k}", f"{param_open} {json.dumps(key, ensure_ascii=False)} {ends}"
        if body is None:  # text
            held = _text_regex(sub, key, "" if special else fmt.param_close) if strict else None
            lexeme = f"{value}: {held}" if special else f"{value}[lazy]: {held}"
            rules += [f"{name}_p{k}: {opening} {value}{then}", lexeme if held else f"{value}{text}"]
        else:
            rules += [f"{name}_p{k}: {opening} {value} {close}", f"{value}: {body}"]
    return [f"{name}: " + " ".join(parts), *rules]


def _kwarg_rules(name: str, schema: Mapping[str, Any], strict: bool) -> list[str]:
    """Rules for a call's arguments as Python's keyword arguments (`CallFormat.python`): the
    schema's properties in its order, ", " between two; each value JSON held to its property's
    schema (a string in double quotes is Python's too), a boolean and null in Python's spelling."""
    return _keyword_rules(name, schema, strict, ", ", "=", _kwarg_value)


ValueRules = Callable[[str, Mapping[str, Any], bool], list[str]]


def _keyword_rules(name: str, schema: Mapping[str, Any], strict: bool, separator: str, assign: str,
                   value: ValueRules, order: Callable[[list[str]], list[str]] = list) -> list[str]:  # fmt: skip
    """Rules for arguments written as keyword and value pairs: the schema's properties (in
    `order`), each optional unless required, `separator` between two, `assign` between a key and
    its value (whose rules `value` makes). A schema that lists no properties takes any keywords
    (one that allows none is `grammar`'s).

    `{name}_f{k}` is the arguments from property k on where none came before, `{name}_m{k}` where
    some did (each rule only what is not empty: a rule that may be empty is used as `rule?`)."""
    sep, eq = json.dumps(separator), json.dumps(assign)
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        return [f"{name}: ({name}_kw ({sep} {name}_kw)*)?", f"{name}_kw: /[A-Za-z_][A-Za-z0-9_]*/ {eq} {name}_any",
                *value(f"{name}_any", {}, strict)]  # fmt: skip
    keys, required = order(list(properties)), set(schema.get("required") or ())
    n = len(keys)
    optional_from = [all(key not in required for key in keys[k:]) for k in range(n + 1)]

    def rest(k: int) -> str:  # the arguments from property k on, after some
        return "" if k == n else f" {name}_m{k}" + ("?" if optional_from[k] else "")

    rules = [f"{name}: {name}_f0" + ("?" if optional_from[0] else "")]
    for k, key in enumerate(keys):
        sub = properties[key]
        rules += [f"{name}_i{k}: {json.dumps(key + assign, ensure_ascii=False)} {name}_v{k}",
                  *value(f"{name}_v{k}", sub if isinstance(sub, Mapping) else {}, strict)]  # fmt: skip
        skip = key not in required and k + 1 < n
        rules.append(f"{name}_m{k}: {sep} {name}_i{k}{rest(k + 1)}" + (f" | {name}_m{k + 1}" if skip else ""))
        rules.append(f"{name}_f{k}: {name}_i{k}{rest(k + 1)}" + (f" | {name}_f{k + 1}" if skip else ""))
    return rules


def _kwarg_value(rule: str, schema: Mapping[str, Any], strict: bool) -> list[str]:
    """The rules of a keyword argument's value: JSON held to `schema`, with Python's True, False
    and None where it is a boolean or may be null."""
    kinds = _kinds(schema)
    if kinds == {"boolean"}:
        return [f'{rule}: "True" | "False"']
    if "null" not in kinds:
        return [f"{rule}: {schema_rule(schema, strict)}"]
    if kinds == {"null"}:
        return [f'{rule}: "None"']
    other = schema_rule({**schema, "type": sorted(kinds - {"null"})}, strict)
    return [f'{rule}: {rule}_json | "None"', f"{rule}_json: {other}"]


def _gemma_rules(name: str, schema: Mapping[str, Any], strict: bool) -> list[str]:
    """Rules for a call's arguments in Gemma 4's notation (`CallFormat.gemma`): an object, its
    properties in sorted order as its template writes them, "," between two, ":" after a key."""
    inner = _keyword_rules(f"{name}_o", schema, strict, ",", ":", _gemma_value_rules, sorted)
    return [f'{name}: "{{" {name}_o "}}"', *inner]


_GEMMA_NUMBER = r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/"
_GEMMA_INTEGER = r"/-?(0|[1-9][0-9]*)/"
# The rules every Gemma 4 grammar has (`grammar` adds them): a string is text between two
# GEMMA_QUOTE tokens; `gemma_any` is any value, for a schema that says nothing of it.
_GEMMA_SHARED = (
    "gemma_text: /(.|\\n)*/",
    f'gemma_any: gemma_quote gemma_text gemma_quote | {_GEMMA_NUMBER} | "true" | "false" | "None" '
    '| "{" (gemma_key ":" gemma_any ("," gemma_key ":" gemma_any)*)? "}" | "[" (gemma_any ("," gemma_any)*)? "]"',
    "gemma_key: /[A-Za-z_][A-Za-z0-9_]*/",
)


def _gemma_value_rules(rule: str, schema: Mapping[str, Any], strict: bool) -> list[str]:
    """The rules of a value in Gemma 4's notation, held to `schema`'s type, enum, properties and
    items; what the notation cannot hold (a string's pattern, format or lengths, an array's
    bounds) is left unenforced, and refused where the tool is strict."""
    if strict:
        held = [k for k in ("pattern", "format", "minLength", "maxLength", "minItems", "maxItems") if k in schema]
        if held:
            raise InvalidRequest(f"tools: a parameter's {held[0]!r} cannot be held in strict mode by this model's call "
                                 "format (Gemma 4's notation); send the tool without strict", "tools")  # fmt: skip
    choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(choices, list) and choices:
        return [f"{rule}: " + " | ".join(_gemma_literal(c) for c in choices)]
    options = [o for o in (schema.get("anyOf") or schema.get("oneOf") or ()) if isinstance(o, Mapping)]
    if options:
        return [f"{rule}: " + " | ".join(f"{rule}_{i}" for i in range(len(options))),
                *(r for i, o in enumerate(options) for r in _gemma_value_rules(f"{rule}_{i}", o, strict))]
    kinds = _kinds(schema)
    if not kinds:
        return [f"{rule}: gemma_any"]
    bodies, rules = [], []
    for kind in sorted(kinds):
        if kind == "string":
            bodies.append("gemma_quote gemma_text gemma_quote")
        elif kind in ("number", "integer"):
            bodies.append(_GEMMA_INTEGER if kind == "integer" else _GEMMA_NUMBER)
        elif kind == "boolean":
            bodies.append('"true" | "false"')
        elif kind == "null":
            bodies.append('"None"')
        elif kind == "object":
            bodies.append(f"{rule}_obj")
            rules += _gemma_rules(f"{rule}_obj", schema if kinds == {"object"} else {}, strict)
        elif kind == "array":
            items = schema.get("items") if kinds == {"array"} else None
            item = f"{rule}_item"
            bodies.append(f'"[" ({item} ("," {item})*)? "]"')
            rules += _gemma_value_rules(item, items if isinstance(items, Mapping) else {}, strict)
    return [f"{rule}: " + " | ".join(bodies), *rules]


def _gemma_literal(value: Any) -> str:
    """A JSON value as a rule that writes it in Gemma 4's notation."""
    pieces: list[str] = []
    for i, part in enumerate(_gemma_value(value).split(GEMMA_QUOTE)):
        pieces += (["gemma_quote"] if i else []) + ([json.dumps(part, ensure_ascii=False)] if part else [])
    return " ".join(pieces)


def _text_regex(schema: Mapping[str, Any], key: str, param_close: str) -> str | None:
    """What a strict string parameter's text and its element's close are held to where its schema
    constrains the text (None: it does not): its pattern (searched, as JSON Schema does, unless
    anchored at both ends) and its lengths, as llguidance's regexes of a lazy lexeme (the text
    ends at the first close); `None`, Python's null, too where it may be null. (A stop lexeme
    whose regex cannot go on allows only the end of the output after it.) A format cannot be held
    in text and is refused, as is a pattern anchored inside."""
    if "format" in schema:
        raise InvalidRequest(f"tools: parameter {key!r} has format {schema['format']!r}, which this model's call "
                             "format (its parameters written as plain text) cannot hold in strict mode; send the "
                             "tool without strict, or the parameter without its format", "tools")  # fmt: skip
    pattern, low, high = schema.get("pattern"), schema.get("minLength"), schema.get("maxLength")
    regexes = []
    if isinstance(pattern, str):
        regexes.append(_searched(pattern, key))
    if isinstance(low, int) or isinstance(high, int):
        regexes.append(f"(.|\\n){{{low if isinstance(low, int) else 0},{high if isinstance(high, int) else ''}}}")
    either = "|None" if "null" in _kinds(schema) else ""
    close = param_close.replace("\n", "\\n").replace("/", "\\/")  # as the regex literal writes it
    return " & ".join(f"/(?:{r}{either}){close}/" for r in regexes) or None


def _searched(pattern: str, key: str) -> str:
    """A JSON Schema pattern as a regex the whole text must match: found anywhere in it unless
    anchored at its start (^) and its end ($); `/` escaped for the grammar's regex literal."""
    depth, in_class, escaped, anchors = 0, False, False, []  # anchors: ^, $ and | outside any group
    for i, ch in enumerate(pattern):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch in "()":
            depth += 1 if ch == "(" else -1
        elif depth == 0 and ch in "^$|":
            anchors.append((i, ch))
    start = bool(anchors) and anchors[0] == (0, "^")
    end = bool(anchors) and anchors[-1] == (len(pattern) - 1, "$") and len(pattern) > int(start)
    if len(anchors) - start - end > 0:
        raise InvalidRequest(f"tools: parameter {key!r} has the pattern {pattern!r}, whose anchors or alternatives "
                             "this model's call format cannot hold in strict mode; send the tool without strict",
                             "tools")  # fmt: skip
    core = re.sub(r"(?<!\\)/", r"\/", pattern[int(start) : len(pattern) - int(end)])
    return ("" if start else "(.|\\n)*") + f"(?:{core})" + ("" if end else "(.|\\n)*")


def _kinds(schema: Mapping[str, Any]) -> set[str]:
    """A schema's `type`, as a set (empty where it names none)."""
    kinds = schema.get("type")
    return {str(k) for k in kinds} if isinstance(kinds, list) else {kinds} if isinstance(kinds, str) else set()


def _is_text(kinds: set[str]) -> bool:
    """A string (or a string or null, which the templates write as None): the model writes text."""
    return "string" in kinds and kinds <= {"string", "null"}


def _string_choices(schema: Mapping[str, Any]) -> list[str]:
    """The strings a parameter's value is one of (its enum's, or its const), where they are all strings."""
    choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
    return choices if isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices) else []


def _param_value(schema: Mapping[str, Any], strict: bool) -> str | None:
    """The grammar of a parameter's value (None: text up to the element's close)."""
    kinds = _kinds(schema)
    strings = _string_choices(schema)
    if strings:
        return " | ".join(json.dumps(c, ensure_ascii=False) for c in strings)
    if _is_text(kinds) or (not kinds and "enum" not in schema and "const" not in schema):
        return None
    if kinds == {"boolean"}:
        return '"true" | "false" | "True" | "False"'
    return schema_rule(schema, strict)


# JSON as the model writes it under a grammar: one line with the usual separators. Flexible
# whitespace lets a small model spend its tokens on newlines and indentation.
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def schema_rule(schema: Mapping[str, Any], strict: bool) -> str:
    """The grammar's rule body for JSON valid against `schema`: our JSON style, and objects that
    list their properties closed to others unless the schema says otherwise (output still
    validates against the original; it just cannot wander into invented keys until max_tokens
    cuts it off); `strict` False leaves what the grammar cannot express unenforced."""
    out = _closed(schema)
    assert isinstance(out, dict)
    out["x-guidance"] = {**_JSON_STYLE, "lenient": not strict}
    return "%json " + json.dumps(out, ensure_ascii=False)


_SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}  # name -> schema
_VALUES = {"enum", "const", "default", "examples"}  # JSON values, not schemas


def _closed(node: Any, in_all_of: bool = False) -> Any:
    if isinstance(node, list):
        return [_closed(item, in_all_of) for item in node]
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _VALUES:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: _closed(sub) for name, sub in value.items()}
        else:
            out[key] = _closed(value, key == "allOf")
    if "properties" in out and "additionalProperties" not in out and not in_all_of:
        out["additionalProperties"] = False  # (allOf members each list part of the properties)
    return out


def _object_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments are always an object; a tool with no schema takes any object."""
    out = dict(schema) if schema else {}
    out.setdefault("type", "object")
    return out


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    name: str


@dataclass(frozen=True)
class CallArguments:
    index: int
    json: str  # the next piece of the arguments' JSON text


Part = TextPart | CallStart | CallArguments


def _head_end(text: str, head: str) -> int | None:
    """Where `head` (a call's opening, or what opens its arguments, CALL_ID in it standing for
    digits) ends in `text`; None where `text` may yet become it, -1 where it cannot."""
    at = 0
    for n, piece in enumerate(head.split(CALL_ID)):
        if n:  # the call's id
            digits = at
            while digits < len(text) and text[digits] in "0123456789":
                digits += 1
            if digits - at > CALL_ID_DIGITS:
                return -1
            if digits == len(text):
                return None
            if digits == at:
                return -1
            at = digits
        got = text[at : at + len(piece)]
        if not piece.startswith(got):
            return -1
        if len(got) < len(piece):
            return None
        at += len(piece)
    return at


class RepeatGuard:
    """Holds each call after a turn's first until it is complete, and ends the turn when one
    repeats an earlier call exactly (name and arguments): a small model may loop on the call it
    has just made until max_tokens, and an agent would run it again. The repeat is dropped; the
    first call streams as it is written, the others once whole."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []  # (name, arguments so far), by index
        self.held: dict[int, list[Part]] = {}
        self.closed = 0  # calls known complete
        self.repeated = False

    def admit(self, parts: list[Part], complete: int) -> list[Part]:
        """What to send of `parts`, now that `complete` calls have closed."""
        out: list[Part] = []
        for part in parts:
            if isinstance(part, TextPart):
                out.append(part)
                continue
            if isinstance(part, CallStart):
                self.calls.append((part.name, ""))
            else:
                name, arguments = self.calls[part.index]
                self.calls[part.index] = (name, arguments + part.json)
            if part.index == 0:
                out.append(part)
            else:
                self.held.setdefault(part.index, []).append(part)
        while self.closed < complete and not self.repeated:
            index = self.closed
            self.closed += 1
            if self.calls[index] in self.calls[:index]:
                self.repeated = True
                self.held.clear()
            else:
                out.extend(self.held.pop(index, []))
        return out

    def rest(self) -> list[Part]:
        """At the end (max_tokens): a call cut off before it closed, as far as it got, unless it
        was on its way to repeating an earlier one (then it is dropped, and `repeated` set)."""
        out: list[Part] = []
        for index in sorted(self.held):
            name, arguments = self.calls[index]
            if any(n == name and a.startswith(arguments) for n, a in self.calls[: self.closed]):
                self.repeated = True
                break
            out.extend(self.held[index])
        self.held.clear()
        return out


class CallParser:
    """Splits the model's output into text and calls as it streams. Calls can only begin the
    answer (the grammar allows text or calls, not both), so the first characters decide (or, in a
    format with a marker, whether the marker came first: `mark`); inside a call the arguments are
    passed on as they arrive, ending where their JSON value ends. It reads the text as decoding
    gives it, without the format's special tokens."""

    def __init__(self, fmt: CallFormat = HERMES, calls_only: bool = False) -> None:
        self.fmt = fmt
        self.calls_only = calls_only  # the grammar allows no text (tool choice required or named)
        see = fmt.visible
        self._first, self._next = see(fmt.open + fmt.head), see(fmt.separator + fmt.head)
        self._args_open, self._close, self._end = see(fmt.args_open), see(fmt.close), see(fmt.end)
        self.marked = False  # the format's marker token came
        self.mode = "start"  # start | text | args | tail | done
        self.buf = ""
        self.calls = 0  # calls begun
        self.complete = 0  # calls whose closing tag arrived
        self._depth = 0
        self._in_string = False
        self._escape = False

    def mark(self) -> None:
        """The model wrote the format's marker token (which decoding drops): calls follow it."""
        self.marked = True

    def push(self, text: str) -> list[Part]:
        out: list[Part] = []
        self.buf += text
        while self.buf:
            before = (self.mode, len(self.buf))
            self._step(out)
            if (self.mode, len(self.buf)) == before:
                break  # waiting for more text
        return out

    def _step(self, out: list[Part]) -> None:
        if self.mode == "text":
            out.append(TextPart(self.buf))
            self.buf = ""
        elif self.mode == "start" and self.calls and self._ending():
            if len(self.buf) < len(self._end):
                return
            self.buf = self.buf[len(self._end) :]  # the turn's calls are closed: nothing follows
            self.mode = "done"
        elif self.mode == "done":
            self.buf = ""
        elif self.mode == "start" and self.calls == 0 and self.fmt.marker and not self.marked:
            self.mode = "text"  # the answer began without the marker that calls begin with
        elif self.mode == "start":
            expect = self._first if self.calls == 0 else self._next
            if self.calls == 0 and expect.startswith(" ") and not self.buf.startswith(" "):
                expect = expect[1:]  # decoding dropped the space of the answer's first token
            lead = self.fmt.lead
            if self.calls == 0 and lead and self.buf.startswith(lead[: len(self.buf)]):
                expect = lead + expect  # what the model may write before its first call, written
            head = _head_end(self.buf, expect)
            if head is None:
                return
            if head < 0:
                self.mode = "text"
                return
            end = self._name_end(head)
            if end < 0:
                return
            opened = _head_end(self.buf[end:], self._args_open)  # (Kimi K2's holds the call's id)
            if opened is None:
                return
            if opened < 0:
                self.mode = "text"
                return
            name = self.buf[head:end]
            out.append(CallStart(self.calls, name))
            self.calls += 1
            self.buf = self.buf[end + opened :]
            self.mode, self._depth, self._in_string, self._escape = "args", 0, False, False
            self._begin_call(self.calls - 1, name, out)
        elif self.mode == "args":
            n = self._value_end(self.buf)
            piece = self.buf if n is None else self.buf[:n]
            if piece:
                out.append(CallArguments(self.calls - 1, piece))
            self.buf = "" if n is None else self.buf[n:]
            if n is not None:
                self.mode = "tail"
                self._tail()  # (a format that closes nothing after the arguments closes the call now)
        elif self.mode == "tail":
            self._tail()

    def _name_end(self, head: int) -> int:
        """Where the call's name ends, from `head` (where it begins): where what opens the
        arguments does, or (where that is all special tokens) where the arguments' object begins;
        -1 while it has not come."""
        return self.buf.find(self._args_open[:1] or "{", head)

    def _begin_call(self, index: int, name: str, out: list[Part]) -> None:
        """A call's name came and its arguments follow (as JSON here; a format that writes them
        otherwise reads them its own way)."""

    def _tail(self) -> None:
        close = self._close
        if len(self.buf) < len(close):
            return
        if self.buf.startswith(close):
            self.complete += 1
            self.buf = self.buf[len(close) :]
            self.mode = "start"
        else:
            self.mode = "text"

    def _ending(self) -> bool:
        """What is held after a call is (the start of) the text that ends the turn's calls."""
        end = self._end
        return bool(end) and end.startswith(self.buf[: len(end)])

    def _value_end(self, text: str) -> int | None:
        """Where the arguments' JSON value ends in `text`, tracking nesting across pushes."""
        for i, ch in enumerate(text):
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return None

    def flush(self) -> list[Part]:
        """The end of the output: whatever is held and was not a call is text (unless only calls
        were allowed: then it is the start of a call that max_tokens cut off, and is dropped)."""
        if self.calls_only and self.mode != "text":
            self.buf = ""
            return []
        if self.mode in ("start", "text") and self.buf and (self.mode == "text" or not self.calls):
            out: list[Part] = [TextPart(self.buf)]
            self.buf = ""
            return out
        return []


class ParamCallParser(CallParser):
    """QWEN_XML's calls (`CallFormat.params`): each call's parameters become its arguments' JSON
    object, every value read as its tool's schema types it (`param_json`). A string's text streams
    as it comes (a file's content an agent writes, say); any other value once its element closes."""

    def __init__(self, fmt: CallFormat, calls_only: bool = False, tools: Sequence[Tool] = ()) -> None:
        super().__init__(fmt, calls_only)
        self.properties = {t.name: t.schema.get("properties") or {} for t in tools}
        self._tool = ""  # the call in progress
        self._written = 0  # its parameters so far
        self._value_close = fmt.param_close  # what ends the string in progress (after CDATA's close, in one)
        self._value_opened = False  # whether the string's first text came (and so whether it is in CDATA)

    def _name_end(self, head: int) -> int:
        if self._args_open:
            return super()._name_end(head)
        # (GLM-4.7's: nothing between the name and its first parameter, or the call's close)
        found = [i for i in (self.buf.find(self.fmt.param_open, head), self.buf.find(self._close, head))
                 if i >= 0]  # fmt: skip
        return min(found, default=-1)

    def _begin_call(self, index: int, name: str, out: list[Part]) -> None:
        self._tool, self._written = name, 0
        out.append(CallArguments(index, "{"))  # its arguments' object opens

    def _step(self, out: list[Part]) -> None:
        if self.mode == "string":
            self._string(out)
        elif self.mode != "args":
            super()._step(out)
        elif self.buf.startswith(self.fmt.param_open):
            fmt = self.fmt
            ends = [(at, end) for end in {fmt.param_head_end, fmt.param_string_head_end} - {""}
                    if (at := self.buf.find(end, len(fmt.param_open))) >= 0]  # fmt: skip
            if not ends:
                return  # the parameter's name is not whole yet
            head_end, end = min(ends)
            key = self.buf[len(fmt.param_open) : head_end]
            start = head_end + len(end)  # where its value begins
            schema = self.properties.get(self._tool, {}).get(key)
            schema = schema if isinstance(schema, Mapping) else None
            named = (", " if self._written else "") + json.dumps(key) + ": "
            # (a format that says which values are strings says it of this one)
            as_text = end == fmt.param_string_head_end if fmt.param_string_head_end else (
                schema is not None and _kinds(schema) == {"string"})  # fmt: skip
            if as_text:
                out.append(CallArguments(self.calls - 1, named + '"'))
                self.buf, self.mode = self.buf[start:], "string"
                self._value_close, self._value_opened = self.fmt.param_close, not self.fmt.cdata
                return
            close = self.fmt.param_close
            value_end = self.buf.find(close, start)
            if value_end < 0:
                return  # the element is not closed yet
            text = self.buf[start:value_end]
            opens, closes = CDATA_WRAP
            if self.fmt.cdata and text.startswith(opens) and text.endswith(closes):
                text = text[len(opens) : -len(closes)]
            value = param_json(text, schema)
            out.append(CallArguments(self.calls - 1, named + value))
            self._written += 1
            self.buf = self.buf[value_end + len(close) :]
        elif not self.fmt.param_open.startswith(self.buf):  # no more parameters: the call closes
            out.append(CallArguments(self.calls - 1, "}"))
            self.mode = "tail"
            self._tail()

    def _string(self, out: list[Part]) -> None:
        """A string parameter's text, escaped as JSON, up to its element's close (in a format that
        may write it inside CDATA_WRAP, without the wrap); what could be the start of the close is
        held until the next text says."""
        if not self._value_opened:
            opens, closes = CDATA_WRAP
            if opens.startswith(self.buf):
                return  # the text may yet open CDATA
            self._value_opened = True
            if self.buf.startswith(opens):
                self.buf, self._value_close = self.buf[len(opens) :], closes + self.fmt.param_close
        close = self._value_close
        end = self.buf.find(close)
        if end >= 0:
            text, self.buf = self.buf[:end], self.buf[end + len(close) :]
            out.append(CallArguments(self.calls - 1, json.dumps(text, ensure_ascii=False)[1:-1] + '"'))
            self.mode = "args"
            self._written += 1
            return
        held = next((n for n in range(min(len(self.buf), len(close) - 1), 0, -1)
                     if close.startswith(self.buf[-n:])), 0)  # fmt: skip
        text, self.buf = self.buf[: len(self.buf) - held], self.buf[len(self.buf) - held :]
        if text:
            out.append(CallArguments(self.calls - 1, json.dumps(text, ensure_ascii=False)[1:-1]))


class WholeArgumentsParser(CallParser):
    """A format whose arguments are not JSON: they are held until they end (`_arguments_end`),
    then given as JSON at once (`_arguments_json`; what cannot be read, an empty object)."""

    def _step(self, out: list[Part]) -> None:
        if self.mode != "args":
            super()._step(out)
            return
        end = self._arguments_end()
        if end is None:
            return  # the arguments are not closed yet
        text, self.buf = self.buf[:end], self.buf[end:]
        out.append(CallArguments(self.calls - 1, self._arguments_json(text) or "{}"))
        self.mode = "tail"
        self._tail()

    def _arguments_end(self) -> int | None:
        raise NotImplementedError

    def _arguments_json(self, text: str) -> str | None:
        raise NotImplementedError


class PythonCallParser(WholeArgumentsParser):
    """LFM2's calls (`CallFormat.python`): each call's Python arguments become its arguments' JSON
    object once its parentheses close (`python_arguments`; positional ones named by the tool's
    schema)."""

    def __init__(self, fmt: CallFormat, calls_only: bool = False, tools: Sequence[Tool] = ()) -> None:
        super().__init__(fmt, calls_only)
        self.properties = {t.name: list(t.schema.get("properties") or ()) for t in tools}
        self._tool = ""
        self._quote = ""  # the quote of the string the scan is in
        self._scanned = 0  # how far into the held arguments the scan has come

    def _begin_call(self, index: int, name: str, out: list[Part]) -> None:
        self._tool, self._quote, self._scanned = name, "", 0

    def _arguments_json(self, text: str) -> str | None:
        return python_arguments(text, self.properties.get(self._tool, ()))

    def _arguments_end(self) -> int | None:
        """Where the held arguments end (their closing parenthesis), tracking nesting and Python's
        strings across pushes."""
        for i in range(self._scanned, len(self.buf)):
            ch = self.buf[i]
            if self._escape:
                self._escape = False
            elif self._quote:
                if ch == "\\":
                    self._escape = True
                elif ch == self._quote:
                    self._quote = ""
            elif ch in "\"'":
                self._quote = ch
            elif ch in "([{":
                self._depth += 1
            elif ch in ")]}":
                if self._depth == 0:
                    return i
                self._depth -= 1
        self._scanned = len(self.buf)
        return None


class GemmaCallParser(WholeArgumentsParser):
    """Gemma 4's calls (`CallFormat.gemma`): each call's arguments become JSON once their object
    closes (`gemma_json`). The text it reads keeps the format's special tokens, a string's
    delimiters among them."""

    def _arguments_json(self, text: str) -> str | None:
        return gemma_json(text)

    def _arguments_end(self) -> int | None:
        """Where the held arguments' object ends (its closing brace), outside strings."""
        depth, i = 0, 0
        while i < len(self.buf):
            if self.buf.startswith(GEMMA_QUOTE, i):
                close = self.buf.find(GEMMA_QUOTE, i + len(GEMMA_QUOTE))
                if close < 0:
                    return None
                i = close + len(GEMMA_QUOTE)
                continue
            if self.buf[i] in "{[":
                depth += 1
            elif self.buf[i] in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None


def call_parser(fmt: CallFormat, calls_only: bool = False, tools: Sequence[Tool] = ()) -> CallParser:
    """The parser of `fmt`'s calls (`tools`: the request's, whose schemas type a parameter's text)."""
    if fmt.gemma:
        return GemmaCallParser(fmt, calls_only)
    if fmt.params:
        return ParamCallParser(fmt, calls_only, tools)
    return PythonCallParser(fmt, calls_only, tools) if fmt.python else CallParser(fmt, calls_only)
