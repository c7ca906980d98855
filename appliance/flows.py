"""Per-connection prompt digests: what a client flow sent last, so its next request can say how
much of it the new prompt shares ("found 7/10 digests") and the prefix cache can be asked first.

A flow is the client's 4-tuple plus the protocol. This module is the userspace table (an LRU
bounded in entries, flows idle past a limit dropped); the kernel layer keeps the same records in
its pinned `flows` map when it is loaded.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from appliance.asgi import Scope


@dataclass(frozen=True)
class FlowKey:
    proto: str  # "udp" (QUIC) or "tcp"
    client: tuple[str, int]
    server: tuple[str, int]

    def __str__(self) -> str:
        host, port = self.client
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def flow_of(scope: Scope, transport: str) -> FlowKey | None:
    """The flow a request came on; None for the Unix socket, which has no 4-tuple."""
    client, server = scope.get("client"), scope.get("server")
    if transport not in ("http3", "tcp") or not client or not server or server[1] is None:
        return None
    return FlowKey("udp" if transport == "http3" else "tcp", (str(client[0]), int(client[1])),
                   (str(server[0]), int(server[1])))  # fmt: skip


class DigestTable(Protocol):
    def get(self, flow: FlowKey) -> tuple[bytes, ...]: ...

    def put(self, flow: FlowKey, digests: list[bytes]) -> None: ...


class UserspaceDigests:
    def __init__(self, max_flows: int = 65536, idle_seconds: float = 600.0) -> None:
        self.max_flows, self.idle_seconds = max_flows, idle_seconds
        self._flows: OrderedDict[FlowKey, tuple[float, tuple[bytes, ...]]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._flows)

    def get(self, flow: FlowKey) -> tuple[bytes, ...]:
        now = time.monotonic()
        with self._lock:
            entry = self._flows.get(flow)
            if entry is None or now - entry[0] > self.idle_seconds:
                return ()
            return entry[1]

    def put(self, flow: FlowKey, digests: list[bytes]) -> None:
        now = time.monotonic()
        with self._lock:
            self._flows[flow] = (now, tuple(digests[-10:]))
            self._flows.move_to_end(flow)
            while len(self._flows) > self.max_flows:
                self._flows.popitem(last=False)
            # Idle flows leave from the old end; the LRU order is also the idle order.
            while self._flows and now - next(iter(self._flows.values()))[0] > self.idle_seconds:
                self._flows.popitem(last=False)
