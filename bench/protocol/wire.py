"""A lossy, slow link between two network namespaces, in userspace: a TUN device in each, and this
process moving IP packets between them after a fixed delay, dropping a fraction at random.

What netem would do, for kernels without sch_netem (this development VM's has
CONFIG_NET_SCH_NETEM unset). Packets keep their order (one fixed delay per direction); TCP and
QUIC see real loss and real delay and run their own recovery. At exit (SIGTERM) it prints what it
forwarded, dropped, and how late its timer fired on average.

Run: python -m bench.protocol.wire NS_A NS_B IFNAME DELAY_MS LOSS_PCT
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import os
import random
import signal
import struct
import sys

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
CLONE_NEWNET = 0x40000000


def open_tun(namespace: str, name: str) -> int:
    """A TUN device named `name` inside `namespace` (it lives as long as the returned fd)."""
    libc = ctypes.CDLL(None, use_errno=True)
    ns_fd = os.open(f"/var/run/netns/{namespace}", os.O_RDONLY)
    try:
        if libc.setns(ns_fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {namespace}")
    finally:
        os.close(ns_fd)
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


class Direction:
    def __init__(self, src: int, dst: int, delay: float, loss: float, loop: asyncio.AbstractEventLoop) -> None:
        self.src, self.dst, self.delay, self.loss, self.loop = src, dst, delay, loss, loop
        self.forwarded = self.dropped = 0
        self.late = 0.0  # summed lateness of the timer, seconds

    def readable(self) -> None:
        while True:
            try:
                packet = os.read(self.src, 65536)
            except BlockingIOError:
                return
            if random.random() < self.loss:
                self.dropped += 1
                continue
            due = self.loop.time() + self.delay
            self.loop.call_at(due, self.deliver, packet, due)

    def deliver(self, packet: bytes, due: float) -> None:
        self.late += self.loop.time() - due
        self.forwarded += 1
        try:
            os.write(self.dst, packet)
        except OSError:
            self.dropped += 1

    def report(self, name: str) -> str:
        late = self.late / self.forwarded * 1000 if self.forwarded else 0.0
        return f"{name}: {self.forwarded} forwarded, {self.dropped} dropped, timer {late:.2f} ms late on average"


async def main(ns_a: str, ns_b: str, ifname: str, delay_ms: float, loss_pct: float) -> None:
    a, b = open_tun(ns_a, ifname), open_tun(ns_b, ifname)
    loop = asyncio.get_running_loop()
    ab = Direction(a, b, delay_ms / 1000, loss_pct / 100, loop)
    ba = Direction(b, a, delay_ms / 1000, loss_pct / 100, loop)
    loop.add_reader(a, ab.readable)
    loop.add_reader(b, ba.readable)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    print(f"{ab.report(f'{ns_a} -> {ns_b}')}; {ba.report(f'{ns_b} -> {ns_a}')}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])))
