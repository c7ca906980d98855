"""`zerolayer serve` as its own process, and what systemd would see of it on $NOTIFY_SOCKET."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

# Root with every capability dropped: bpf() and the tc attach are refused, yet the process can still
# read a checkout in a root-only folder (CI clones into one), which uid 65534 could not.
UNPRIVILEGED = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]


class NotifySocket:
    """What systemd would see: datagrams on $NOTIFY_SOCKET, timestamped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []

    def wait_for(self, field: str, timeout: float = 120.0) -> float:
        deadline = time.monotonic() + timeout
        seen = len(self.messages)
        while time.monotonic() < deadline:
            for t, m in self.messages[seen:]:
                if field in m.split("\n"):
                    return t
            seen = len(self.messages)
            self.drain_once()
        raise AssertionError(f"no {field} within {timeout} s; saw {[m for _, m in self.messages]}")

    def drain_once(self) -> None:
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            return
        self.messages.append((time.monotonic(), data.decode()))

    def drain_pending(self) -> None:
        """Read what already waits in the socket's buffer, without waiting for more."""
        self.sock.setblocking(False)
        try:
            while True:
                try:
                    data = self.sock.recv(4096)
                except BlockingIOError:
                    return
                self.messages.append((time.monotonic(), data.decode()))
        finally:
            self.sock.settimeout(0.1)

    def collect(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.drain_once()

    def fields(self) -> list[str]:
        return [f for _, m in self.messages for f in m.split("\n")]


@contextlib.contextmanager
def daemon_process(root: Path, notify: NotifySocket, extra_env: dict[str, str] | None = None,
                   argv_prefix: list[str] | None = None, log: Path | None = None,
                   ) -> Iterator[subprocess.Popen[str]]:  # fmt: skip
    """The daemon on the config root; its output piped, or written to `log` (for tests that read
    it afterwards, and so that a chatty run never fills the pipe). `argv_prefix` runs it under
    another command (setpriv, nsenter, systemd-socket-activate)."""
    env = {**os.environ, "NOTIFY_SOCKET": str(notify.path), **(extra_env or {})}
    cmd = [*(argv_prefix or []), sys.executable, "-m", "appliance.cli", "serve", "--config", str(root)]
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(log.open("w")) if log is not None else subprocess.PIPE
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
