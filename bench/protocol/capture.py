"""Packets on the wire per request: tcpdump captures the interface filtered to the servers' ports,
tshark reads the capture back as fields, and the requests' own wall-clock marks split it.

Requests run one at a time, so request i owns every packet from its start to the start of request
i+1 (its connection set-up, exchange and close); the last request, whose window has no end, is
left out. (Round trips are timed on the lossy link instead: counting flights in a capture
miscounts packets nobody waited for, such as TLS session tickets.)
"""

from __future__ import annotations

import collections
import contextlib
import statistics
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.protocol.paths import Sample


@dataclass(frozen=True)
class Packet:
    t: float  # capture timestamp (wall clock)
    ip_bytes: int
    src: int  # source port
    dst: int
    udp: bool
    payload: int  # TCP payload bytes (UDP: the datagram's)


@dataclass
class WireStats:
    requests: int  # requests whose packets were counted
    packets: float  # per request, client <-> servers (both directions)
    bytes: float  # IP bytes per request, client <-> servers
    internal_packets: float  # per request, behind the gateway (nginx <-> layer <-> Redis)
    internal_bytes: float
    datagrams_to_answer: float  # median, UDP datagrams from the start until the answer was whole
    datagrams_in_all: float  # median, UDP datagrams in the request's whole window (close included)
    dropped: str  # tcpdump's own count of packets it missed
    in_all_counts: dict[int, int] = field(default_factory=dict)  # datagrams in all -> requests
    common: str = ""  # the most common datagram sequence (C: from the client, S: from the server; IP bytes)
    common_count: int = 0


@contextlib.contextmanager
def tcpdump(interface: str, ports: list[int], out: Path, ns: str | None = None) -> Iterator[list[str]]:
    """Capture to `out` while the block runs; yields a list that receives tcpdump's summary lines."""
    expr = " or ".join(f"port {p}" for p in sorted(set(ports)))
    cmd = ["tcpdump", "-i", interface, "-n", "-s", "128", "-B", "8192", "--immediate-mode", "-U", "-w", str(out), expr]
    if ns is not None:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    summary: list[str] = []
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # "listening on lo, ..." once the capture runs
        if "listening on" not in line:
            raise RuntimeError(f"tcpdump did not start: {line.strip()}")
        time.sleep(0.2)
        yield summary
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        summary += [ln.strip() for ln in (err or "").splitlines() if "packets" in ln]


def read_pcap(path: Path) -> list[Packet]:
    fields = ["frame.time_epoch", "ip.len", "tcp.srcport", "tcp.dstport", "udp.srcport", "udp.dstport", "tcp.len",
              "udp.length"]  # fmt: skip
    cmd = ["tshark", "-r", str(path), "-n", "-T", "fields", "-E", "separator=,", "-E", "occurrence=f"]
    for f in fields:
        cmd += ["-e", f]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    packets = []
    for line in out.splitlines():
        t, ip_len, tsp, tdp, usp, udp_, tlen, ulen = (line.split(",") + [""] * 8)[:8]
        if not ip_len:
            continue
        is_udp = bool(usp)
        packets.append(Packet(float(t), int(ip_len), int(usp or tsp), int(udp_ or tdp), is_udp,
                              int(ulen) - 8 if is_udp and ulen else int(tlen or 0)))  # fmt: skip
    return packets


def wire_stats(packets: list[Packet], samples: list[Sample], front_ports: set[int], internal_ports: set[int],
               dropped: str) -> WireStats:  # fmt: skip
    """Per-request figures from a capture of sequential requests (see the module's docstring)."""
    starts = sorted(s.start_wall for s in samples)
    if len(starts) < 2:
        return WireStats(0, 0, 0, 0, 0, 0, 0, dropped)
    ordered = sorted(samples, key=lambda s: s.start_wall)
    n = len(starts) - 1
    outer = [p for p in packets if starts[0] <= p.t < starts[-1]]
    front = [p for p in outer if p.src in front_ports or p.dst in front_ports]
    behind = [p for p in outer if p.src in internal_ports or p.dst in internal_ports]
    datagrams: list[int] = []
    in_all: list[int] = []
    sequences: collections.Counter[str] = collections.Counter()
    for i in range(n):
        s, nxt = ordered[i], ordered[i + 1].start_wall
        mine = [p for p in front if s.start_wall <= p.t < nxt]
        datagrams.append(sum(1 for p in mine if p.udp and p.t <= s.start_wall + s.ttlt))
        in_all.append(sum(1 for p in mine if p.udp))
        sequences[" ".join(f"{'S' if p.src in front_ports else 'C'}{p.ip_bytes}" for p in mine if p.udp)] += 1
    common, count = sequences.most_common(1)[0]
    return WireStats(n, len(front) / n, sum(p.ip_bytes for p in front) / n, len(behind) / n,
                     sum(p.ip_bytes for p in behind) / n, statistics.median(datagrams), statistics.median(in_all),
                     dropped, dict(sorted(collections.Counter(in_all).items())), common, count)  # fmt: skip

