"""Typed field access for request JSON: each mistake is a 400 naming the field."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from appliance.api.errors import ApiError

MAX_NESTING = 64  # far beyond any API request; deeper bodies are refused, not parsed to exhaustion
# A JSON escape of a UTF-16 surrogate: only these can make a string that is not Unicode (a lone
# one), so the walk that finds it runs only on bodies that have one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json_object(body: bytes) -> dict[str, Any]:
    if not body:
        raise ApiError(400, "the request body is empty: send a JSON object")
    too_deep = ApiError(400, f"the request body nests arrays and objects more than {MAX_NESTING} levels deep")
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise too_deep from None
    if not isinstance(doc, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if _depth(doc) > MAX_NESTING:
        raise too_deep
    if _SURROGATE_ESCAPE.search(body):
        _refuse_lone_surrogates(doc)
    return doc


def _refuse_lone_surrogates(doc: dict[str, Any]) -> None:
    """A 400 naming the first string (or key) that holds a lone surrogate: JSON's \\ud800 escapes
    parse to one, and neither the tokenizer, the grammar compiler nor a UTF-8 answer can take it."""
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ApiError(400, f"{where or 'the body'}: character {exc.start} is a lone surrogate "
                                    f"(U+{ord(value[exc.start]):04X}), not a Unicode character",
                               param=where or None) from None  # fmt: skip
        elif isinstance(value, dict):
            for key, child in value.items():
                inner = f"{where}.{_printable(key)}" if where else _printable(key)
                stack += [(inner, child), (f"a key of {where}" if where else "a key", key)]
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", child) for i, child in enumerate(value))


def _printable(key: str) -> str:
    return key.encode("utf-8", "backslashreplace").decode()


def _depth(doc: Any) -> int:
    """How deeply arrays and objects nest (iteratively: a recursive walk is what deep JSON breaks)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def reject_unknown(doc: dict[str, Any], known: set[str], unsupported: dict[str, str], where: str = "") -> None:
    for key in doc:
        if key in unsupported and _unset(doc[key]):
            continue  # frameworks send every parameter they know, the unused ones empty: only a use is refused
        if key in unsupported:
            raise ApiError(400, f"{where}{key}: {unsupported[key]}", param=f"{where}{key}")
        if key not in known:
            raise ApiError(400, f"{where}{key}: unknown field", param=f"{where}{key}")


# What a hint may hold: a JSON type, or the strings the API documents for it.
Hint = type | tuple[str, ...]
_TYPE_NAMES = {str: "a string", dict: "an object", bool: "true or false", list: "a list"}


def check_hints(doc: dict[str, Any], hints: Mapping[str, Hint], where: str = "", param: str | None = None) -> None:
    """Parameters this server honours by doing nothing different: a prompt-cache key or lifetime
    (its prefix pool keeps what it can, unasked), a service tier or speed it has only one of, ids
    for the client's own accounting. Accepted where they hold what the API documents (null too,
    as unset), else a 400 naming the field: a client's typo should not pass unseen."""
    for key, hint in hints.items():
        value = doc.get(key)
        if value is None:
            continue
        if isinstance(hint, tuple):
            if value not in hint:
                raise ApiError(400, f"{where}{key}: must be one of {', '.join(hint)}", param=param or key)
        elif not isinstance(value, hint):
            raise ApiError(400, f"{where}{key}: must be {_TYPE_NAMES.get(hint, hint.__name__)}", param=param or key)


def _unset(value: Any) -> bool:
    """An unused parameter as clients send it: null, false, 0, or an empty list or object."""
    if isinstance(value, str):
        return False
    return value is None or value is False or value == 0 or value == [] or value == {}


def get_str(doc: dict[str, Any], key: str, required: bool = False, where: str = "") -> str | None:
    value = doc.get(key)
    if value is None:
        if required:
            raise ApiError(400, f"{where}{key}: field required", param=f"{where}{key}")
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"{where}{key}: must be a string", param=f"{where}{key}")
    return value


def get_int(doc: dict[str, Any], key: str, required: bool = False, minimum: int | None = None) -> int | None:
    value = doc.get(key)
    if value is None:
        if required:
            raise ApiError(400, f"{key}: field required", param=key)
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key}: must be an integer", param=key)
    if minimum is not None and value < minimum:
        raise ApiError(400, f"{key}: must be at least {minimum}", param=key)
    return value


def get_number(doc: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ApiError(400, f"{key}: must be a number", param=key)
    if not lo <= value <= hi:
        raise ApiError(400, f"{key}: must be between {lo} and {hi}", param=key)
    return float(value)


def get_bool(doc: dict[str, Any], key: str) -> bool:
    value = doc.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"{key}: must be true or false", param=key)
    return value


def text_content(content: Any, where: str, allow_types: tuple[str, ...] = ("text",)) -> str:
    """A message content that is a string or a list of text blocks; other blocks are refused by name."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise ApiError(400, f"{where}: must be a string or a non-empty list of content blocks", param=where)
    return "".join(block_text(block, f"{where}[{i}]", allow_types, where) for i, block in enumerate(content))


def block_text(block: Any, at: str, allow_types: tuple[str, ...] = ("text",), param: str | None = None) -> str:
    """One content block's text; blocks of other types are refused by name."""
    param = param or at
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise ApiError(400, f"{at}: must be an object with a type", param=param)
    kind = block["type"]
    if kind not in allow_types:
        raise ApiError(400, f"{at}: content blocks of type {kind!r} are not supported by this server (text only)",
                       param=param)  # fmt: skip
    text = block.get("text")
    if not isinstance(text, str):
        raise ApiError(400, f"{at}.text: must be a string", param=param)
    return text
