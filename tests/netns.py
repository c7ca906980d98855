"""Two network namespaces joined by a veth pair: the server in one, clients in the other.
Shared by the kernel-layer tests (the `netpair` fixture in conftest.py) and the kernel benchmark."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass


def sh(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stderr}"
    return proc.stdout


@dataclass
class NetPair:
    server_ns: str
    client_ns: str
    server_if: str
    client_if: str
    server4: str
    client4: str
    server6: str
    client6: str


@contextlib.contextmanager
def net_pair() -> Iterator[NetPair]:
    """Fresh namespaces with IPv4 and IPv6 on both ends (IPv6 without DAD, so usable at once);
    deleted on exit, which also deletes the veth pair."""
    tag = uuid.uuid4().hex[:6]
    net = int(tag[:2], 16)
    pair = NetPair(f"zlt-{tag}-s", f"zlt-{tag}-c", f"zv{tag}s", f"zv{tag}c", f"10.199.{net}.1", f"10.199.{net}.2",
                   f"fd00:199:{net:x}::1", f"fd00:199:{net:x}::2")  # fmt: skip
    try:
        sh("ip", "netns", "add", pair.server_ns)
        sh("ip", "netns", "add", pair.client_ns)
        sh("ip", "link", "add", pair.server_if, "netns", pair.server_ns, "type", "veth",
           "peer", "name", pair.client_if, "netns", pair.client_ns)  # fmt: skip
        for ns, ifname, a4, a6 in ((pair.server_ns, pair.server_if, pair.server4, pair.server6),
                                   (pair.client_ns, pair.client_if, pair.client4, pair.client6)):  # fmt: skip
            sh("ip", "-n", ns, "addr", "add", f"{a4}/24", "dev", ifname)
            sh("ip", "-n", ns, "addr", "add", f"{a6}/64", "dev", ifname, "nodad")
            sh("ip", "-n", ns, "link", "set", ifname, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        for ns in (pair.server_ns, pair.client_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
