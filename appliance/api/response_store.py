"""The Responses API's stored responses: what `previous_response_id` continues and
`GET /v1/responses/{id}` returns. Sans-IO and bounded: at most `max_responses` responses and
`max_bytes` of their JSON, the least recently used dropped first.

Each response keeps only its own turn (its input items and its output items) and the id of the
response it continued, so a long conversation costs its length once, not once per turn; a
continuation walks the chain back. A response is visible to the API key that made it only.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from appliance.api.errors import ApiError


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as it was sent
    previous: str | None  # the response it continued
    input_items: list[dict[str, Any]]  # this turn's input (after the previous response's output)
    owner: str | None  # the API key's name
    size: int


class ResponseStore:
    def __init__(self, max_responses: int = 1024, max_bytes: int = 64 << 20) -> None:
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._kept: OrderedDict[str, StoredResponse] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def put(self, response: dict[str, Any], previous: str | None, input_items: list[dict[str, Any]],
            owner: str | None) -> None:  # fmt: skip
        size = len(json.dumps(response)) + len(json.dumps(input_items))
        if size > self.max_bytes:
            return  # larger than the whole store: not kept (a continuation of it is told so)
        self.delete(str(response["id"]), owner)
        self._kept[str(response["id"])] = StoredResponse(response, previous, input_items, owner, size)
        self.bytes += size
        while len(self._kept) > self.max_responses or self.bytes > self.max_bytes:
            _, dropped = self._kept.popitem(last=False)
            self.bytes -= dropped.size

    def get(self, response_id: str, owner: str | None) -> StoredResponse | None:
        kept = self._kept.get(response_id)
        if kept is None or kept.owner != owner:
            return None
        self._kept.move_to_end(response_id)
        return kept

    def delete(self, response_id: str, owner: str | None) -> bool:
        kept = self._kept.get(response_id)
        if kept is None or kept.owner != owner:
            return False
        del self._kept[response_id]
        self.bytes -= kept.size
        return True

    def conversation(self, response_id: str, owner: str | None) -> list[dict[str, Any]]:
        """Every item of the conversation through `response_id`, oldest first: each turn's input
        then its output. ApiError 400 (param previous_response_id) if it or a response it
        continued is not kept."""
        turns: list[list[dict[str, Any]]] = []
        at: str | None = response_id
        while at is not None:
            kept = self.get(at, owner)
            if kept is None:
                missing = "" if at == response_id else f" (the response {at!r} it continued is no longer kept)"
                raise ApiError(400, f"previous_response_id: no stored response {response_id!r}{missing}; "
                               "send the whole conversation in input", param="previous_response_id")  # fmt: skip
            turns.append(kept.input_items + list(kept.response.get("output") or []))
            at = kept.previous
        return [item for turn in reversed(turns) for item in turn]
