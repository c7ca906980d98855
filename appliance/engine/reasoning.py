"""A reasoning model's thought, told apart from its answer.

Three ways of writing a thought, each found from the model's vocabulary and chat template:

- Tags: Qwen3, QwQ, DeepSeek-R1's distills, SmolLM3 and Phi-4-reasoning think between `<think>` and
  `</think>`, each one token of their vocabulary, before they answer (Magistral between `[THINK]`
  and `[/THINK]`; Gemma 4 in a channel named after its open tag, `<|channel>thought\n` ...
  `<channel|>`, the name no part of the thought; TAG_PAIRS).
- Channels: gpt-oss writes messages in OpenAI's harmony format, each with a header:
  `<|channel|>analysis<|message|>` the thought `<|end|><|start|>assistant<|channel|>final<|message|>`
  the answer. Those markers are special tokens, which decoding drops: unsplit, the answer read
  "analysisWe need to...assistantfinalThe answer".
- Text: ServiceNow's Apriel thinkers write their thought as text from the start of their turn, up
  to a marker, `[BEGIN FINAL RESPONSE]`, after which the answer comes (TEXT_MARKERS). The marker is
  found in the thought's text, which holds back what could still become it; the split is told.

Tags and channels split on tokens, not on text: a marker never straddles two deltas, and the
answer's stop sequences and tool calls are matched in the answer alone. Sans-IO: the generation
feeds tokens, a split says what each is ("tag" tokens are markers and headers: not shown).

Under an answer grammar (tools, a JSON schema) the model still thinks first, as vLLM's reasoning
parsers let it: the grammar holds the answer only, and a split's `gate()` says what it holds the
next token to. A thought runs free; a header is held to the markers that open a thought or the
answer; the answer's tokens are the grammar's. gpt-oss calls a tool in a message of its own, on
the commentary channel (`<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>`
and the arguments): where calls are allowed its header may open that channel, and from there the
call's grammar holds the rest (`calling`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from appliance.engine.tokenizer import TextTokenizer

# The tags that thinking models write their thought between, each one token of their vocabulary:
# most (Qwen3, QwQ, DeepSeek-R1's distills, SmolLM3, Phi-4-reasoning, GLM-4.5, ERNIE 4.5), then
# Mistral's Magistral, ByteDance's Seed-OSS and Moonshot's Kimi, Google's Gemma 4, Apertus (its
# deliberation), Command R7B (its plan before calls) and Tencent's Hy3.
TAG_PAIRS = (("<think>", "</think>"), ("[THINK]", "[/THINK]"), ("<seed:think>", "</seed:think>"),
             ("◁think▷", "◁/think▷"), ("<|channel>", "<channel|>"), ("<|inner_prefix|>", "<|inner_suffix|>"),
             ("<|START_THINKING|>", "<|END_THINKING|>"), ("<think:opensource>", "</think:opensource>"))  # fmt: skip
# Markers a model writes as text after its thought, before its answer (Apriel 1.5's and 1.6's), and
# after its answer where its template asks for one (Apriel 1.5's).
TEXT_MARKERS = (("[BEGIN FINAL RESPONSE]", "[END FINAL RESPONSE]"),)
# What a model writes after its open tag before the thought itself (Gemma 4 names its channel).
TAG_LABELS = {"<|channel>": "thought\n"}
Kind = Literal["tag", "thought", "answer"]
Calls = Literal["none", "auto", "required"]  # what a request allows of calls: none, calls or text, calls only
# A harmony header is a role and a channel name: a model that writes this many tokens and no
# `<|message|>` is not writing one, and what follows is answer.
MAX_HEADER_TOKENS = 16
# What a model writes between its close tag and its answer (one token each where the vocabulary has it).
BLANKS = ("\n", "\n\n", "\n\n\n", " ", "  ")
MAX_BLANK_TOKENS = 2  # under a grammar, those past it are the grammar's to allow (a model may loop on them)


@dataclass(frozen=True)
class Gate:
    """What an answer grammar holds the next token to."""

    grammar: bool  # the grammar's mask applies: the token is the answer's, unless it is one of `also`
    also: frozenset[int] = frozenset()  # tokens allowed besides the grammar's (markers, blank lines), never fed to it
    free: bool = False  # a thought's token: anything but the end of the turn (the answer must follow)


ANSWER = Gate(grammar=True)
THOUGHT = Gate(grammar=False, free=True)


class ThoughtSplit(Protocol):
    @property
    def thinking(self) -> bool:
        """The tokens now are a thought's."""
        ...

    @property
    def tokens(self) -> int:
        """Tokens generated that were not answer: the thought, its tags and headers."""
        ...

    @property
    def answered(self) -> bool:
        """A thought ended before the answer: the answer's leading blank lines are the tags'."""
        ...

    @property
    def calling(self) -> bool:
        """The answer now is a call in a message of its own (harmony's): the calls' grammar holds it."""
        ...

    def forced(self) -> int | None:
        """The token that must come next, whatever the model prefers (the thought's budget is spent)."""
        ...

    def take(self, token: int) -> Kind:
        """What a generated token is, the state moved past it."""
        ...

    def gate(self) -> Gate:
        """Under an answer grammar, what it holds the next token to."""
        ...


