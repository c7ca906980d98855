"""What Zerolayer adds to a Debian root: the units (installed and enabled), the sysusers and
tmpfiles entries, /etc/zerolayer with its defaults, the trusted keys, the firmware, an empty
machine-id. Plain file operations plus the host's own `systemd-sysusers --root` and
`systemctl --root`, so it runs on any root folder, a debootstrap tree or a test's empty one."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from appliance.config import Config, toml_value, walk
from firmware.bundle import verify
from firmware.install import install
from firmware.signing import load_trusted_keys

# The source checkout the units and image files come from: this package's own, or the one
# scripts/install.sh runs from (an installed wheel holds neither).
REPO = Path(os.environ.get("ZEROLAYER_SOURCE") or Path(__file__).resolve().parents[1])
SYSTEMD_SRC = REPO / "systemd"
IMAGE_FILES = REPO / "image" / "files"  # copied into the root as they are
TLS_INIT = IMAGE_FILES / "usr/lib/systemd/system/zerolayer-tls-init.service"  # a certificate on first start
UNITS = ("zerolayer.service", "zerolayer-quic.socket", "zerolayer-tcp.socket", "zerolayer-unix.socket")
# Enabled from the preset file in image/files (what the first boot's preset-all applies too).
ENABLED = (*UNITS, "zerolayer-tls-init.service")
VENV = "/opt/zerolayer"
STORE = "usr/lib/zerolayer/firmware"
IMAGE_INFO = "usr/lib/zerolayer/image.json"  # an image's version and whether it trusts development keys


@dataclass(frozen=True)
class Installed:
    """What went into the root, for the image manifest."""

    firmware_dir: str
    firmware_name: str
    firmware_version: str
    firmware_signer: str
    trusted_key_ids: tuple[str, ...]


def check_sources() -> None:
    if not (SYSTEMD_SRC / "zerolayer.service").is_file() or not IMAGE_FILES.is_dir():
        raise FileNotFoundError(f"{SYSTEMD_SRC} or {IMAGE_FILES} is missing: the image is built from a source "
                                "checkout of Zerolayer (make image, or `zerolayer image build` in one)")


def install_appliance(root: Path, firmware: Path, trusted_keys: Path) -> Installed:
    """What the daemon needs on any Debian root, an image's or a running host's: the units (with
    the first-start certificate), the user, /etc/zerolayer (its config kept if there is one), the
    API-key file, the trusted keys, the firmware and the `zerolayer` command on PATH."""
    check_sources()
    manifest, signer = verify(firmware, trusted_keys)  # a bundle the box would refuse fails here
    install_units(root)
    tls_init = root / "usr/lib/systemd/system" / TLS_INIT.name
    shutil.copy(TLS_INIT, tls_init)
    tls_init.chmod(0o644)
    _run("systemd-sysusers", f"--root={root}", root / "usr/lib/sysusers.d/zerolayer.conf")
    gid = group_id(root, "zerolayer")
    etc = root / "etc/zerolayer"
    # As tmpfiles.d/zerolayer.conf makes them at boot: root writes, group zerolayer reads.
    for d in (etc, etc / "conf.d", etc / "trusted-keys", etc / "tls"):
        d.mkdir(parents=True, exist_ok=True)
        os.chown(d, 0, gid)
        d.chmod(0o750)
    if not (etc / "zerolayer.toml").exists():
        (etc / "zerolayer.toml").write_text(default_config_text())
    # `zerolayer keys add` appends to this file and keeps its mode, so the daemon can read keys added later.
    keys = etc / "api-keys"
    keys.touch()
    os.chown(keys, 0, gid)
    keys.chmod(0o640)
    for pub in sorted(Path(trusted_keys).glob("*.pub")):
        shutil.copy(pub, etc / "trusted-keys" / pub.name)
        (etc / "trusted-keys" / pub.name).chmod(0o644)
    switched = install(firmware, trusted_keys, lambda: "install: the daemon is (re)started after", root / STORE)
    local_bin = root / "usr/local/bin"
    local_bin.mkdir(parents=True, exist_ok=True)
    (local_bin / "zerolayer").unlink(missing_ok=True)
    (local_bin / "zerolayer").symlink_to(f"{VENV}/bin/zerolayer")
    return Installed(switched.current, manifest.name, manifest.version, signer,
                     tuple(sorted(load_trusted_keys(trusted_keys))))  # fmt: skip


def populate(root: Path, firmware: Path, trusted_keys: Path) -> Installed:
    """An image's root: the appliance, and what makes a root a box of its own (DHCP on every
    interface, the presets applied, an empty machine-id, its hostname, no resolver)."""
    shutil.copytree(IMAGE_FILES, root, dirs_exist_ok=True, symlinks=True)
    installed = install_appliance(root, firmware, trusted_keys)
    enable(root)
    empty_machine_id(root)
    (root / "etc/hostname").write_text("zerolayer\n")
    # debootstrap copied the build machine's resolver here; the box resolves no names of its own.
    resolv = root / "etc/resolv.conf"
    resolv.unlink(missing_ok=True)
    resolv.write_text("# Zerolayer looks up no names. DHCP (systemd-networkd) does not write this file.\n")
    return installed


def install_units(root: Path) -> None:
    """Where systemd/README.md installs them."""
    unit_dir = root / "usr/lib/systemd/system"
    unit_dir.mkdir(parents=True, exist_ok=True)
    for name in UNITS:
        shutil.copy(SYSTEMD_SRC / name, unit_dir / name)
        (unit_dir / name).chmod(0o644)
    for kind in ("sysusers.d", "tmpfiles.d"):
        dest = root / "usr/lib" / kind
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(SYSTEMD_SRC / kind / "zerolayer.conf", dest / "zerolayer.conf")


def enable(root: Path) -> None:
    """Apply every preset offline, ours and Debian's, as systemd does again on the first boot (the
    machine-id is empty): the enablement symlinks are in the image, and the first boot agrees."""
    _run("systemctl", f"--root={root}", "preset-all")


def empty_machine_id(root: Path) -> None:
    """An empty /etc/machine-id: each box makes its own at first boot (and runs the presets then)."""
    (root / "etc/machine-id").write_text("")
    # Debian's dbus keeps a copy of the build machine's id here; it falls back to /etc/machine-id.
    (root / "var/lib/dbus/machine-id").unlink(missing_ok=True)


def group_id(root: Path, name: str) -> int:
    for line in (root / "etc/group").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return int(fields[2])
    raise LookupError(f"no group {name} in {root / 'etc/group'}")


def default_config_text() -> str:
    """/etc/zerolayer/zerolayer.toml: every key commented out at its default, with its meaning."""
    lines = [
        "# Zerolayer's configuration. Every key is shown at its default, commented out; drop-ins in",
        "# conf.d/*.toml override this file in name order. `zerolayer config check` prints the merged",
        "# result with where each value came from; `systemctl reload zerolayer` applies most keys live.",
    ]
    section = None
    for setting in walk(Config()):
        if setting.section != section:
            section = setting.section
            lines += ["", f"[{section}]"]
        lines.append(f"# {setting.doc}")
        none = "  # none" if setting.value is None else ""
        lines.append(f"#{setting.key} = {toml_value(setting.value)}{none}")
    return "\n".join(lines) + "\n"


def _run(*args: str | Path) -> None:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({result.returncode}): {result.stderr.strip()}")
