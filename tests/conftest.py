"""Shared fixtures: the tiny bundle (every engine test), the demo bundle (a few end-to-end tests),
both built once per machine and cached; copies for tests that tamper with them."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from battery import CASES
from clients import serve
from daemon_thread import RunningDaemon
from netns import NetPair, net_pair

from appliance.devsetup import DevSetup
from appliance.kernel.loader import PIN_ROOT
from firmware.toolchain.devkit import dev_trusted_keys, ensure_dev_key


@pytest.fixture(scope="session")
def trusted_keys() -> Path:
    return dev_trusted_keys()


@pytest.fixture(scope="session")
def dev_key() -> Path:
    return ensure_dev_key()


@pytest.fixture(scope="session")
def tiny_bundle_path() -> Path:
    from firmware.toolchain.tiny import tiny_bundle

    return tiny_bundle()


@pytest.fixture(scope="session")
def tiny_hf_path() -> Path:
    from firmware.toolchain.tiny import tiny_hf_dir

    return tiny_hf_dir()


@pytest.fixture(scope="session")
def demo_bundle_path() -> Path:
    from firmware.toolchain.demo import demo_bundle

    return demo_bundle()


@pytest.fixture(scope="module")
def demo(demo_bundle_path: Path, trusted_keys: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[RunningDaemon, DevSetup]]:  # fmt: skip
    """A daemon serving the demo firmware, for one test module."""
    running, setup = serve(tmp_path_factory.mktemp("demo"), demo_bundle_path, trusted_keys)
    yield running, setup
    running.stop()


@pytest.fixture(scope="module")
def tiny(tiny_bundle_path: Path, trusted_keys: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[RunningDaemon, DevSetup]]:  # fmt: skip
    """A daemon serving the tiny firmware (a 64 KiB body limit, 1 s for a QUIC handshake), for one
    test module."""
    running, setup = serve(tmp_path_factory.mktemp("tiny"), tiny_bundle_path, trusted_keys,
                           extra="[limits]\nmax_body_bytes = 65536\nquic_handshake_timeout = 1.0\n")  # fmt: skip
    yield running, setup
    running.stop()


@pytest.fixture(scope="module")
def work(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A folder under /var/tmp for a module that builds a Debian root (gigabytes, device nodes):
    removed at the end rather than kept as pytest keeps its temporary folders."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=f"zerolayer-{request.module.__name__}-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
def tiny_copy(tiny_bundle_path: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny bundle to tamper with."""
    dest = tmp_path / "bundle"
    shutil.copytree(tiny_bundle_path, dest)
    return dest



@pytest.fixture
def netpair() -> Iterator[NetPair]:
    """Server and client network namespaces joined by a veth pair (tests/netns.py)."""
    with net_pair() as pair:
        yield pair


@pytest.fixture
def pins() -> Iterator[None]:
    """No pinned kernel-layer state before the test, none after (the daemon's own pin root)."""
    shutil.rmtree(PIN_ROOT, ignore_errors=True)
    yield
    shutil.rmtree(PIN_ROOT, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The bad-input battery's summary: cases tried per group (a failure fails its test)."""
    if CASES:
        terminalreporter.write_sep("-", "bad-input battery")
        for group, count in sorted(CASES.items()):
            terminalreporter.write_line(f"{group}: {count} cases")
        failed = len(terminalreporter.stats.get("failed", []))
        terminalreporter.write_line(f"{sum(CASES.values())} cases in {len(CASES)} groups; failed tests: {failed}")
