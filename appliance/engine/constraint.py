"""Constrained decoding with llguidance: a grammar compiled once per request, and before each
token a mask of the tokens that keep the output inside it.

llguidance (what llama.cpp and onnxruntime-genai use) computes a mask in tens of microseconds
from the bundle's own `tokenizers` file and needs no torch; xgrammar needs torch and transformers.
The measurement is in bench/results/engine.md.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from llguidance import LLMatcher, LLParserLimits, LLTokenizer, TokenizerWrapper
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask
from tokenizers import Tokenizer

from appliance.engine.errors import InvalidRequest

log = logging.getLogger(__name__)
T = TypeVar("T")


class GrammarCompiler:
    """One per bundle: the tokenizer's trie, built once (about 0.3 s for a 49k vocabulary)."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = guidance_tokenizer(tokenizer_json.read_text(), vocab_size, eos_token_ids)

    def constraint(self, lark: str, param: str, subject: str = "the schema") -> Constraint:
        """Compile a Lark grammar for one request; InvalidRequest (naming `param` and `subject`, what
        the grammar came from) if it cannot be."""
        try:
            grammar = _unpanicked(LLMatcher.grammar_from_lark, lark)
            is_error, messages = _unpanicked(LLMatcher.validate_grammar_with_warnings, grammar, self.tokenizer,
                                             limits=_limits())  # fmt: skip
        except GrammarPanic as exc:
            # Seen on schemas that break JSON Schema's own rules ("required" a string, not a list).
            log.warning("llguidance panicked compiling a grammar for %s: %s", param, exc)
            raise InvalidRequest(f"{param}: {subject} cannot be used to constrain output (the grammar "
                                 "compiler failed on it: check it is valid JSON Schema)", param) from None  # fmt: skip
        if is_error:
            raise InvalidRequest(f"{param}: {subject} cannot be used to constrain output: {schema_error(messages[0])}",
                                 param)  # fmt: skip
        if messages:  # a lenient schema's keywords left unenforced: the client's choice, not the operator's concern
            log.debug("%s: not enforced: %s", param, "; ".join(messages))
        matcher = LLMatcher(self.tokenizer, grammar, log_level=0, limits=_limits())
        if matcher.is_error():
            raise InvalidRequest(f"{param}: {subject} cannot be used to constrain output: "
                                 f"{schema_error(matcher.get_error())}", param)  # fmt: skip
        return Constraint(matcher, self.vocab_size, param)


class _Vocabulary:
    """A vocabulary as llguidance's TokenizerWrapper takes it: each token's bytes, which of them
    are special, and the tokenizer to tokenize text with."""

    def __init__(self, tokenizer: Tokenizer, tokens: list[bytes], special: list[int], eos: int) -> None:
        self.tokens, self.special_token_ids = tokens, special
        self.eos_token_id, self.bos_token_id = eos, None
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # (asked once whether it takes bytes: it takes text)
            raise TypeError("text only")
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)


def guidance_tokenizer(tokenizer_json: str, vocab_size: int, eos_token_ids: Sequence[int]) -> LLTokenizer:
    """llguidance's tokenizer for a bundle's `tokenizers` file. llguidance's own loader takes every
    added token written as a tag for a special one, also those the tokenizer decodes as text (Qwen's
    `<tool_call>`, Nemotron's `<TOOLCALL>`, `<think>`). A grammar whose text begins with one then
    forces that token and refuses it as special when the model writes it: every call it forced
    failed. Where the file has such tokens, the vocabulary goes to llguidance token by token, each
    special only where the tokenizer says it is (or past its vocabulary: rows no prompt holds)."""
    loaded = LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids))
    textual = {int(a["id"]) for a in json.loads(tokenizer_json).get("added_tokens", []) if not a.get("special")}
    if not any(loaded.is_special_token(i) for i in textual if i < vocab_size):
        return loaded
    tokens = [bytes(loaded.decode_bytes([i])) for i in range(vocab_size)]
    special = [i for i in range(vocab_size) if loaded.is_special_token(i) and i not in textual]
    vocabulary = _Vocabulary(Tokenizer.from_str(tokenizer_json), tokens, special, int(eos_token_ids[0]))
    return LLTokenizer(TokenizerWrapper(vocabulary), eos_token=list(eos_token_ids))


