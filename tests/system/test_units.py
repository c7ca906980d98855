"""The systemd files under systemd/: the units load in systemd without a single complaint, the
service's hardening keeps `systemd-analyze security` at or under MAX_EXPOSURE, the sockets pass
the descriptor names the daemon looks for, and sysusers.d/tmpfiles.d create the user and the
directories the units rely on. Everything runs against a throwaway root: nothing is installed."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from appliance.layout import group_id

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"
SERVICE = "zerolayer.service"
SOCKETS = ("zerolayer-quic.socket", "zerolayer-tcp.socket", "zerolayer-unix.socket")
UNITS = (SERVICE, *SOCKETS)
# The names the daemon looks up in LISTEN_FDNAMES, per socket unit.
FD_NAMES = {"zerolayer-quic.socket": "quic", "zerolayer-tcp.socket": "tcp", "zerolayer-unix.socket": "unix"}
MAX_EXPOSURE = 2.5
# Where the host keeps systemd's own units (sysinit.target, sockets.target, ...), which every
# unit depends on by default; the first that exists is copied into the throwaway root.
HOST_UNIT_DIRS = (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))


def test_systemd_tools_are_installed() -> None:
    """scripts/setup.sh installs them; their absence is a broken set-up, not a reason to skip."""
    missing = [t for t in ("systemd-analyze", "systemd-sysusers", "systemd-tmpfiles") if shutil.which(t) is None]
    assert not missing, f"missing {missing}: apt-get install systemd"


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "cat", "LC_ALL": "C.UTF-8"}
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, timeout=60, check=False)


def directives(unit: str) -> list[tuple[str, str, str]]:
    """(section, key, value) for every assignment in one of our unit files, in order."""
    section = ""
    found = []
    for raw in (SYSTEMD_DIR / unit).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.append((section, key.strip(), value.strip()))
    return found


def executables(unit: str) -> set[str]:
    """The absolute paths of the programs a unit's Exec*= lines run (prefixes like -, +, @ off)."""
    paths = set()
    for _, key, value in directives(unit):
        if key.startswith("Exec") and value:
            paths.add(value.split()[0].lstrip("-+!@:"))
    return paths


@pytest.fixture
def unit_root(tmp_path: Path) -> Path:
    """A root with systemd's own units, ours installed where the README puts them, and an
    empty executable at every path our units run, so that `verify --root` checks our files and
    nothing about this machine (no /opt/zerolayer here)."""
    host_units = next((d for d in HOST_UNIT_DIRS if (d / "sysinit.target").exists()), None)
    assert host_units is not None, "systemd's own units (sysinit.target) are not installed: apt-get install systemd"
    root = tmp_path / "root"
    unit_dir = root / "usr/lib/systemd/system"
    shutil.copytree(host_units, unit_dir, symlinks=True)
    for name in UNITS:
        shutil.copy(SYSTEMD_DIR / name, unit_dir / name)
    # Merged /usr, as on Debian 12: /bin/kill is /usr/bin/kill.
    (root / "usr/bin").mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")
    for unit in UNITS:
        for program in executables(unit):
            path = root / program.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("#!/bin/sh\n")
            path.chmod(0o755)
    return root


def verify(root: Path, *units: str) -> subprocess.CompletedProcess[str]:
    return run("systemd-analyze", "verify", f"--root={root}", "--man=no", *units)


def test_units_verify_without_a_word(unit_root: Path) -> None:
    """`verify` exits 0 even on unknown keys, so any stderr at all is a failure."""
    result = verify(unit_root, *UNITS)
    assert result.stderr == ""
    assert result.returncode == 0


def _unknown_key(text: str) -> str:
    return text.replace("[Service]\n", "[Service]\nFrobnicate=yes\n", 1)


def _bad_value(text: str) -> str:
    return text.replace("ProtectSystem=strict\n", "ProtectSystem=strikt\n", 1)


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [(_unknown_key, "Unknown key 'Frobnicate'"), (_bad_value, "strikt"), (None, "zerolayer-tcp.socket not found")],
    ids=["unknown-key", "bad-value", "missing-socket"],
)
def test_verify_catches_a_broken_service(unit_root: Path, breakage: Callable[[str], str] | None, expected: str) -> None:
    """The check above can fail: a broken copy of the service does produce stderr."""
    unit_dir = unit_root / "usr/lib/systemd/system"
    if breakage is None:
        (unit_dir / "zerolayer-tcp.socket").unlink()
    else:
        path = unit_dir / SERVICE
        broken = breakage(path.read_text())
        assert broken != path.read_text()
        path.write_text(broken)
    result = verify(unit_root, SERVICE)
    assert expected in result.stderr


