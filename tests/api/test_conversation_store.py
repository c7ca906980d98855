"""The Conversations API's store alone: items kept in order with ids, pages both ways, bounds,
ownership."""

from __future__ import annotations

import pytest

from appliance.api.conversation_store import ConversationStore, metadata_of
from appliance.api.errors import ApiError


def _message(text: str) -> dict[str, object]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_items_are_kept_in_order_with_ids_and_paged_both_ways() -> None:
    store = ConversationStore()
    conv = store.create([_message("a"), {"type": "function_call_output", "call_id": "c1", "output": "x"}], {}, "k", 7)
    assert conv.as_object() == {"id": conv.id, "object": "conversation", "created_at": 7, "metadata": {}}
    added = store.add(conv.id, [_message(str(i)) for i in range(3)], "k")
    ids = [item["id"] for item in conv.items]
    assert len(set(ids)) == 5 and [a["id"] for a in added] == ids[2:]
    newest = store.page(conv.id, "k", limit=2)
    assert [i["id"] for i in newest["data"]] == ids[:-3:-1] and newest["has_more"]
    rest = store.page(conv.id, "k", after=newest["last_id"], limit=10)
    assert [i["id"] for i in rest["data"]] == ids[-3::-1] and not rest["has_more"]
    assert [i["id"] for i in store.page(conv.id, "k", order="asc")["data"]] == ids
    store.delete_item(conv.id, ids[0], "k")
    with pytest.raises(ApiError, match="no item"):
        store.item(conv.id, ids[0], "k")
    assert store.bytes == conv.size > 0


def test_a_conversation_is_its_key_s_and_the_store_is_bounded() -> None:
    store = ConversationStore(max_conversations=2, max_bytes=4000)
    mine = store.create([_message("hi")], {"topic": "x"}, "me", 0)
    with pytest.raises(ApiError) as other:
        store.get(mine.id, "you")
    assert other.value.status == 404
    with pytest.raises(ApiError, match="would hold more than this server keeps"):
        store.create([_message("x" * 5000)], {}, "me", 0)
    assert len(store) == 1  # the refused one was not kept
    second, third = (store.create([_message("b")], {}, "me", 0) for _ in range(2))
    with pytest.raises(ApiError):
        store.get(mine.id, "me")  # least recently used: dropped for the third
    while len(store) == 2:  # the one in use grows: room is made by dropping the other
        store.add(second.id, [_message("y" * 300)], "me")
        assert store.bytes <= 4000
    assert store.get(second.id, "me") is second and store.bytes == second.size
    with pytest.raises(ApiError):
        store.get(third.id, "me")
    with pytest.raises(ApiError, match="would hold more"):  # and once it alone fills the store, it is full
        while True:
            store.add(second.id, [_message("y" * 300)], "me")
    assert store.bytes == second.size <= 4000


@pytest.mark.parametrize("metadata", [{"k" * 65: "v"}, {"k": "v" * 513}, {"k": 1}, {str(i): "" for i in range(17)}, []])
def test_metadata_is_held_to_openai_s_bounds(metadata: object) -> None:
    with pytest.raises(ApiError) as refused:
        metadata_of(metadata)
    assert refused.value.status == 400 and refused.value.param == "metadata"
    assert metadata_of({"k": "v"}) == {"k": "v"} and metadata_of(None) == {}
