"""`zerolayer install`: the appliance laid out on a running Debian or Ubuntu host, the way the
image has it (scripts/install.sh makes the virtualenv first, then runs this from it): the units,
user, directories, config, trusted keys, firmware and a first API key; then the service started."""

from __future__ import annotations

import subprocess
from pathlib import Path

from appliance import layout
from appliance.api.auth import add_key

START = ("zerolayer-tls-init.service", *layout.UNITS)


def install_host(firmware: Path, trusted_keys: Path, root: Path = Path("/"), start: bool = True) -> str | None:
    """Returns the first API key (made only when the key file has none), to be shown once."""
    installed = layout.install_appliance(root, firmware.resolve(), trusted_keys.resolve())
    keys = root / "etc/zerolayer/api-keys"
    key = add_key(keys, "admin") if not keys.read_text().strip() else None
    systemd_runs = root == Path("/") and Path("/run/systemd/system").is_dir()
    if systemd_runs:  # the directories now, then the units, as a boot would
        _run("systemd-tmpfiles", "--create", "zerolayer.conf")
        _run("systemctl", "daemon-reload")
        _run("systemctl", "enable", *(["--now"] if start else []), *START)
    else:  # a root that is not running (a container's, before its boot): enabled for its first boot
        _run("systemctl", f"--root={root}", "enable", *START)
    print(f"zerolayer: installed firmware {installed.firmware_name} {installed.firmware_version} "
          f"(signed by {installed.firmware_signer}); units enabled" + (" and started" if systemd_runs and start
                                                                       else ""))  # fmt: skip
    return key


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()[-1000:]}")
