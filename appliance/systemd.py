"""systemd integration: sd_notify messages, the watchdog, socket activation and journald logging.

Everything degrades to nothing when not run by systemd (no NOTIFY_SOCKET, no LISTEN_FDS, no
JOURNAL_STREAM), so the same daemon runs by hand, in tests and under systemctl.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

SD_LISTEN_FDS_START = 3


class Notifier:
    """sd_notify(3): datagrams to $NOTIFY_SOCKET. A no-op when systemd did not start us."""

    def __init__(self, path: str | None = None) -> None:
        path = path if path is not None else os.environ.get("NOTIFY_SOCKET")
        self.address: str | bytes | None = None
        if path:
            # '@' is the abstract namespace (a leading NUL byte on the wire).
            self.address = b"\0" + path[1:].encode() if path.startswith("@") else path
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> None:
        if self.address is None:
            return
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.sendto("\n".join(fields).encode(), self.address)
        except OSError as exc:  # systemd gone or socket full: never fatal for serving
            log.warning("sd_notify failed: %s", exc)

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def extend_timeout(self, seconds: float) -> None:
        self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    def reloading(self) -> None:
        # MONOTONIC_USEC lets systemd order this reload against the SIGHUP it sent (notify-reload).
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval(env: dict[str, str] | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None when not asked.

    systemd-python 235 has no helper for this; sd_watchdog_enabled(3) is the reference:
    WATCHDOG_PID, when set, must be our pid."""
    env = dict(os.environ) if env is None else env
    usec = env.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 1_000_000 / 2


async def run_watchdog(notifier: Notifier, interval: float, healthy: Callable[[], bool]) -> None:
    """Ping while healthy() holds. The loop being able to run this task is half the check;
    healthy() (the engine's workers alive and not stuck) is the other half. A stall stops the
    pings, and systemd restarts the service after WatchdogSec."""
    warned = False
    while True:
        if healthy():
            notifier.send("WATCHDOG=1")
            warned = False
        elif not warned:
            log.error("engine stalled: withholding watchdog pings so systemd restarts the service")
            warned = True
        await asyncio.sleep(interval)


@dataclass(frozen=True)
class ActivatedSockets:
    """Sockets systemd passed us, by FileDescriptorName."""

    by_name: dict[str, socket.socket]

    def take(self, name: str) -> socket.socket | None:
        return self.by_name.get(name)


def listen_fds(env: dict[str, str] | None = None, unset: bool = True) -> ActivatedSockets:
    """sd_listen_fds_with_names(3): LISTEN_FDS / LISTEN_FDNAMES, for our pid only."""
    env_map = dict(os.environ) if env is None else env
    count, pid = env_map.get("LISTEN_FDS", ""), env_map.get("LISTEN_PID", "")
    if not count.isdigit() or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return ActivatedSockets({})
    names = env_map.get("LISTEN_FDNAMES", "").split(":")
    found: dict[str, socket.socket] = {}
    for i in range(int(count)):
        fd = SD_LISTEN_FDS_START + i
        os.set_inheritable(fd, False)
        sock = socket.socket(fileno=fd)
        name = names[i] if i < len(names) and names[i] else _guess_name(sock)
        found[name] = sock
    if unset and env is None:
        for key in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
            os.environ.pop(key, None)
    if found:
        log.info("socket activation: %s", ", ".join(f"{n} ({s.getsockname()})" for n, s in found.items()))
    return ActivatedSockets(found)


def _guess_name(sock: socket.socket) -> str:
    if sock.family == socket.AF_UNIX:
        return "unix"
    return "quic" if sock.type == socket.SOCK_DGRAM else "tcp"


class JournalFieldsFilter(logging.Filter):
    """Copies `extra={"request_id": ..., "device": ...}` into ZEROLAYER_* journal fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        for attr, field in (("request_id", "ZEROLAYER_REQUEST_ID"), ("device", "ZEROLAYER_DEVICE")):
            value = getattr(record, attr, None)
            if value is not None:
                setattr(record, field, str(value))
        return True


def configure_logging(level: str) -> None:
    """Structured journal entries under systemd (JOURNAL_STREAM set), plain stderr lines otherwise."""
    root = logging.getLogger()
    root.setLevel(level.upper())
    for h in list(root.handlers):
        root.removeHandler(h)
    handler: logging.Handler
    if os.environ.get("JOURNAL_STREAM"):
        from systemd.journal import JournalHandler  # PRIORITY comes from the record's level

        handler = JournalHandler(SYSLOG_IDENTIFIER="zerolayer")
        handler.addFilter(JournalFieldsFilter())
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
