"""A small client for the operator's commands (`zerolayer debug`, `zerolayer status`): the
Unix socket through the standard library, HTTP/3 through niquests."""

from __future__ import annotations

import http.client
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

DEFAULT_SOCKET = "/run/zerolayer/api.sock"


def find_socket(explicit: str | None) -> str:
    """The daemon's socket: the one asked for, else $ZEROLAYER_SOCKET, else the system daemon's,
    else the development daemon `make run` starts (it lives under the build cache)."""
    if explicit:
        return explicit
    from_env = os.environ.get("ZEROLAYER_SOCKET")
    if from_env:
        return from_env
    if os.path.exists(DEFAULT_SOCKET):
        return DEFAULT_SOCKET
    from firmware.toolchain.paths import cache_dir

    dev = cache_dir() / "demo-appliance" / "api.sock"
    return str(dev) if dev.exists() else DEFAULT_SOCKET


class DaemonUnreachable(OSError):
    """No daemon answers where the client looked: one line for the user, no traceback."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        try:
            self.sock.connect(self.path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            why = (exc.strerror or str(exc)).lower()
            raise DaemonUnreachable(f"no daemon answers on {self.path} ({why}): start it (`make run`, or "
                                    "`systemctl start zerolayer`) or pass --socket PATH") from None


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    lines: Iterator[str]


class ApplianceClient:
    def __init__(self, socket_path: str = DEFAULT_SOCKET, url: str | None = None, api_key: str | None = None,
                 ca: str | None = None, timeout: float = 300.0) -> None:  # fmt: skip
        self.socket_path, self.url, self.api_key, self.ca, self.timeout = socket_path, url, api_key, ca, timeout

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None) -> Reply:  # fmt: skip
        hdrs = {"content-type": "application/json", **(headers or {})}
        if self.api_key:
            hdrs["x-api-key"] = self.api_key
        data = json.dumps(body).encode() if body is not None else None
        if self.url is None:
            conn = _UnixConnection(self.socket_path, self.timeout)
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            lines = (raw.decode().rstrip("\r\n") for raw in iter(resp.readline, b""))
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, lines)
        import niquests

        session = niquests.Session(disable_http1=True, disable_http2=True)  # HTTP/3 only
        r = session.request(method, self.url.rstrip("/") + path, data=data, headers=hdrs, stream=True,
                            verify=self.ca or True, timeout=self.timeout)  # fmt: skip
        text_lines = (ln.decode() if isinstance(ln, bytes) else ln for ln in r.iter_lines())
        return Reply(int(r.status_code or 0), {k.lower(): v for k, v in r.headers.items()}, text_lines)

    def get_json(self, path: str) -> tuple[int, Any]:
        reply = self.request("GET", path)
        return reply.status, json.loads("\n".join(reply.lines) or "null")
