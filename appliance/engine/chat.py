"""Rendering messages with the bundle's chat template, as Hugging Face renders it, into token ids
with the token index where each message starts (for semantic shard boundaries)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from appliance.engine.errors import InvalidRequest
from appliance.engine.request import Message
from appliance.engine.tokenizer import TextTokenizer


def _raise_exception(message: str) -> None:
    raise InvalidRequest(f"the chat template refused the messages: {message}", "messages")


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


# Message boundaries come from rendering each prefix of the conversation: only the last this many
# are found, so a long conversation costs a bounded number of renders (linear, not quadratic).
BOUNDARY_MESSAGES = 64


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    message_starts: list[int]  # token index where each message after the first begins
    text: str


class ChatTemplate:
    def __init__(self, source: str, tokenizer: TextTokenizer) -> None:
        # The same environment transformers uses for apply_chat_template.
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        self.template = env.from_string(source)
        self.tokenizer = tokenizer

    def render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool) -> str:
        try:
            return self.template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.tokenizer.bos_token or "",
                eos_token=self.tokenizer.eos_token or "",
            )
        except TemplateError as exc:
            raise InvalidRequest(f"the chat template failed on these messages: {exc}", "messages") from None

    def prompt(self, messages: Sequence[Message], system: str | None = None) -> Prompt:
        docs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": m.role, "content": m.content} for m in messages
        ]
        text = self.render(docs, add_generation_prompt=docs[-1]["role"] != "assistant")
        ids, offsets = self.tokenizer.encode(text)
        starts = []
        for k in range(max(1, len(docs) - BOUNDARY_MESSAGES), len(docs)):
            head = self.render(docs[:k], add_generation_prompt=False)
            if text.startswith(head):
                # First token starting at or after the boundary character.
                starts.append(next((i for i, off in enumerate(offsets) if off >= len(head)), len(ids)))
        return Prompt(ids=ids, message_starts=sorted(set(starts)), text=text)
