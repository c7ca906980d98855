"""The bundle's tokenizer, and streaming detokenization that never splits a UTF-8 character."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from tokenizers import Tokenizer


class TextTokenizer:
    def __init__(self, tokenizer_json: Path, tokenizer_config: Path) -> None:
        self._tok = Tokenizer.from_file(str(tokenizer_json))
        cfg = json.loads(tokenizer_config.read_text()) if tokenizer_config.is_file() else {}
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))

    def encode(self, text: str, add_special_tokens: bool = False) -> tuple[list[int], list[int]]:
        """Token ids and each token's start offset (in characters). The chat template already
        carries the special tokens, so by default none are added (as apply_chat_template does)."""
        enc = self._tok.encode(text, add_special_tokens=add_special_tokens)
        return list(enc.ids), [start for start, _ in enc.offsets]

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))

    def token_id(self, token: str) -> int | None:
        tid = self._tok.token_to_id(token)
        return None if tid is None else int(tid)

    def is_special(self, token: str) -> bool:
        """Whether `token` is one that decoding drops (an added token marked special)."""
        tid = self._tok.token_to_id(token)
        added = self._tok.get_added_tokens_decoder().get(tid) if tid is not None else None
        return bool(added is not None and added.special)


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):  # the AddedToken form
        value = value.get("content")
    return value if isinstance(value, str) else None


class StreamDecoder:
    """Turns token ids into text deltas.

    Byte-level tokens can split a character; decoding a short window and holding back output that
    ends in U+FFFD (an incomplete sequence) means a delta never carries half a character.
    """

    def __init__(self, tokenizer: TextTokenizer, kept: Mapping[int, str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.kept = dict(kept or {})  # special tokens given as their text (decoding drops the others)
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def push(self, token_id: int) -> str:
        if token_id in self.kept:  # a special token: it never shares a character with its neighbours
            held = self.flush()
            self.ids.append(token_id)
            self.prefix_offset = self.read_offset = len(self.ids)
            return held + self.kept[token_id]
        self.ids.append(token_id)
        prefix_text = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is still held at the end (an incomplete character decodes as U+FFFD)."""
        prefix_text = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self.tokenizer.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text) :]
