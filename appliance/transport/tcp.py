"""HTTPS over TCP (HTTP/1.1 and HTTP/2) and plain HTTP on the Unix socket, both served in-process
by Hypercorn's serve() on sockets we bind (or systemd hands us), so the daemon knows every
listener's address before it says ready."""

from __future__ import annotations

import asyncio
import asyncio.constants
import contextlib
import errno
import logging
import os
import socket
import ssl
from pathlib import Path

from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

from appliance.api.app import tag_transport
from appliance.asgi import ASGIApp

log = logging.getLogger(__name__)
# How long a closing TLS connection waits for the client's close_notify. asyncio's default, 30 s,
# held every stop (and every expired keep-alive) for 30 s after the drain while an SDK kept an idle
# pooled connection: such a client answers only when it next uses the connection.
TLS_CLOSE_SECONDS = 2.0


def bind_tcp(host: str, port: int, backlog: int = 512) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # "::" serves IPv4 too
    sock.bind((host, port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def bind_unix(path: Path, mode: int, backlog: int = 512) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    if _answers(path):  # a live daemon's socket is not taken over: its clients would lose it
        raise OSError(errno.EADDRINUSE, "another process is serving on it")
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket from a previous run
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o777 & ~mode)  # never world-accessible, even between bind and chmod
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, mode)
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def _answers(path: Path) -> bool:
    """Whether something accepts connections on the Unix socket at `path` (not a stale file)."""
    if not path.is_socket():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def quiet_client_errors(loop: asyncio.AbstractEventLoop) -> None:
    """A client that closes its TLS session rudely (data after close_notify, no shutdown reply)
    makes the connection's closing raise in Hypercorn's connection callback, which asyncio logs as
    an ERROR with a traceback. Any client can do that at will, so it is logged at debug; every
    other unhandled exception still reaches the loop's handler."""
    previous = loop.get_exception_handler()
    if getattr(previous, "zerolayer_quiet", False):
        return

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        exc = context.get("exception")
        if str(context.get("message", "")).startswith("Unhandled exception in client_connected_cb") and isinstance(
                exc, OSError):  # ssl.SSLError, TimeoutError, ConnectionError  # fmt: skip
            log.debug("a client connection ended uncleanly: %r", exc)
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    handler.zerolayer_quiet = True  # type: ignore[attr-defined]
    loop.set_exception_handler(handler)


class _ReloadableTlsConfig(HypercornConfig):
    """Keeps the SSLContext Hypercorn builds once, so a reload can swap the certificate in it:
    SSLContext.load_cert_chain affects new handshakes only."""

    ssl_context: ssl.SSLContext | None = None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        self.ssl_context = super().create_ssl_context()
        return self.ssl_context


class HypercornListener:
    """One socket served by Hypercorn with its own transport tag."""

    def __init__(self, app: ASGIApp, sock: socket.socket, transport: str, *, certfile: Path | None = None,
                 keyfile: Path | None = None, client_ca: Path | None = None, alt_svc_port: int | None = None,
                 graceful_timeout: float = 30.0) -> None:  # fmt: skip
        self.sock = sock
        self.transport = transport
        cfg = _ReloadableTlsConfig()
        # Hypercorn closes the fd it is given; give it its own so ours stays ours.
        cfg.bind = [f"fd://{os.dup(sock.fileno())}"]
        cfg.accesslog = None
        cfg.errorlog = logging.getLogger("hypercorn.error")
        cfg.graceful_timeout = graceful_timeout
        cfg.keep_alive_timeout = 75
        cfg.h11_max_incomplete_size = 64 * 1024
        cfg.include_server_header = False
        if certfile is not None and keyfile is not None:
            cfg.certfile, cfg.keyfile = str(certfile), str(keyfile)
            cfg.alpn_protocols = ["h2", "http/1.1"]
            if client_ca is not None:
                cfg.ca_certs = str(client_ca)
                cfg.verify_mode = ssl.CERT_REQUIRED
        if alt_svc_port is not None:
            cfg.alt_svc_headers = [f'h3=":{alt_svc_port}"; ma=86400']
        self.config = cfg
        self.app = tag_transport(app, transport)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        name = self.sock.getsockname()
        return name if isinstance(name, str) else f"[{name[0]}]:{name[1]}" if ":" in name[0] else f"{name[0]}:{name[1]}"

    def reload_certificate(self, certfile: Path, keyfile: Path) -> None:
        if self.config.ssl_context is not None:
            self.config.ssl_context.load_cert_chain(str(certfile), str(keyfile))

    def start(self) -> None:
        quiet_client_errors(asyncio.get_running_loop())
        # Hypercorn opens its server with asyncio's default, which only the module constant changes.
        asyncio.constants.SSL_SHUTDOWN_TIMEOUT = min(asyncio.constants.SSL_SHUTDOWN_TIMEOUT, TLS_CLOSE_SECONDS)
        self._task = asyncio.create_task(
            serve(self.app, self.config, shutdown_trigger=self._stop.wait, mode="asgi"),  # type: ignore[arg-type]
            name=f"hypercorn-{self.transport}",
        )

    async def close(self, graceful_timeout: float | None = None) -> None:
        """Stop accepting; in-flight requests get up to graceful_timeout seconds to finish."""
        if graceful_timeout is not None:
            self.config.graceful_timeout = graceful_timeout  # Hypercorn reads it at shutdown
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.sock.close()