# llguidance quotes the grammar around an error, line by line ("   2 | text: %json {...}"): our
# rules and our JSON style, not what the client sent.
_LISTING = re.compile(r"^\s*\d+ \| ")


def schema_error(message: str) -> str:
    """llguidance's message about a grammar, as the client's: without its position in our grammar
    and the lines of it that it quotes (a regex error's own caret lines stay)."""
    lines = []
    for line in message.splitlines():
        if _LISTING.match(line):
            break
        lines.append(line)
    text = re.sub(r"^at \d+\(\d+\): ", "", "\n".join(lines).strip())
    return text.removeprefix("failed to compile JSON schema: ") or message.strip()


class GrammarPanic(RuntimeError):
    """A Rust panic inside llguidance."""


def _unpanicked(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call into llguidance. A Rust panic reaches Python as pyo3's PanicException, a BaseException
    that `except Exception` lets through (it would end the worker thread or the connection): it
    comes out as a GrammarPanic."""
    try:
        return call(*args, **kwargs)
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        raise GrammarPanic(str(exc)) from None


def _limits() -> LLParserLimits:
    """Bounds on what one request's grammar may cost (llguidance's defaults, tightened: a hostile
    schema is refused with a 400 instead of holding a worker)."""
    return LLParserLimits(max_grammar_size=200_000, max_lexer_states=100_000, step_max_items=20_000)


class Constraint:
    """One request's grammar state: fill() the mask for the next token (the worker does it while
    the batch's model run is in flight), apply() it to that token's logits, then accept() the
    token chosen."""

    def __init__(self, matcher: LLMatcher, vocab_size: int, param: str) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.param = param  # the request's field the grammar came from, for its errors
        self.mask = allocate_token_bitmask(1, vocab_size)
        self.filled = False
        self.failure: Exception | None = None

    def fill(self) -> None:
        """Never raises: it runs beside the model run in the worker's pool, and a failure there
        belongs to this request alone (apply() raises it, where the worker ends the request)."""
        if not self.filled:
            try:
                _unpanicked(fill_next_token_bitmask, self.matcher, self.mask, 0)
            except Exception as exc:
                self.failure = RuntimeError(f"the grammar failed to give the next token's mask: {exc}")
            self.filled = True

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """The logits with every token the grammar forbids at -inf (a copy: the batch's array is shared)."""
        self.fill()
        if self.failure is not None:
            raise self.failure
        allowed = np.unpackbits(self.mask.view(np.uint8), bitorder="little")[: logits.shape[-1]].astype(bool)
        if logits.shape[-1] > allowed.shape[0]:  # positions past the tokenizer's vocabulary are never allowed
            allowed = np.concatenate([allowed, np.zeros(logits.shape[-1] - allowed.shape[0], dtype=bool)])
        return np.where(allowed, logits, np.float32(-np.inf))

    def accept(self, token: int) -> None:
        self.filled = False
        if not _unpanicked(self.matcher.consume_token, token):
            # The mask allowed it: llguidance stopped on one of the limits (_limits) that a schema
            # too costly to follow runs into partway through an answer; the schema is the client's.
            error = self.matcher.get_error().split("\n", 1)[0]
            raise InvalidRequest(f"{self.param}: the schema is too costly to follow at this point of the "
                                 f"answer ({error})", self.param)  # fmt: skip

    @property
    def finished(self) -> bool:
        """Nothing but the end of the answer can follow."""
        return bool(self.matcher.is_stopped())
