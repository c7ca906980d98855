"""What the dialect tests read back: the JSON events of an SSE body, and a request's end."""

from __future__ import annotations

import json
from typing import Any

from appliance.engine.request import Finished
from appliance.engine.trace import Trace


def finished(reason: str = "end_turn") -> Finished:
    """The engine's end of a request: 12 prompt tokens, 3 generated."""
    return Finished(reason, None, 12, 3, Trace(request_id="r1"))


def sse_events(sse: bytes) -> list[dict[str, Any]]:
    """The JSON objects of an SSE body's data lines."""
    return [json.loads(line[5:]) for line in sse.decode().splitlines() if line.startswith("data: {")]
