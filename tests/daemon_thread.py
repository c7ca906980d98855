"""A real daemon on real sockets, on its own event loop in a thread of the test process, so that
synchronous official clients can call it and a test can reach its parts (bench/kernel.py uses it
too: it flips the live daemon's tc programs between rounds)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from appliance.config import load_config
from appliance.daemon import Daemon
from appliance.systemd import Notifier

T = TypeVar("T")


class RunningDaemon:
    """The daemon of a config root, started in a thread; stop() drains and ends it."""

    def __init__(self, config_root: Path, notifier: Notifier | None = None) -> None:
        # The daemon sets up the process's logging as a daemon process would (root level and
        # handler); put it back on stop, or every later test runs with its INFO logging: aioquic's
        # per-packet records then slow the HTTP/3 tests enough to change what they see.
        root = logging.getLogger()
        self._logging = (root.level, list(root.handlers))
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
        root = logging.getLogger()
        level, handlers = self._logging
        root.setLevel(level)
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)

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
