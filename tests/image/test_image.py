"""The image's parts that need no Debian root: what Zerolayer puts into a root (the units enabled,
the user, /etc/zerolayer, the firmware, an empty machine-id), the mirror read from apt's sources,
the wheelhouse's requirements, and the ext4-in-GPT layout. The full build and boot is
tests/image/test_image_boot.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from appliance import layout
from appliance.config import Config, load_config
from firmware import load
from firmware.install import CURRENT, read_link
from image import disk, sources, wheels


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory, tiny_bundle_path: Path, trusted_keys: Path) -> Path:
    """An empty root (as far as Zerolayer cares: /etc, dbus's machine-id copy) after populate()."""
    root = tmp_path_factory.mktemp("root")
    (root / "etc").mkdir()
    (root / "var/lib/dbus").mkdir(parents=True)
    (root / "var/lib/dbus/machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    (root / "etc/machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    layout.populate(root, tiny_bundle_path, trusted_keys)
    return root


def test_units_are_installed_and_enabled(populated: Path) -> None:
    unit_dir = populated / "usr/lib/systemd/system"
    for unit in (*layout.UNITS, "zerolayer-tls-init.service"):
        assert (unit_dir / unit).is_file()
    etc = populated / "etc/systemd/system"
    assert os.readlink(etc / "multi-user.target.wants/zerolayer.service").endswith("/zerolayer.service")
    for sock in layout.UNITS[1:]:
        assert (etc / "sockets.target.wants" / sock).is_symlink()
    # The first-boot certificate comes before the daemon, which needs it.
    assert (etc / "zerolayer.service.requires/zerolayer-tls-init.service").is_symlink()
    assert (populated / "usr/lib/sysusers.d/zerolayer.conf").is_file()
    assert (populated / "usr/lib/tmpfiles.d/zerolayer.conf").is_file()
    assert os.readlink(populated / "usr/local/bin/zerolayer") == "/opt/zerolayer/bin/zerolayer"


def test_the_preset_file_enables_what_the_build_enabled() -> None:
    """systemd applies the presets again on the first boot: they must enable the same units."""
    preset = (layout.IMAGE_FILES / "usr/lib/systemd/system-preset/80-zerolayer.preset").read_text()
    enabled = {line.split()[1] for line in preset.splitlines() if line.startswith("enable ")}
    assert set(layout.ENABLED) <= enabled
    assert "disable apt-daily.timer" in preset  # nothing is downloaded on the box


def test_user_config_and_keys(populated: Path, trusted_keys: Path) -> None:
    gid = layout.group_id(populated, "zerolayer")
    etc = populated / "etc/zerolayer"
    for d in (etc, etc / "tls", etc / "trusted-keys", etc / "conf.d"):
        assert (d.stat().st_mode & 0o777, d.stat().st_gid) == (0o750, gid)
    keys = etc / "api-keys"
    assert (keys.stat().st_mode & 0o777, keys.stat().st_gid) == (0o640, gid)
    installed = sorted(p.name for p in (etc / "trusted-keys").iterdir())
    assert installed == sorted(p.name for p in trusted_keys.glob("*.pub"))
    # Every key commented out at its default: the box runs on the defaults, and the file says them.
    config = load_config(etc, check_paths=False)
    assert {k: v for k, v in vars(config).items() if k != "sources"} == {
        k: v for k, v in vars(Config()).items() if k != "sources"}  # fmt: skip
    assert "#max_body_bytes = 1048576" in (etc / "zerolayer.toml").read_text()


def test_firmware_is_current_and_verifies_with_the_boxs_keys(populated: Path) -> None:
    store = populated / layout.STORE
    current = read_link(store, CURRENT)
    assert current is not None and current.startswith("tiny-llama-0.1.0-")
    bundle = load(store / CURRENT, populated / "etc/zerolayer/trusted-keys")
    assert bundle.name == "tiny-llama"


def test_machine_id_is_left_empty(populated: Path) -> None:
    assert (populated / "etc/machine-id").read_text() == ""
    assert not (populated / "var/lib/dbus/machine-id").exists()


def test_the_first_boot_units_verify(populated: Path, tmp_path: Path) -> None:
    """systemd-analyze verify against the host's own units, our new unit and drop-in in place."""
    host_units = next(d for d in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))
                      if (d / "sysinit.target").exists())  # fmt: skip
    root = tmp_path / "root"
    shutil.copytree(host_units, root / "usr/lib/systemd/system", symlinks=True)
    shutil.copytree(layout.IMAGE_FILES, root, dirs_exist_ok=True)
    for name in layout.UNITS:
        shutil.copy(layout.SYSTEMD_SRC / name, root / "usr/lib/systemd/system" / name)
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    (root / "bin").symlink_to("usr/bin")
    for program in ("opt/zerolayer/bin/zerolayer", "usr/bin/chgrp", "usr/bin/chmod", "usr/bin/kill"):
        (root / program).parent.mkdir(parents=True, exist_ok=True)
        (root / program).write_text("#!/bin/sh\n")
        (root / program).chmod(0o755)
    result = subprocess.run(["systemd-analyze", "verify", f"--root={root}", "--man=no", "zerolayer-tls-init.service"],
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0 and result.stderr == "", result.stderr


ONE_LINE = """\
# a comment
deb http://mirror.example.invalid/debian bookworm main contrib
deb [arch=amd64 signed-by=/k.gpg] http://security.example.invalid/debian-security bookworm-security main
deb-src http://mirror.example.invalid/debian bookworm main
"""
DEB822 = """\
Types: deb
URIs: http://disabled.example.invalid/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb deb-src
# a comment inside a stanza
URIs: http://mirror.example.invalid/debian/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example.invalid/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_one_line_sources() -> None:
    found = sources.parse_one_line(ONE_LINE)
    assert [s.uri for s in found] == ["http://mirror.example.invalid/debian",
                                      "http://security.example.invalid/debian-security"]  # fmt: skip
    assert sources.debian_mirror(found, "bookworm") == "http://mirror.example.invalid/debian"


def test_mirror_from_deb822_sources_skips_disabled_and_security() -> None:
    found = sources.parse_deb822(DEB822)
    assert sources.debian_mirror(found, "bookworm") == "http://mirror.example.invalid/debian"
    with pytest.raises(LookupError, match="--mirror"):
        sources.debian_mirror(found, "trixie")


def test_mirror_from_this_machine() -> None:
    """The machine the tests run on builds images: its sources must name a bookworm mirror."""
    assert sources.debian_mirror(sources.read_sources(), "bookworm").startswith(("http://", "https://", "file:"))


def test_wheelhouse_takes_runtime_dependencies_only() -> None:
    reqs = " ".join(wheels.runtime_requirements())
    for needed in ("onnxruntime", "aioquic", "hypercorn", "cryptography", "onnx>="):
        assert needed in reqs
    for build_or_test in ("torch", "transformers", "pytest", "systemd-python", "onnxruntime-genai",
                          "onnxruntime-gpu"):  # one ONNX Runtime: the CPU build (the cpu extra)
        assert build_or_test not in reqs
    assert wheels.to_install() == ["zerolayer[cpu]"]
    platforms = wheels.platform_args("arm64")[1::2]
    assert "manylinux_2_36_aarch64" in platforms and "manylinux2014_aarch64" in platforms


def test_disk_layout_arithmetic() -> None:
    assert disk.fs_size(100 * disk.MIB) == 381 * disk.MIB  # 125 MiB + 256 MiB spare
    plan = disk.layout(64 * disk.MIB, "amd64")
    root = plan.root
    assert (root.offset, root.first_lba, plan.disk_bytes) == (disk.MIB, 2048, 66 * disk.MIB)
    assert (root.last_lba + 1) * disk.SECTOR == root.offset + 64 * disk.MIB
    with pytest.raises(ValueError):
        disk.layout(disk.MIB + 1, "amd64")


def test_ext4_lands_in_the_gpt_partition(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc/hello").write_text("zerolayer\n")
    fs, img = tmp_path / "root.ext4", tmp_path / "disk.img"
    disk.make_ext4(tree, fs, 8 * disk.MIB)
    plan = disk.make_gpt(fs, img, "arm64")
    table = subprocess.run(["sgdisk", "--info=1", str(img)], capture_output=True, text=True, check=True).stdout
    assert disk.ROOT_TYPES["arm64"] in table and "First sector: 2048" in table and disk.LABEL in table
    with img.open("rb") as f:
        f.seek(plan.root.offset)
        assert f.read(fs.stat().st_size) == fs.read_bytes()
    listing = subprocess.run(["debugfs", "-R", "cat /etc/hello", str(fs)], capture_output=True, text=True, check=True)
    assert listing.stdout == "zerolayer\n"