class ThoughtFormat(Protocol):
    def split(self, prompt_ids: Sequence[int], budget: int | None, calls: Calls = "none") -> ThoughtSplit:
        """Where a generation starts, from its prompt's end; `budget`: thought tokens (its markers
        included) after which the thought is closed, so the answer always gets its turn; `calls`:
        whether a header may open a call (formats that call in a message of their own)."""
        ...


def thought_format(tokenizer: TextTokenizer, template: str, opening: str = "") -> ThoughtFormat | None:
    """The model's way of writing a thought, or None where it writes none (its markers must be
    tokens of its vocabulary and written by its chat template: some bases hold them unused;
    `opening`: the template's generation prompt, after which a text marker's thought begins)."""
    return ThinkTags.of(tokenizer, template) or Harmony.of(tokenizer, template) or TextMarker.of(
        tokenizer, template, opening)


class NoThought:
    """A generation that is all answer."""

    thinking, tokens, answered, calling = False, 0, False, False

    def forced(self) -> int | None:
        return None

    def take(self, token: int) -> Kind:
        return "answer"

    def gate(self) -> Gate:
        return ANSWER


@dataclass(frozen=True)
class ThinkTags:
    open_id: int
    close_id: int
    blank_ids: frozenset[int] = field(default=frozenset(), compare=False)  # the BLANKS that are one token
    label_ids: tuple[int, ...] = ()  # the tokens of TAG_LABELS' label after the open tag: the tag's, not thought

    @staticmethod
    def of(tokenizer: TextTokenizer, template: str) -> ThinkTags | None:
        for open_tag, close_tag in TAG_PAIRS:
            open_id, close_id = tokenizer.token_id(open_tag), tokenizer.token_id(close_tag)
            if open_id is not None and close_id is not None and open_tag in template:
                label = tuple(tokenizer.encode(TAG_LABELS[open_tag])[0]) if open_tag in TAG_LABELS else ()
                return ThinkTags(open_id, close_id, _blank_ids(tokenizer), label)
        return None

    def inside(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt ends inside a thought: its last tag opens one (DeepSeek-R1's distills and
        Qwen3's thinking-only models open it in the generation prompt; a client may prefill one)."""
        for token in reversed(prompt_ids):
            if token == self.open_id:
                return True
            if token == self.close_id:
                return False
        return False

    def closed(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt ends in a closed thought, blank lines at most after it (Qwen3's and
        SmolLM3's templates write an empty one when thinking is off): this turn opens no other."""
        for token in reversed(prompt_ids):
            if token not in self.blank_ids:
                return token == self.close_id
        return False

    def split(self, prompt_ids: Sequence[int], budget: int | None, calls: Calls = "none") -> TagSplit:
        split = TagSplit(self, self.inside(prompt_ids), budget)
        split.started = split.started or self.closed(prompt_ids)
        if prompt_ids and prompt_ids[-1] == self.open_id:  # the label comes next
            split.labelled = 0
        return split


def _blank_ids(tokenizer: TextTokenizer) -> frozenset[int]:
    """The BLANKS that are one token of the vocabulary."""
    encoded = (tokenizer.encode(text)[0] for text in BLANKS)
    return frozenset(ids[0] for ids in encoded if len(ids) == 1)


class _AnswerAfterThought:
    """What follows a thought: the blank lines after its end are its own (MAX_BLANK_TOKENS at most,
    past which a model may be looping on them), then the answer, the grammar's."""

    blank_ids: frozenset[int]
    answered = False  # a thought ended before the answer
    begun = False  # the answer after it has begun (past the blank lines)
    blanks = 0  # blank tokens after the thought's end

    def _answer(self, token: int) -> Kind:
        self.blanks += self.answered and token in self.blank_ids
        self.begun = self.begun or token not in self.blank_ids or self.blanks >= MAX_BLANK_TOKENS
        return "answer"

    def _answer_gate(self) -> Gate:
        return Gate(grammar=True, also=self.blank_ids) if self.answered and not self.begun else ANSWER


class TagSplit(_AnswerAfterThought):
    """A generation of a model that thinks between tags: only its first token may open a thought,
    or the first after blank lines (GLM-4.5's templates write its turns "<|assistant|>\n<think>"),
    which are then the tag's (MAX_BLANK_TOKENS at most)."""

    calling = False  # its calls are answer text

    def __init__(self, tags: ThinkTags, inside: bool = False, budget: int | None = None) -> None:
        self.tags = tags
        self.blank_ids = tags.blank_ids
        self.thinking = inside
        self.budget = budget
        self.tokens = 0
        self.started = inside  # a token was generated, or the prompt opened the thought
        self.leading = 0  # blank tokens before anything else (before an open tag: the tag's)
        self.labelled = len(tags.label_ids)  # the label's tokens read since the open tag (all: none to come)

    def forced(self) -> int | None:
        if self.thinking and self.budget is not None and self.tokens >= self.budget - 1:
            return self.tags.close_id
        return None

    def take(self, token: int) -> Kind:
        if not self.thinking:
            if not self.started and token in self.tags.blank_ids and self.leading < MAX_BLANK_TOKENS:
                self.leading += 1
                return "tag"
            # A thought comes first: an open tag later (or a second one) is the answer's own text.
            opens = token == self.tags.open_id and not self.started
            self.started = True
            if not opens:
                return self._answer(token)
            self.thinking = True
            self.labelled = 0
            self.tokens += 1
            return "tag"
        self.tokens += 1
        label = self.tags.label_ids
        if self.labelled < len(label):  # the channel's name, as far as the model writes it
            if token == label[self.labelled]:
                self.labelled += 1
                return "tag"
            self.labelled = len(label)
        if token == self.tags.close_id:
            self.thinking = False
            self.answered = True
            return "tag"
        return "thought"

    def gate(self) -> Gate:
        if self.thinking:
            return THOUGHT
        if not self.started:  # the grammar's first token, or the tag that opens a thought (or a blank before it)
            blanks = self.tags.blank_ids if self.leading < MAX_BLANK_TOKENS else frozenset()
            return Gate(grammar=True, also=frozenset({self.tags.open_id}) | blanks)
        return self._answer_gate()


@dataclass(frozen=True)
class TextMarker:
    """A thought written as text from the start of the turn, up to a marker (TEXT_MARKERS)."""

    marker: str
    answer_end: str  # what ends the answer, where the template asks for it ("" where not): not the answer's
    opening_ids: tuple[int, ...]  # the generation prompt from its first special token: a prompt ending so thinks
    close_ids: tuple[int, ...]  # the marker on a line of its own, as the model writes it: forced by the budget
    blank_ids: frozenset[int] = field(default=frozenset(), compare=False)

    @staticmethod
    def of(tokenizer: TextTokenizer, template: str, opening: str) -> TextMarker | None:
        marker, end = next(((m, e) for m, e in TEXT_MARKERS if m in template), ("", ""))
        if not marker or not opening.strip():
            return None
        # (From its first special token on, the generation prompt encodes alike alone and at the
        # end of a prompt: what comes before one may merge with the text before it.)
        ids = tokenizer.encode(opening, add_special_tokens=False)[0]
        first = next((i for i, t in enumerate(ids) if not tokenizer.decode([t])), 0)  # (decoding drops specials)
        close = tokenizer.encode("\n" + marker, add_special_tokens=False)[0]
        return TextMarker(marker, end if end in template else "", tuple(ids[first:]), tuple(close),
                          _blank_ids(tokenizer))

    def split(self, prompt_ids: Sequence[int], budget: int | None, calls: Calls = "none") -> MarkerSplit:
        """The thought opens where the prompt ends in the generation prompt (not after a prefill)."""
        n = len(self.opening_ids)
        return MarkerSplit(self, tuple(prompt_ids[-n:]) == self.opening_ids, budget)


class MarkerSplit(_AnswerAfterThought):
    """A generation whose tokens are its thought until the generation finds the marker in the
    thought's text (`end`), then its answer's, after the blank lines the marker's."""

    calling = False

    def __init__(self, fmt: TextMarker, inside: bool, budget: int | None = None) -> None:
        self.fmt = fmt
        self.blank_ids = fmt.blank_ids
        self.thinking = inside
        self.budget = budget
        self.tokens = 0
        self.closing = 0  # the marker's tokens forced so far

    def forced(self) -> int | None:
        ids = self.fmt.close_ids
        if not self.thinking or self.budget is None or self.closing >= len(ids):
            return None
        return ids[self.closing] if self.tokens >= self.budget - len(ids) + self.closing else None

    def take(self, token: int) -> Kind:
        if not self.thinking:
            return self._answer(token)
        if token == self.forced():
            self.closing += 1  # (the generation finds the marker in the text of the last)
        self.tokens += 1
        return "thought"

    def end(self) -> None:
        """The marker was written: the answer comes next."""
        self.thinking, self.answered = False, True

    def gate(self) -> Gate:
        return THOUGHT if self.thinking else self._answer_gate()


@dataclass(frozen=True)
class Harmony:
    """gpt-oss's markers, and the tokens of the names the split reads or writes."""

    start: int
    channel: int
    message: int
    end: int
    analysis: tuple[int, ...]  # the thought's channel name
    final_header: tuple[int, ...]  # <|start|>assistant<|channel|>final<|message|>: opens the answer
    commentary: tuple[int, ...] = ()  # the channel name calls are written on

    @staticmethod
    def of(tokenizer: TextTokenizer, template: str) -> Harmony | None:
        ids = [tokenizer.token_id(t) for t in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")]
        if None in ids or "<|channel|>" not in template:
            return None
        start, channel, message, end = (int(i) for i in ids if i is not None)

        def words(text: str) -> tuple[int, ...]:
            return tuple(tokenizer.encode(text, add_special_tokens=False)[0])

        header = (start, *words("assistant"), channel, *words("final"), message)
        return Harmony(start, channel, message, end, words("analysis"), header, words("commentary"))

    @property
    def analysis_header(self) -> tuple[int, ...]:
        """<|start|>assistant<|channel|>analysis<|message|>: opens the thought."""
        named = self.final_header.index(self.channel) + 1
        return (*self.final_header[:named], *self.analysis, self.message)

    @property
    def call_header(self) -> tuple[int, ...]:
        """<|start|>assistant<|channel|>commentary: opens a call (the recipient and the rest are the
        calls' grammar's: tools.call_format's harmony format)."""
        named = self.final_header.index(self.channel) + 1
        return (*self.final_header[:named], *self.commentary)

    def split(self, prompt_ids: Sequence[int], budget: int | None, calls: Calls = "none") -> ChannelSplit:
        """The prompt ends in a header (the generation prompt, `<|start|>assistant`), or inside a
        message (a prefill): in the thought's channel or another."""
        split = ChannelSplit(self, budget, calls)
        markers = (self.start, self.channel, self.message, self.end)
        last = next((i for i in range(len(prompt_ids) - 1, -1, -1) if prompt_ids[i] in markers), None)
        if last is not None and prompt_ids[last] == self.message:
            opened = next((i for i in range(last - 1, -1, -1) if prompt_ids[i] in markers), None)
            named = () if opened is None or prompt_ids[opened] != self.channel else prompt_ids[opened + 1 : last]
            split.state = "thought" if tuple(named) == self.analysis else "answer"
            split.opened = split.state == "thought"
        elif last is not None and prompt_ids[last] == self.end:
            split.state, split.role = "header", False  # between messages: `<|start|>` comes next
        elif last is not None and prompt_ids[last] == self.start:
            split.read = list(prompt_ids[last:])
        return split


class ChannelSplit:
    """A generation in harmony's messages: the header's tokens are tags, the analysis channel's
    text is the thought, any other channel's the answer."""

    def __init__(self, harmony: Harmony, budget: int | None, calls: Calls = "none") -> None:
        self.harmony = harmony
        self.budget = budget
        self.calls = calls  # under a grammar: whether a header may open a call, or must
        self.calling = False  # the message now is a call (its header opened the commentary channel)
        self.state: Literal["header", "thought", "answer"] = "header"
        self.role = True  # in a header, the role's tokens may come before its channel
        self.name: list[int] | None = None  # the channel name read so far
        self.header = 0  # tokens of the header so far
        self.read: list[int] = []  # the header's tokens from its <|start|>, the prompt's included
        self.opened = False  # a thought was opened: under a grammar, the next header is the answer's
        self.tokens = 0
        self.answered = False
        self.queue: list[int] = []  # forced: the thought's end and the answer's header

    @property
    def thinking(self) -> bool:
        return self.state == "thought"

    def forced(self) -> int | None:
        if not self.queue and self.thinking and self.budget is not None and self.tokens >= self.budget - 1:
            h = self.harmony
            self.queue = [h.end, *(h.call_header if self.calls == "required" else h.final_header)]
        return self.queue[0] if self.queue else None

    def take(self, token: int) -> Kind:
        h = self.harmony
        if self.queue and token == self.queue[0]:
            self.queue.pop(0)
        if self.state != "header":
            kind: Kind = "thought" if self.thinking else "answer"
            self.tokens += kind == "thought"
            if token in (h.end, h.start):  # the message ended: another follows (a header first)
                self.state, self.role, self.name, self.header = "header", token == h.start, None, 0
                self.calling = False
                self.read = [token] if token == h.start else []
                return "tag"
            return kind
        self.tokens += 1
        self.header += 1
        self.read = [token] if token == h.start else [*self.read, token]
        if self.calls != "none" and tuple(self.read) == h.call_header:  # a call: the rest is the calls' grammar's
            self.state, self.calling = "answer", True
            self.answered = self.tokens > self.header
        elif token == h.start:
            self.role, self.name = True, None
        elif token == h.channel:
            self.name = []
        elif token == h.message:
            self.state = "thought" if tuple(self.name or ()) == h.analysis else "answer"
            self.opened = self.opened or self.thinking
            self.answered = self.state == "answer" and self.tokens > self.header
        elif self.name is not None and self.header <= MAX_HEADER_TOKENS:
            self.name.append(token)
        elif not self.role or self.header > MAX_HEADER_TOKENS:
            self.tokens -= 1  # no header after all: answer text
            self.state = "answer"
            return "answer"
        return "tag"

    def gate(self) -> Gate:
        """A header is held to the analysis channel's (until a thought was written), the final
        one's (unless only calls are allowed) or, where calls are, a call's; what follows is the
        grammar's."""
        if self.state != "header":
            return THOUGHT if self.thinking else ANSWER
        h, read = self.harmony, tuple(self.read)
        heads = [h.final_header] if self.calls != "required" else []
        heads += [] if self.opened else [h.analysis_header]
        heads += [h.call_header] if self.calls != "none" else []
        nexts = frozenset(head[len(read)] for head in heads if len(head) > len(read) and head[: len(read)] == read)
        return Gate(grammar=False, also=nexts) if nexts else THOUGHT  # a header of its own: the model's
