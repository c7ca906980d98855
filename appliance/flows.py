"""Per-connection prompt digests: what a client flow sent last, so its next request can say how
much of it the new prompt shares ("found 7/10 digests") and the prefix cache can be asked first.

A flow is the client's 4-tuple plus the protocol; the records live in the flow layer (the
kernel's pinned map, or its userspace stand-in).
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from appliance.asgi import Scope
from appliance.kernel import FlowKey, FlowLayer

log = logging.getLogger(__name__)


def flow_of(scope: Scope, transport: str) -> FlowKey | None:
    """The flow a request came on, keyed as the kernel keys it; None for the Unix socket (no
    4-tuple) or an address pair the table cannot key (a flow never fails a request)."""
    client, server = scope.get("client"), scope.get("server")
    if transport not in ("http3", "tcp") or not client or not server or server[1] is None:
        return None
    try:
        return FlowKey.make("udp" if transport == "http3" else "tcp", (str(client[0]), int(client[1])),
                            (str(server[0]), int(server[1])))  # fmt: skip
    except ValueError:
        return None


class DigestTable(Protocol):
    def get(self, flow: FlowKey) -> tuple[bytes, ...]: ...

    def put(self, flow: FlowKey, digests: list[bytes]) -> None: ...


class LayerDigests:
    """Digests kept in the flow layer's records: the kernel's pinned `flows` map (so they survive a
    daemon restart), or its userspace stand-in of the same layout. Idle flows read as empty."""

    def __init__(self, layer: FlowLayer, idle_seconds: float = 600.0) -> None:
        self.layer, self.idle_seconds = layer, idle_seconds
        self._written: dict[bytes, float] = {}  # when we last wrote each flow (by its key's bytes), bounded below

    def get(self, flow: FlowKey) -> tuple[bytes, ...]:
        raw = bytes(flow)
        written = self._written.get(raw)
        if written is not None and time.monotonic() - written > self.idle_seconds:
            del self._written[raw]  # idle too long: this flow starts afresh
            return ()
        # Never written by this daemon: an earlier one may have (the map is pinned), so read it.
        try:
            record = self.layer.lookup_flow(flow)
        except (OSError, ValueError) as exc:  # the table only saves work: a request never fails on it
            log.warning("flow table: reading %s %s failed, serving without its digests: %s", flow.proto_name, flow,
                        exc)  # fmt: skip
            return ()
        return tuple(d for d in record.digests if any(d)) if record is not None else ()

    def put(self, flow: FlowKey, digests: list[bytes]) -> None:
        try:
            self.layer.write_digests(flow, digests)
        except (OSError, ValueError) as exc:
            log.warning("flow table: writing %s %s failed; its next request starts cold: %s", flow.proto_name, flow,
                        exc)  # fmt: skip
            return
        now = time.monotonic()
        self._written[bytes(flow)] = now
        if len(self._written) > 65536:  # forget the idle ones; the map keeps its own LRU bound
            for key in [k for k, t in self._written.items() if now - t > self.idle_seconds][:4096]:
                del self._written[key]
