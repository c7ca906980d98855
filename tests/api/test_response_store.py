"""The Responses API's store (appliance/api/response_store.py): bounded by count and by bytes, the
least recently used dropped first, each response seen by its own API key only, and a continuation
read back through the chain of the responses it continued."""

from __future__ import annotations

import json
from typing import Any

import pytest

from appliance.api.errors import ApiError
from appliance.api.response_store import ResponseStore


def _response(response_id: str, text: str = "ok") -> dict[str, Any]:
    return {"id": response_id, "object": "response", "output": [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]}  # fmt: skip


def _ask(text: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}]


def test_a_conversation_reads_back_through_every_response_it_continued() -> None:
    store = ResponseStore()
    store.put(_response("r1", "hello"), None, _ask("hi"), owner="alice")
    store.put(_response("r2", "fine"), "r1", _ask("how are you?"), owner="alice")
    store.put(_response("r3", "bye"), "r2", _ask("bye"), owner="alice")
    texts = [part["text"] for item in store.conversation("r3", "alice") for part in item["content"]]
    assert texts == ["hi", "hello", "how are you?", "fine", "bye", "bye"]
    assert [part["text"] for item in store.conversation("r1", "alice") for part in item["content"]] == ["hi", "hello"]


def test_a_response_is_seen_by_its_own_key_only() -> None:
    store = ResponseStore()
    store.put(_response("r1"), None, _ask("hi"), owner="alice")
    assert store.get("r1", "bob") is None and not store.delete("r1", "bob")
    with pytest.raises(ApiError) as info:
        store.conversation("r1", "bob")
    assert info.value.status == 400 and info.value.param == "previous_response_id"
    assert store.get("r1", "alice") is not None and store.delete("r1", "alice") and len(store) == 0


def test_the_least_recently_used_go_first_past_either_bound() -> None:
    store = ResponseStore(max_responses=3)
    for i in range(3):
        store.put(_response(f"r{i}"), None, _ask("hi"), owner=None)
    assert store.get("r0", None) is not None  # used: r1 is now the oldest
    store.put(_response("r3"), None, _ask("hi"), owner=None)
    assert [r for r in ("r0", "r1", "r2", "r3") if store.get(r, None)] == ["r0", "r2", "r3"]

    one = len(json.dumps(_response("r0"))) + len(json.dumps(_ask("hi")))
    by_bytes = ResponseStore(max_bytes=2 * one)
    for i in range(5):
        by_bytes.put(_response(f"r{i}"), None, _ask("hi"), owner=None)
    assert len(by_bytes) == 2 and by_bytes.bytes <= 2 * one
    by_bytes.put(_response("big", "x" * 4 * one), None, _ask("hi"), owner=None)  # larger than the whole store
    assert by_bytes.get("big", None) is None and len(by_bytes) == 2


def test_a_continuation_whose_chain_was_dropped_says_which_link_is_gone() -> None:
    store = ResponseStore(max_responses=2)
    store.put(_response("r1"), None, _ask("a"), owner=None)
    store.put(_response("r2"), "r1", _ask("b"), owner=None)
    store.put(_response("r3"), "r2", _ask("c"), owner=None)  # r1 dropped
    with pytest.raises(ApiError, match="'r1' it continued is no longer kept"):
        store.conversation("r3", None)
    with pytest.raises(ApiError, match="no stored response 'nope'"):
        store.conversation("nope", None)
