"""A complete development appliance in one folder: config, dev TLS certificate, an API key.

`make run` serves the demo firmware with it, and the tests start daemons with it; nothing here
is used on a real appliance, where /etc/zerolayer is written by the image build and the operator.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from appliance.api.auth import add_key
from appliance.config import load_config
from appliance.daemon import Daemon
from appliance.systemd import Notifier
from appliance.tls import DEV_HOSTS, make_dev_cert

T = TypeVar("T")


@dataclass(frozen=True)
class DevSetup:
    root: Path  # the config root (zerolayer.toml inside)
    api_key: str
    ca_cert: Path
    unix_socket: Path


def write_dev_config(root: Path, firmware_path: Path, trusted_keys: Path, *, tcp: str = "127.0.0.1:0",
                     quic: str = "127.0.0.1:0", extra: str = "", kernel: str = "off",
                     cert_hosts: Sequence[str] = DEV_HOSTS) -> DevSetup:  # fmt: skip
    """Write (or reuse) a config root; the API key is kept beside it (0600) so it can be shown again.
    The certificate, made on first use, names `cert_hosts` (the addresses clients will dial)."""
    root.mkdir(parents=True, exist_ok=True)
    tls_dir = root / "tls"
    if not (tls_dir / "server.crt").is_file():
        make_dev_cert(tls_dir, cert_hosts)
    key_file = root / "api-keys"
    plain = root / "dev-api-key"
    if not plain.is_file():
        key_file.unlink(missing_ok=True)
        key = add_key(key_file, "dev", debug=True)
        fd = os.open(plain, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
    sock = root / "api.sock"
    (root / "zerolayer.toml").write_text(f"""\
# Development appliance (written by appliance.devsetup); a real one lives in /etc/zerolayer.
[firmware]
path = "{firmware_path}"
trusted_keys = "{trusted_keys}"

[listen]
quic = "{quic}"
tcp = "{tcp}"
unix = "{sock}"

[tls]
cert = "{tls_dir / 'server.crt'}"
key = "{tls_dir / 'server.key'}"

[auth]
keys_file = "{key_file}"

[state]
dir = "{root / 'state'}"

[kernel]
mode = "{kernel}"
{extra}""")
    return DevSetup(root, plain.read_text().strip(), tls_dir / "ca.crt", sock)


class RunningDaemon:
    """A real daemon on real sockets, on its own event loop in a thread, so that synchronous
    official clients can call it from the test."""

    def __init__(self, config_root: Path, notifier: Notifier | None = None) -> None:
        self.daemon = Daemon(load_config(config_root), notifier=notifier, config_root=config_root)
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.daemon.start())
        except BaseException as exc:  # surfaced in start()
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self.loop.run_forever()

    def start(self) -> RunningDaemon:
        self._thread.start()
        self._started.wait(300)
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.daemon.stop(drain_timeout=1), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)

    def call(self, fn: Callable[[], T]) -> T:
        """Run fn on the daemon's loop (as its signal handlers do) and return its result."""

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(60)

    def port(self, name: str) -> int:
        ls = self.daemon.listeners
        if name == "http3":
            assert ls.http3 is not None
            return ls.http3.port
        listener = ls.tcp if name == "tcp" else None
        assert listener is not None
        return int(listener.sock.getsockname()[1])
