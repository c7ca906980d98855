"""Binding the daemon's own listeners: what is refused, and how a refusal reads."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import pytest

from appliance.daemon import _listening
from appliance.transport.tcp import bind_tcp, bind_unix


def test_a_live_unix_socket_is_not_taken_over_but_a_stale_one_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "api.sock"
    first = bind_unix(path, 0o660)
    try:
        with pytest.raises(OSError) as info:
            bind_unix(path, 0o660)  # a second daemon would have unlinked the first one's socket
        assert info.value.errno == errno.EADDRINUSE
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))  # the first daemon's clients still reach it
    finally:
        first.close()
    assert path.is_socket()  # left behind by a process that is gone: stale
    second = bind_unix(path, 0o660)
    second.close()


def test_a_listener_that_cannot_bind_is_named_by_its_config_key_and_address() -> None:
    taken = bind_tcp("127.0.0.1", 0)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(OSError) as info, _listening("listen.tcp", f"127.0.0.1:{port}"):
            bind_tcp("127.0.0.1", port)
    finally:
        taken.close()
    assert info.value.errno == errno.EADDRINUSE
    assert info.value.strerror == f"cannot listen on listen.tcp = '127.0.0.1:{port}': Address already in use"
