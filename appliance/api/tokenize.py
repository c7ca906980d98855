"""The tokenizer over HTTP, as vLLM's server and llama.cpp's serve it: `/tokenize`,
`/detokenize` and `/tokenizer_info`. Evaluation harnesses ask for them to tokenize as the model
does without a copy of its tokenizer (lm-eval's `local-completions` looks for vLLM's first): on a
box with no model hub, they are the tokenizer it has. Each body is read the way either server's
clients send it; the answers carry both servers' field names."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from appliance.api.errors import ApiError, not_served
from appliance.api.fields import get_bool, get_str, reject_unknown


@dataclass(frozen=True)
class Tokenize:
    model: str
    text: str
    add_special_tokens: bool


def served_model(doc: dict[str, Any], served: Sequence[str]) -> str:
    """The model a request names, or the first served where it names none (one box, one model)."""
    model = get_str(doc, "model")
    if model is None:
        if not served:
            raise ApiError(503, "no model is served yet", retry_after=1)
        return served[0]
    if model not in served:
        raise ApiError(404, not_served(model, served), param="model")
    return model


def parse_tokenize(doc: dict[str, Any], served: Sequence[str]) -> Tokenize:
    """vLLM's `{"prompt", "add_special_tokens"}` (special tokens added unless told not to), or
    llama.cpp's `{"content", "add_special"}` (none added unless asked for)."""
    reject_unknown(doc, {"model", "prompt", "add_special_tokens", "content", "add_special"}, {
        "messages": "only a prompt is tokenized here (/v1/messages/count_tokens counts a conversation's tokens)",
        "return_token_strs": "the tokens' texts are not returned (/detokenize gives a list's text)",
        "with_pieces": "the tokens' texts are not returned (/detokenize gives a list's text)"})  # fmt: skip
    if ("prompt" in doc) == ("content" in doc):
        raise ApiError(400, "prompt: send the text to tokenize as prompt (or as content), once", param="prompt")
    vllm = "prompt" in doc
    text = get_str(doc, "prompt" if vllm else "content", required=True)
    assert text is not None
    add = get_bool(doc, "add_special_tokens") if "add_special_tokens" in doc else vllm
    if "add_special" in doc:
        add = get_bool(doc, "add_special")
    return Tokenize(served_model(doc, served), text, add)


def parse_detokenize(doc: dict[str, Any], served: Sequence[str]) -> tuple[str, list[int]]:
    reject_unknown(doc, {"model", "tokens"}, {})
    tokens = doc.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                               for t in tokens):  # fmt: skip
        raise ApiError(400, "tokens: must be a list of token ids", param="tokens")
    return served_model(doc, served), tokens


def tokenized(tokens: list[int], context_length: int) -> dict[str, Any]:
    return {"tokens": tokens, "count": len(tokens), "max_model_len": context_length}


def detokenized(text: str) -> dict[str, Any]:
    return {"prompt": text, "content": text}  # vLLM's name, llama.cpp's