def exposure(unit_file: Path) -> float:
    result = run("systemd-analyze", "security", "--offline=yes", "--no-pager", unit_file)
    match = re.search(rf"Overall exposure level for {re.escape(unit_file.name)}: (\d+(?:\.\d+)?)", result.stdout)
    assert match, result.stdout + result.stderr
    return float(match.group(1))


def test_service_exposure_is_low() -> None:
    score = exposure(SYSTEMD_DIR / SERVICE)
    print(f"\n{SERVICE}: systemd-analyze security exposure {score} (limit {MAX_EXPOSURE})")
    assert score <= MAX_EXPOSURE


def test_exposure_rises_without_the_hardening(tmp_path: Path) -> None:
    """The score is read from the right line: dropping hardening raises it."""
    weakened = tmp_path / SERVICE
    kept = [
        line
        for line in (SYSTEMD_DIR / SERVICE).read_text().splitlines()
        if not line.startswith(("ProtectSystem=", "SystemCallFilter=", "CapabilityBoundingSet=", "IPAddressDeny="))
    ]
    weakened.write_text("\n".join(kept) + "\n")
    assert exposure(weakened) > exposure(SYSTEMD_DIR / SERVICE)


def test_each_socket_passes_its_own_descriptor_name() -> None:
    """FileDescriptorName= names every descriptor of a unit alike, hence one unit per socket;
    the service takes all three, and each activates the service."""
    service = {key: value for section, key, value in directives(SERVICE) if section == "Service"}
    assert service["Sockets"].split() == list(SOCKETS)
    for unit, name in FD_NAMES.items():
        socket = {key: value for section, key, value in directives(unit) if section == "Socket"}
        assert socket["FileDescriptorName"] == name
        assert socket["Service"] == SERVICE
    unix = {key: value for section, key, value in directives("zerolayer-unix.socket") if section == "Socket"}
    assert unix["ListenStream"] == "/run/zerolayer/api.sock"
    assert (unix["SocketUser"], unix["SocketGroup"], unix["SocketMode"]) == ("zerolayer", "zerolayer", "0660")


def passwd_entry(root: Path, name: str) -> list[str]:
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return fields
    raise AssertionError(f"no user {name} in {root / 'etc/passwd'}")


def test_sysusers_creates_the_user(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    result = run("systemd-sysusers", f"--root={tmp_path}", SYSTEMD_DIR / "sysusers.d/zerolayer.conf")
    assert result.returncode == 0, result.stderr
    _, _, uid, gid, _, home, shell = passwd_entry(tmp_path, "zerolayer")
    assert home == "/var/lib/zerolayer"
    assert shell.endswith("nologin")
    assert int(uid) < 1000  # a system user
    assert int(gid) == group_id(tmp_path, "zerolayer")


@pytest.mark.skipif(os.geteuid() != 0, reason="systemd-tmpfiles must be root to give directories to zerolayer")
def test_tmpfiles_creates_the_directories(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    assert run("systemd-sysusers", f"--root={tmp_path}", SYSTEMD_DIR / "sysusers.d/zerolayer.conf").returncode == 0
    # bpffs as systemd mounts it: root only.
    (tmp_path / "sys/fs/bpf").mkdir(parents=True)
    (tmp_path / "sys/fs/bpf").chmod(0o700)
    result = run("systemd-tmpfiles", f"--root={tmp_path}", "--create", SYSTEMD_DIR / "tmpfiles.d/zerolayer.conf")
    assert result.stderr == ""
    assert result.returncode == 0
    uid = int(passwd_entry(tmp_path, "zerolayer")[2])
    gid = group_id(tmp_path, "zerolayer")
    expected = {
        "etc/zerolayer": (0o750, 0, gid),
        "etc/zerolayer/tls": (0o750, 0, gid),
        "var/lib/zerolayer": (0o750, uid, gid),
        "run/zerolayer": (0o750, uid, gid),
        "sys/fs/bpf": (0o700, 0, 0),  # left as systemd mounts it
        "sys/fs/bpf/zerolayer": (0o700, uid, gid),
        "run/zerolayer/bpf": (0o700, uid, gid),
    }
    for path, (mode, owner, group) in expected.items():
        st = (tmp_path / path).stat()
        assert stat.S_ISDIR(st.st_mode), path
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (mode, owner, group), path
