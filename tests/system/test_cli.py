"""The operator's commands without a daemon, and where they look for one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.client import DEFAULT_SOCKET, find_socket


@pytest.mark.parametrize("command", [["status"], ["debug", "messages.create", "--prompt", "hi"]])
def test_no_daemon_is_one_line_and_no_traceback(command: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "ZEROLAYER_SOCKET": str(tmp_path / "api.sock")}
    result = subprocess.run([sys.executable, "-m", "appliance.cli", *command], capture_output=True, text=True,
                            env=env, timeout=60)  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert f"no daemon answers on {tmp_path / 'api.sock'}" in result.stderr and "--socket" in result.stderr


def test_the_socket_is_the_one_asked_for_then_the_environment_then_the_development_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZEROLAYER_CACHE", str(tmp_path))
    monkeypatch.delenv("ZEROLAYER_SOCKET", raising=False)
    assert find_socket("/x/api.sock") == "/x/api.sock"
    if not os.path.exists(DEFAULT_SOCKET):  # a system daemon on this machine would come first
        assert find_socket(None) == DEFAULT_SOCKET  # nothing anywhere: the system path, named in the error
        dev = tmp_path / "demo-appliance" / "api.sock"
        dev.parent.mkdir()
        dev.touch()
        assert find_socket(None) == str(dev)
    monkeypatch.setenv("ZEROLAYER_SOCKET", "/y/api.sock")
    assert find_socket(None) == "/y/api.sock"
