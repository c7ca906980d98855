"""The Conversations API's conversations (`/v1/conversations`): lists of Responses API items that
a request continues with `conversation`, its input and output then added to them, and that
clients read, add to and trim themselves (the OpenAI Agents SDK's OpenAIConversationsSession).
Sans-IO and bounded: at most `max_conversations` conversations and `max_bytes` of their items'
JSON, the least recently used dropped first; a conversation is visible to the API key that made
it only.
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from appliance.api.errors import ApiError

MAX_METADATA = 16  # key-value pairs, as OpenAI allows
MAX_KEY, MAX_VALUE = 64, 512  # characters
MAX_PAGE, DEFAULT_PAGE = 100, 20  # items a list returns


@dataclass
class Conversation:
    id: str
    created_at: int
    metadata: dict[str, str]
    owner: str | None
    items: list[dict[str, Any]] = field(default_factory=list)
    size: int = 0  # bytes of its items' JSON

    def as_object(self) -> dict[str, Any]:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at, "metadata": self.metadata}


def metadata_of(value: Any, param: str = "metadata") -> dict[str, str]:
    """Conversation metadata as OpenAI takes it: up to 16 string pairs, keys up to 64 characters,
    values up to 512; None is none. ApiError 400 otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_METADATA:
        raise ApiError(400, f"{param}: must be an object of at most {MAX_METADATA} pairs", param=param)
    for key, text in value.items():
        if len(key) > MAX_KEY or not isinstance(text, str) or len(text) > MAX_VALUE:
            raise ApiError(400, f"{param}.{key}: keys are strings of at most {MAX_KEY} characters, values strings "
                           f"of at most {MAX_VALUE}", param=param)  # fmt: skip
    return dict(value)


def _size(items: Sequence[dict[str, Any]]) -> int:
    return sum(len(json.dumps(item)) for item in items)


def with_id(item: dict[str, Any]) -> dict[str, Any]:
    """An item as a conversation keeps it: with an id of its own where it came without one."""
    return item if isinstance(item.get("id"), str) else {**item, "id": "item_" + uuid.uuid4().hex[:24]}


class ConversationStore:
    def __init__(self, max_conversations: int = 1024, max_bytes: int = 64 << 20) -> None:
        self.max_conversations, self.max_bytes = max_conversations, max_bytes
        self._kept: OrderedDict[str, Conversation] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def create(self, items: Sequence[dict[str, Any]], metadata: dict[str, str], owner: str | None,
               now: int) -> Conversation:  # fmt: skip
        conversation = Conversation("conv_" + uuid.uuid4().hex, now, metadata, owner)
        self._kept[conversation.id] = conversation
        try:
            self.add(conversation.id, items, owner)
        except ApiError:
            del self._kept[conversation.id]
            raise
        return conversation

    def get(self, conversation_id: str, owner: str | None) -> Conversation:
        """The conversation, most recently used now. ApiError 404 where it is not kept for this key."""
        kept = self._kept.get(conversation_id)
        if kept is None or kept.owner != owner:
            raise ApiError(404, f"no conversation {conversation_id!r}: conversations are kept (up to "
                           f"{self.max_conversations}, least recently used dropped first) until deleted",
                           param="conversation_id")  # fmt: skip
        self._kept.move_to_end(conversation_id)
        return kept

    def delete(self, conversation_id: str, owner: str | None) -> None:
        kept = self.get(conversation_id, owner)
        del self._kept[conversation_id]
        self.bytes -= kept.size

    def add(self, conversation_id: str, items: Sequence[dict[str, Any]], owner: str | None) -> list[dict[str, Any]]:
        """Append items (each given an id where it has none); the least recently used other
        conversations make room. ApiError 400 where the conversation would outgrow the store."""
        kept = self.get(conversation_id, owner)
        added = [with_id(item) for item in items]
        size = _size(added)
        if kept.size + size > self.max_bytes:
            raise ApiError(400, f"conversation {conversation_id!r} would hold more than this server keeps "
                           f"({self.max_bytes >> 20} MiB of items); start another", param="items")  # fmt: skip
        kept.items += added
        kept.size += size
        self.bytes += size
        while self.bytes > self.max_bytes or len(self._kept) > self.max_conversations:
            oldest = next(iter(self._kept))
            if oldest == conversation_id:  # (it alone fits: another goes first)
                self._kept.move_to_end(oldest)
                oldest = next(iter(self._kept))
            self.bytes -= self._kept.pop(oldest).size
        return added

    def item(self, conversation_id: str, item_id: str, owner: str | None) -> dict[str, Any]:
        for item in self.get(conversation_id, owner).items:
            if item.get("id") == item_id:
                return item
        raise ApiError(404, f"no item {item_id!r} in conversation {conversation_id!r}", param="item_id")

    def delete_item(self, conversation_id: str, item_id: str, owner: str | None) -> Conversation:
        kept = self.get(conversation_id, owner)
        item = self.item(conversation_id, item_id, owner)
        kept.items.remove(item)
        size = _size([item])
        kept.size -= size
        self.bytes -= size
        return kept

    def page(self, conversation_id: str, owner: str | None, after: str | None = None, limit: int = DEFAULT_PAGE,
             order: str = "desc") -> dict[str, Any]:  # fmt: skip
        """A page of the items as the API lists them: `order` by when they were added, from the
        one after `after` (an item id), at most `limit`."""
        items = list(self.get(conversation_id, owner).items)
        if order == "desc":
            items.reverse()
        if after is not None:
            at = next((i for i, item in enumerate(items) if item.get("id") == after), None)
            if at is None:
                raise ApiError(400, f"after: no item {after!r} in conversation {conversation_id!r}", param="after")
            items = items[at + 1 :]
        data = items[:limit]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": len(items) > limit}  # fmt: skip
