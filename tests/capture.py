"""Packet captures for tests: tcpdump on an interface (in a network namespace), read back with a
small pcap reader, grouped by the client side of each flow as the kernel's `flows` map keys them."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ETH_IPV4, ETH_IPV6 = 0x0800, 0x86DD
PROTOS = {6: "tcp", 17: "udp"}


@dataclass(frozen=True)
class Packet:
    proto: str
    src: tuple[str, int]
    dst: tuple[str, int]
    wire_len: int  # the frame as it was on the wire, Ethernet header included (pcap orig_len)


@contextlib.contextmanager
def tcpdump(ns: str, ifname: str, bpf_filter: str, out: Path) -> Iterator[Path]:
    """Capture on `ifname` in namespace `ns` until the block ends; every packet is written
    unbuffered (-U) and the capture is complete once tcpdump has exited."""
    cmd = ["ip", "netns", "exec", ns, "tcpdump", "-i", ifname, "-n", "-U", "-s", "128", "-w", str(out), bpf_filter]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # "listening on ...": the socket is open, nothing is missed from here
        assert "listening on" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
        yield out
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(10)


def read_pcap(path: Path) -> list[Packet]:
    """The TCP and UDP packets of an Ethernet pcap file (as tcpdump -w writes it)."""
    data = path.read_bytes()
    magic = struct.unpack_from("<I", data)[0]
    assert magic in (0xA1B2C3D4, 0xA1B23C4D), f"{path}: not a little-endian pcap file"
    linktype = struct.unpack_from("<I", data, 20)[0]
    assert linktype == 1, f"{path}: link type {linktype}, expected Ethernet"
    packets, off = [], 24
    while off + 16 <= len(data):
        incl, orig = struct.unpack_from("<II", data, off + 8)
        frame = data[off + 16 : off + 16 + incl]
        off += 16 + incl
        packet = _parse(frame, orig)
        if packet is not None:
            packets.append(packet)
    return packets


def _parse(frame: bytes, wire_len: int) -> Packet | None:
    ethertype = struct.unpack_from("!H", frame, 12)[0]
    if ethertype == ETH_IPV4:
        ihl = (frame[14] & 0x0F) * 4
        proto, src, dst, l4 = frame[23], frame[26:30], frame[30:34], 14 + ihl
    elif ethertype == ETH_IPV6:
        proto, src, dst, l4 = frame[20], frame[22:38], frame[38:54], 54
    else:
        return None
    if proto not in PROTOS:
        return None
    sport, dport = struct.unpack_from("!HH", frame, l4)
    return Packet(PROTOS[proto], (str(ipaddress.ip_address(src)), sport), (str(ipaddress.ip_address(dst)), dport),
                  wire_len)  # fmt: skip


def per_client(packets: list[Packet], server_port: int) -> dict[tuple[str, tuple[str, int]], tuple[int, int]]:
    """(proto, client address) -> (packets, bytes) in both directions, for flows to `server_port`."""
    totals: dict[tuple[str, tuple[str, int]], tuple[int, int]] = {}
    for p in packets:
        if p.dst[1] == server_port:
            client = p.src
        elif p.src[1] == server_port:
            client = p.dst
        else:
            continue
        n, b = totals.get((p.proto, client), (0, 0))
        totals[(p.proto, client)] = (n + 1, b + p.wire_len)
    return totals
