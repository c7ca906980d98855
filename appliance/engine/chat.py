"""Rendering messages with the bundle's chat template, as Hugging Face renders it, into token ids
with the token index where each message starts (for semantic shard boundaries)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from appliance.engine.errors import InvalidRequest
from appliance.engine.request import Message
from appliance.engine.tokenizer import TextTokenizer
from appliance.engine.tools import (
    HERMES,
    CallFormat,
    OutputRules,
    PastCall,
    call_format,
    format_calls,
    format_results,
    schema_block,
    system_block,
)

if TYPE_CHECKING:
    from appliance.engine.constraint import Constraint
    from appliance.engine.reasoning import ThoughtFormat


def _raise_exception(message: str) -> None:
    raise InvalidRequest(f"the chat template refused the messages: {message}", "messages")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _GenerationBlock(Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (it marks the assistant's tokens
    for training masks): its body, rendered as it is. Without it a template that uses it does not
    even compile."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 reads it as the class attribute it declares)

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


TOOL_PROBE = "zerolayer_probe_tool"  # a tool name no conversation has: found in the output, the tools were shown
CALL_PROBE = "zerolayer_probe_call"  # likewise, an earlier call's name
# Where templates read an assistant message's thought: Qwen3's (and vLLM's) key, and gpt-oss's.
THOUGHT_KEYS = ("reasoning_content", "thinking")
# Message boundaries come from rendering each prefix of the conversation: only the last this many
# are found, so a long conversation costs a bounded number of renders (linear, not quadratic).
BOUNDARY_MESSAGES = 64


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    message_starts: list[int]  # token index where each message after the first begins
    text: str
    constraint: Constraint | None = None  # the request's output grammar, compiled (engine.prepare)
    call_constraint: Constraint | None = None  # a call's, where calls are messages of their own (harmony)
    thought_format: ThoughtFormat | None = None  # how the answer's thought is split off (engine.prepare)
    call_format: CallFormat = HERMES  # how the model writes a call
    # Where the messages end and the generation prompt begins (None: the prompt continues a final
    # message). A next turn's prompt begins with what is before it, whatever the template makes
    # of this turn's answer (Qwen3.5's writes it without the thought its generation prompt opens).
    history_end: int | None = None


class ChatTemplate:
    def __init__(self, source: str, tokenizer: TextTokenizer) -> None:
        # The same environment transformers uses for apply_chat_template.
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[_GenerationBlock, loopcontrols])  # fmt: skip
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self.template = env.from_string(source)
        except TemplateError as exc:  # a ValueError: the daemon refuses the bundle in one line, on start or reload
            raise ValueError(f"the bundle's chat template does not compile: {exc} (line {getattr(exc, 'lineno', '?')})"
                             ) from None  # fmt: skip
        self.tokenizer = tokenizer
        # Image-and-text models' templates (SmolVLM's, LLaVA's) read each message's content as a
        # list of typed parts and write nothing of a string: theirs goes to them as one text part.
        self.takes_parts = False
        if not self._shows_probe([{"role": "user", "content": TOOL_PROBE}]):
            self.takes_parts = True  # (render converts while it is set: the probe again, as parts)
            self.takes_parts = self._shows_probe([{"role": "user", "content": TOOL_PROBE}])
        # Hugging Face templates that know tools read a `tools` variable; others get our system block,
        # which asks for the Hermes format. That a template names `tools` is not enough: Phi-4-mini's
        # reads them from a field of its system message and ignores the variable, so its model
        # would never see them. A probe tool's name in the output decides.
        probe = {"type": "function", "function": {"name": TOOL_PROBE, "description": "A probe.",
                                                  "parameters": {"type": "object", "properties": {}}}}  # fmt: skip
        self.takes_tools = self._shows_probe([{"role": "user", "content": "Hi."}], tools=[probe])
        self.spelled = spelled_out(source)
        # What the template writes to open the model's turn (after which a thought in text begins).
        asked, said = (self._rendered_or_empty([{"role": "user", "content": "Hi."}], prompt)
                       for prompt in (True, False))  # fmt: skip
        self.generation_prompt = asked[len(said) :] if said and asked.startswith(said) else ""
        # The reasoning efforts the template takes (Hy3's refuses medium, which OpenAI's clients send);
        # one that never reads them takes any.
        self.efforts = EFFORTS if "reasoning_effort" not in source else tuple(
            e for e in EFFORTS if self._rendered_or_empty([{"role": "user", "content": "Hi."}], reasoning_effort=e))
        own = call_format(self.spelled, tokenizer.token_id, tokenizer.is_special)
        # Earlier calls go to the template as `tool_calls`, as transformers passes them, where it
        # renders them (gpt-oss's are messages of their own); else as text in the call format.
        # Their ids, and their results', are ours (`_call_id`): Mistral's templates want 9 characters.
        probe_id = _call_id(0)
        called = {"role": "assistant", "content": "Calling.", "tool_calls": [_tool_call(CALL_PROBE, "{}", probe_id)]}
        calls = self._rendered_or_empty([{"role": "user", "content": "Hi."}, called])
        # A template that lists no tools but writes earlier calls as its model does, their arguments
        # as JSON (DeepSeek V3.1's, R1's distills'): the tools reach the model in our system block,
        # which then asks for that format.
        shown_calls = own.json_arguments and format_calls([PastCall(CALL_PROBE, "{}")], own) in calls
        self.call_format = own if self.takes_tools or shown_calls else HERMES
        self.takes_tool_calls = (self.takes_tools or shown_calls) and CALL_PROBE in calls
        # A turn of calls alone has no content: None, as OpenAI's clients send it and transformers
        # passes it on (R1's distills' template writes an empty answer after the calls for ""),
        # where the template takes None without writing it.
        self.calls_content: str | None = ""
        if self.takes_tool_calls:
            empty, bare = (self._rendered_or_empty([{"role": "user", "content": "Hi."}, {**called, "content": c}])
                           for c in ("", None))  # fmt: skip
            if empty and bare and bare.count("None") == empty.count("None"):
                self.calls_content = None
        # Tool results go in `tool` messages where the template renders them (Llama 3's ipython
        # turn), else in a user turn of Hermes' <tool_response> blocks.
        if not self.takes_tool_calls:
            called = {"role": "assistant", "content": "Calling."}
        self.takes_tool_role = (self.takes_tools or shown_calls) and self._shows_probe([
            {"role": "user", "content": "Hi."}, called,
            {"role": "tool", "content": TOOL_PROBE, "tool_call_id": probe_id}])  # fmt: skip
        # Gemma 4's template takes results as the `tool_responses` of the turn that made the calls,
        # which the model then goes on answering (a `tool` turn of their own is not what it was taught).
        self.takes_tool_responses = self.takes_tool_calls and self._shows_probe([
            {"role": "user", "content": "Hi."}, {**called, "tool_responses": [
                {"name": CALL_PROBE, "response": TOOL_PROBE}]}])  # fmt: skip

    def _shows_probe(self, turns: list[dict[str, Any]], probe: str = TOOL_PROBE, **extra: Any) -> bool:
        """Whether the template writes `probe` into the prompt it renders of `turns`; a template
        that refuses or fails on them does not (what they try goes our own way instead)."""
        return probe in self._rendered_or_empty(turns, **extra)

    def _rendered_or_empty(self, turns: list[dict[str, Any]], add_generation_prompt: bool = True,
                           **extra: Any) -> str:  # fmt: skip
        """The prompt the template renders of `turns`, or nothing where it refuses or fails on them."""
        try:
            return self.render(turns, add_generation_prompt, **extra)
        except Exception:
            return ""

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool, **extra: Any) -> str:
        try:
            return self.template.render(
                messages=[_as_parts(m) for m in messages] if self.takes_parts else list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.tokenizer.bos_token or "",
                eos_token=self.tokenizer.eos_token or "",
                **extra,
            )
        except TemplateError as exc:
            raise InvalidRequest(f"the chat template failed on these messages: {exc}", "messages") from None

    def prompt(self, messages: Sequence[Message], system: str | None = None, output: OutputRules | None = None,
               thinking: bool | None = None, effort: str | None = None,
               budget: int | None = None, variables: Mapping[str, Any] | None = None) -> Prompt:  # fmt: skip
        """The rendered, tokenized conversation. A final assistant message is continued, not
        answered (the answer carries on from its last character). The output rules' tools and
        schema are shown to the model: the grammar holds it to them, but it writes better
        arguments and values when it knows what they are for. `thinking`, where given, is the
        template's `enable_thinking`, `effort` its `reasoning_effort` and `budget` (thought tokens)
        its `thinking_budget`, which Seed-OSS's reads instead of a switch: 0 when thinking is off (a
        template that does not read them ignores them). `variables`: more of the template's own,
        as a client names them; those above override them."""
        extra: dict[str, Any] = dict(variables or {})
        if thinking is not None:
            extra["enable_thinking"] = thinking
        if effort is not None:
            extra["reasoning_effort"] = _nearest(effort, self.efforts)
        if thinking is False or budget is not None:
            extra["thinking_budget"] = 0 if thinking is False else budget
        blocks = [system] if system else []
        tools = output.tools if output is not None else ()
        if tools and self.takes_tools:
            extra["tools"] = [t.as_function() for t in tools]
        elif tools:
            blocks.append(system_block(tools, self.call_format))
        if output is not None and output.json_schema is not None:
            blocks.append(schema_block(output.json_schema))
        system = "\n\n".join(blocks) or None
        opening: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        # Earlier calls as `tool_calls` and thoughts, as the template takes them; where it refuses
        # them (Llama 3.1's more than one call a turn, gpt-oss's a thought beside both text and a
        # call), without the thoughts, then with the calls as text in the model's call format.
        for native, thoughts in ((True, True), (True, False), (False, False)):
            docs = opening + self._conversation_docs(messages, native, thoughts)
            if docs[-1]["role"] == "assistant" and "tool_calls" not in docs[-1] and not docs[-1]["content"].strip():
                docs = docs[:-1]  # an empty final assistant message continues nothing: answer as usual
            try:
                docs, text = self._rendered(docs, extra)
                break
            except InvalidRequest:
                if native is False or not any(m.calls or m.thought for m in messages):
                    raise
        ids, offsets = self.tokenizer.encode(text)

        def start(k: int) -> int | None:
            """Where message k begins: the first token after the first k messages, rendered alone,
            where the prompt begins with them. A template may refuse them alone, which is no
            client's mistake (Llama 3.1's, given tools, wants a user message after the system one;
            Qwen3.5's a user query): that boundary is not known."""
            try:
                head = self.render(docs[:k], add_generation_prompt=False, **extra)
            except InvalidRequest:
                return None
            if not text.startswith(head):
                return None
            return next((i for i, off in enumerate(offsets) if off >= len(head)), len(ids))

        # The last messages' boundaries, and where the messages end unless the prompt continues the
        # final one (that boundary is also a message's).
        answered = docs[-1]["role"] != "assistant" or "tool_calls" in docs[-1]
        last = len(docs) + answered
        starts = {k: start(k) for k in range(max(1, last - BOUNDARY_MESSAGES), last)}
        return Prompt(ids=ids, message_starts=sorted({s for s in starts.values() if s is not None}), text=text,
                      call_format=self.call_format, history_end=starts.get(len(docs)))  # fmt: skip

    def _rendered(self, docs: list[dict[str, Any]], extra: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        """The messages the template took, and its rendered conversation. A template that wants
        user and assistant turns to alternate (Gemma's, Mistral's) refuses what the OpenAI API
        takes and clients send: two turns of one role in a row (tool results, then a question) get
        there as one turn, as the Messages API combines them; then a system message after the
        conversation began is folded into the next user turn, as those templates fold the first; and
        where a template has no system role at all (Gemma 2's refuses one), the first too."""
        refused: InvalidRequest | None = None
        tried: list[list[dict[str, Any]]] = []
        for candidate in (docs, _one_turn_per_role(docs), _one_turn_per_role(_systems_folded(docs, first=False)),
                          _one_turn_per_role(_systems_folded(docs, first=True))):  # fmt: skip
            if candidate in tried:
                continue
            tried.append(candidate)
            try:
                text = self._conversation(candidate, extra)
            except InvalidRequest as exc:
                refused = refused or exc
                continue
            if all(d["content"] in text for d in _late_systems(candidate)):  # a template may drop them unsaid
                return candidate, text
            refused = refused or InvalidRequest("the chat template leaves out system messages after the first",
                                                "messages")  # fmt: skip
        assert refused is not None
        raise refused

    def _conversation(self, docs: list[dict[str, Any]], extra: dict[str, Any]) -> str:
        """The rendered conversation, ending in the generation prompt, or in a final assistant
        message that is continued."""
        if docs[-1]["role"] == "assistant" and "tool_calls" not in docs[-1]:  # (a turn of calls is whole)
            return _through_final(self.render(docs, add_generation_prompt=False, **extra), docs[-1]["content"])
        return self.render(docs, add_generation_prompt=True, **extra)

    def _conversation_docs(self, messages: Sequence[Message], native: bool, thoughts: bool) -> list[dict[str, Any]]:
        """The messages as the template takes them; each call gets an id, and the results after
        it answer the turn's calls in order."""
        docs: list[dict[str, Any]] = []
        made, ids = 0, []  # calls so far, and the ids of the last turn's
        for n, message in enumerate(messages):
            if message.calls:
                ids = [_call_id(made + i) for i in range(len(message.calls))]
                made += len(message.calls)
            if message.results and native and self.takes_tool_responses and docs and "tool_calls" in docs[-1]:
                # Results as the `tool_responses` of the turn that made the calls (Gemma 4's)...
                names = [call["function"]["name"] for call in docs[-1]["tool_calls"]]
                docs[-1] = {**docs[-1], "tool_responses": [
                    {"name": names[i] if i < len(names) else names[-1], "response": _response(result, error)}
                    for i, (result, error) in enumerate(message.results)]}  # fmt: skip
                docs += [{"role": message.role, "content": message.content}] if message.content else []
                continue
            if (message.role == "assistant" and not message.calls and n + 1 < len(messages) and docs
                    and "tool_responses" in docs[-1]):  # fmt: skip
                # ...and the answer the model went on to give, in that turn too (a final one is continued).
                docs[-1] = {**docs[-1], "content": "\n".join(t for t in (docs[-1]["content"], message.content) if t)}
                continue
            docs += self._docs(message, native, thoughts, ids)
        return docs

    def _docs(self, message: Message, native: bool, thoughts: bool, ids: list[str]) -> list[dict[str, Any]]:
        """A message as the template takes it: an assistant's calls as its `tool_calls` (`native`,
        where the template renders them), or after its text in the model's own call format; a
        user's tool results before its text, as `tool` messages (answering the calls of `ids`) or
        blocks; an assistant's thought under the keys templates read it from (`thoughts`)."""
        text = message.content
        thought = dict.fromkeys(THOUGHT_KEYS, message.thought) if message.thought and thoughts else {}
        if message.calls and native and self.takes_tool_calls:
            return [{"role": message.role, "content": text or self.calls_content, **thought,
                     "tool_calls": [_tool_call(c.name, c.arguments, id_) for c, id_ in zip(message.calls, ids,
                                                                                          strict=True)]}]  # fmt: skip
        if message.calls:
            calls = format_calls(message.calls, self.call_format)
            text = f"{text}\n{calls}" if text else calls
        if not message.results:
            return [{"role": message.role, "content": text, **thought}]
        if not self.takes_tool_role:
            blocks = format_results(message.results)
            return [{"role": message.role, "content": f"{blocks}\n{text}" if text else blocks}]
        results = [{"role": "tool", "content": f"Error: {r}" if error else r,
                    "tool_call_id": ids[i] if i < len(ids) else f"result{i:03d}"}
                   for i, (r, error) in enumerate(message.results)]  # fmt: skip
        return results + ([{"role": message.role, "content": text}] if text else [])


# `{% set NAME = 'text' %}`, and a string built of it: `'<tool_call{}>'.format(NAME)`.
_SET_STRING = re.compile(r"""\{%-?\s*set\s+(\w+)\s*=\s*(['"])([^'"\\{}]*)\2\s*-?%\}""")
_FORMATTED = re.compile(r"""(['"])([^'"\\]*)\1\.format\((\w+)\)""")


EFFORTS = ("low", "medium", "high")


def _nearest(effort: str, taken: Sequence[str]) -> str:
    """`effort`, or the nearest of the efforts a template takes (the higher of two as near; as it is
    where the template takes none of them, or it is none of them)."""
    if not taken or effort in taken or effort not in EFFORTS:
        return effort
    at = EFFORTS.index(effort)
    return min(taken, key=lambda e: (abs(EFFORTS.index(e) - at), -EFFORTS.index(e)))


def tool_use_template(source: str | None, tokenizer: TextTokenizer) -> ChatTemplate | None:
    """The model's template for conversations with tools (a folder's "tool_use" one), where it lists
    the tools and asks for calls in a format known here: Hermes 2 Pro's and 3's. Not Command R's,
    whose template asks for a plan of actions, a `directly-answer` one among them, a flow of its
    own: its chat template and our system block serve those conversations."""
    if source is None:
        return None
    template = ChatTemplate(source, tokenizer)
    known = template.call_format is not HERMES or HERMES.opening in template.spelled
    return template if template.takes_tools and known else None


def spelled_out(source: str) -> str:
    """A template's source with each string it builds by `.format` of a name set to a string
    written out as that string, where the call format and the thought's tags are looked for:
    Hy3's template builds every tag of its own so, '<tool_call{}>'.format(HYTK)."""
    names = {name: text for name, _, text in _SET_STRING.findall(source)}

    def spelled(match: re.Match[str]) -> str:
        quote, text, name = match.groups()
        return quote + text.replace("{}", names[name], 1) + quote if name in names else match.group(0)

    return _FORMATTED.sub(spelled, source)


def _as_parts(message: dict[str, Any]) -> dict[str, Any]:
    """`message` with its text content as a list of one text part (none where it is empty)."""
    content = message.get("content")
    if not isinstance(content, str):
        return message
    return {**message, "content": [{"type": "text", "text": content}] if content else []}


def _one_turn_per_role(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive user (or assistant) messages as one, their texts a blank line apart; a turn of
    calls stays whole."""
    out: list[dict[str, Any]] = []
    for doc in docs:
        last = out[-1] if out else None
        if (last is not None and doc["role"] == last["role"] in ("user", "assistant")
                and "tool_calls" not in doc and "tool_calls" not in last):  # fmt: skip
            out[-1] = {**last, "content": "\n\n".join(t for t in (last["content"], doc["content"]) if t)}
        else:
            out.append(doc)
    return out


def _late_systems(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The system messages after the conversation began."""
    first = next((i for i, d in enumerate(docs) if d["role"] != "system"), len(docs))
    return [d for d in docs[first:] if d["role"] == "system"]


def _systems_folded(docs: list[dict[str, Any]], first: bool) -> list[dict[str, Any]]:
    """System messages after the conversation began (`first`: all of them), put at the head of
    the next user turn (or of one of their own at the end)."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for doc in docs:
        if doc["role"] == "system" and (first or any(d["role"] != "system" for d in out)):
            pending.append(doc["content"])
            continue
        if pending and doc["role"] == "user":
            doc, pending = {**doc, "content": "\n\n".join([*pending, doc["content"]])}, []
        out.append(doc)
    return out + ([{"role": "user", "content": "\n\n".join(pending)}] if pending else [])


def _response(result: str, error: bool) -> Any:
    """A tool's result as a template's `tool_responses` take it: an object where it is JSON's, else its text."""
    if error:
        return f"Error: {result}"
    try:
        parsed = json.loads(result)
    except ValueError:
        return result
    return parsed if isinstance(parsed, dict) else result


def _tool_call(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    """A call as transformers passes it to a template: its arguments an object (templates write
    them with `tojson`), unless they are not JSON."""
    try:
        parsed: Any = json.loads(arguments)
    except ValueError:
        parsed = arguments
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": parsed}}


def _call_id(n: int) -> str:
    """The id of a conversation's n-th call: nine letters and digits, as Mistral's templates
    require; the same from one turn to the next, so a conversation's prompt stays a prefix of the
    next one's."""
    return f"call{n:05d}"


def _through_final(text: str, final: str) -> str:
    """The rendered conversation cut right after the final message's text, so the model continues
    it (the end-of-turn the template writes after it is dropped), as transformers'
    continue_final_message does. A template that trims messages (Llama 3's) loses the final one's
    trailing whitespace, a prefill's "<think>\n" say: it is put back after the trimmed text."""
    end = text.rfind(final)
    if end >= 0:
        return text[: end + len(final)]
    trimmed = final.strip()
    end = text.rfind(trimmed)
    if end < 0:
        raise InvalidRequest("messages: the chat template does not render the final assistant message verbatim, "
                             "so it cannot be continued", "messages")  # fmt: skip
    return text[: end + len(trimmed)] + final[len(final.rstrip()) :]
