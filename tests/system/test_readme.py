"""The README's Architecture map names every module the packages ship, so it cannot drift."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _named_in_map() -> set[str]:
    """Paths the map's first column names: `dir/a.py`, `b.py` means dir/a.py and dir/b.py; `dir/` all of dir."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    for row in section.splitlines():
        if not row.startswith("| `"):
            continue
        names = re.findall(r"`([^`]+)`", row.split("|")[1])
        folder = str(Path(names[0]).parent)
        for name in names:
            named.add(name if "/" in name else f"{folder}/{name}")
    return named


def test_the_architecture_map_names_every_module() -> None:
    named = _named_in_map()
    missing = []
    for package in ("appliance", "firmware", "image"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if path.name == "__init__.py" or "__pycache__" in rel:
                continue
            if rel not in named and not any(n.endswith("/") and rel.startswith(n) for n in named):
                missing.append(rel)
    assert not missing, f"README Architecture map lacks: {', '.join(missing)}"


# --- every example in the README, run as written against a daemon like `make run`'s ------------

README = REPO / "README.md"
EXPECT = "# -> "  # an example's comment that says what it prints: it must appear in the output
DEMO_PORT = 8443  # what the examples dial; the test daemon's port is put in its place
# Shell examples run here are the ones that talk to the daemon (the make, firmware and image
# commands are the suite itself, tests/firmware/test_firmware.py and tests/image/test_image*.py).
CALLS_DAEMON = ("curl ", "zerolayer debug", "zerolayer status")


def _examples() -> list[tuple[str, str]]:
    blocks = re.findall(r"```(python|sh)\n(.*?)```", README.read_text(), re.S)
    return [(lang, code) for lang, code in blocks if lang == "python" or any(c in code for c in CALLS_DAEMON)]


def _expected(code: str) -> list[str]:
    return [line.split(EXPECT, 1)[1].rstrip() for line in code.splitlines() if EXPECT in line]


def _free_port() -> int:
    """A port free on both TCP and UDP: the daemon serves HTTPS and HTTP/3 on one port, as on 8443."""
    import socket

    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind(("127.0.0.1", 0))
            port = int(tcp.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind(("127.0.0.1", port))
                except OSError:
                    continue
        return port


@pytest.mark.demo
def test_every_readme_example_runs_as_written_and_prints_what_it_says(
        demo_bundle_path: Path, trusted_keys: Path, tmp_path: Path) -> None:  # fmt: skip
    import contextlib
    import io
    import os
    import subprocess
    import sys

    from daemon_thread import RunningDaemon

    from appliance.devsetup import write_dev_config

    port = _free_port()
    setup = write_dev_config(tmp_path / "appliance", demo_bundle_path, trusted_keys, tcp=f"127.0.0.1:{port}",
                             quic=f"127.0.0.1:{port}")  # fmt: skip
    running = RunningDaemon(setup.root).start()
    env = {**os.environ, "KEY": setup.api_key, "CA": str(setup.ca_cert), "SOCK": str(setup.unix_socket),
           "ZEROLAYER_CONFIG": str(setup.root), "ZEROLAYER_SOCKET": str(setup.unix_socket),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # what `make run` says to export
    names: dict[str, object] = {"KEY": setup.api_key, "CA": str(setup.ca_cert), "SOCK": str(setup.unix_socket)}
    examples = _examples()
    try:
        for lang, code in examples:
            code = code.replace(f"localhost:{DEMO_PORT}", f"localhost:{port}")
            if lang == "python":  # one namespace, in README order: later examples use earlier clients
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    exec(compile(code, "README.md example", "exec"), names)
                printed = out.getvalue()
            else:
                done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], env=env, capture_output=True,
                                      text=True, timeout=120, check=False)  # fmt: skip
                assert done.returncode == 0, (code, done.stdout[-2000:], done.stderr[-2000:])
                printed = done.stdout
                assert "Traceback" not in done.stderr, done.stderr
            for expected in _expected(code):
                assert expected in printed, (expected, printed[-2000:])
            if lang == "sh" or "print(" in code:
                assert printed.strip(), code  # an example that shows something shows it
    finally:
        running.stop()
    assert sum(lang == "python" for lang, _ in examples) >= 7 and len(examples) >= 9  # none lost to a typo


@pytest.mark.demo
def test_the_firmware_example_builds_signs_and_verifies_a_bundle(tmp_path: Path) -> None:
    """The README's firmware commands, as written, in an empty folder where `model.gguf` is the
    demo's GGUF file (what a user would have downloaded)."""
    import os
    import subprocess
    import sys

    from firmware.toolchain.demo import demo_gguf

    (block,) = [code for lang, code in re.findall(r"```(sh)\n(.*?)```", README.read_text(), re.S)
                if "zerolayer firmware keygen" in code]  # fmt: skip
    (tmp_path / "model.gguf").symlink_to(demo_gguf())
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    assert "OK: model 1.0.0, 6 files, signed by key" in done.stdout, done.stdout  # the bundle verifies
    assert "(verified against the trusted keys)" in done.stdout  # and inspect agrees
    assert (tmp_path / "keys" / "signing.key").stat().st_mode & 0o777 == 0o600
