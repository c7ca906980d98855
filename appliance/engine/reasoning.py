"""A reasoning model's thought, told apart from its answer.

Qwen3, QwQ, DeepSeek-R1's distills, SmolLM3 and Phi-4-reasoning think aloud between `<think>` and
`</think>`, each one token of their vocabulary, before they answer. The split is made on those
tokens, not on text: a tag never straddles two deltas, and the answer's stop sequences and tool
calls are matched in the answer alone. Sans-IO: the generation feeds tokens, this says what each is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from appliance.engine.tokenizer import TextTokenizer

OPEN_TAG, CLOSE_TAG = "<think>", "</think>"
Kind = Literal["open", "close", "thought", "answer"]


@dataclass(frozen=True)
class ThinkTags:
    open_id: int
    close_id: int

    @staticmethod
    def of(tokenizer: TextTokenizer, template: str) -> ThinkTags | None:
        """The model's tags: both single tokens of its vocabulary, and written by its chat template
        (a vocabulary that merely holds them, as some bases do, belongs to no reasoning model)."""
        open_id, close_id = tokenizer.token_id(OPEN_TAG), tokenizer.token_id(CLOSE_TAG)
        if open_id is None or close_id is None or OPEN_TAG not in template:
            return None
        return ThinkTags(open_id, close_id)

    def inside(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt ends inside a thought: its last tag opens one (DeepSeek-R1's distills and
        Qwen3's thinking-only models open it in the generation prompt; a client may prefill one)."""
        for token in reversed(prompt_ids):
            if token == self.open_id:
                return True
            if token == self.close_id:
                return False
        return False


class ThoughtSplit:
    """Where one generation stands: thinking or answering. `budget`: thought tokens (the tags
    included) after which the close tag is the next token, so the answer always gets its turn."""

    def __init__(self, tags: ThinkTags | None, inside: bool = False, budget: int | None = None) -> None:
        self.tags = tags
        self.thinking = inside and tags is not None
        self.budget = budget
        self.tokens = 0  # thought tokens generated, the tags included
        self.answered = False  # a thought ended: the answer's leading blank lines are the tag's
        self.started = self.thinking  # a token was generated, or the prompt opened the thought

    def forced(self) -> int | None:
        """The token that must come next, whatever the model prefers: the close tag once the budget is spent."""
        if self.thinking and self.budget is not None and self.tokens >= self.budget - 1:
            assert self.tags is not None
            return self.tags.close_id
        return None

    def take(self, token: int) -> Kind:
        """What a generated token is, the state moved past it."""
        tags = self.tags
        if tags is None:
            return "answer"
        if not self.thinking:
            # A thought comes first: an open tag later (or a second one) is the answer's own text.
            opens = token == tags.open_id and not self.started
            self.started = True
            if not opens:
                return "answer"
            self.thinking = True
            self.tokens += 1
            return "open"
        self.tokens += 1
        if token == tags.close_id:
            self.thinking = False
            self.answered = True
            return "close"
        return "thought"
