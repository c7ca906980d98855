"""What makes the amd64 root an A/B slot: it mounts read-only, and everything the box writes lives
on the data partition, which updates never touch. RAUC's configuration names the two slots and
the update CA the box trusts; the health unit marks the booted slot good once Zerolayer serves.

What survives an update, on the data partition (overlays: the new root's files show through
wherever the box has not written its own):

| path | why |
| --- | --- |
| /etc/zerolayer | config drop-ins, API keys, the TLS key and certificate, trusted keys added |
| /usr/lib/zerolayer/firmware | firmware bundles installed on the box, and which one is current |
| /var | /var/lib/zerolayer (the QUIC session-ticket key, prefix spill), the journal, systemd's state |
| /data/rauc/status.raucs | RAUC's record of what each slot holds |
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from appliance import layout
from image.bootdisk import DATA_LABEL, ESP_LABEL, GRUB_DIR, SLOTS, slot_label
from image.disk import make_ext4
from image.tools import run_tool

COMPATIBLE = "zerolayer-amd64"  # RAUC refuses a bundle made for anything else
DATA_MOUNT = "/data"
ESP_MOUNT = "/boot/efi"
STATUS_FILE = f"{DATA_MOUNT}/rauc/status.raucs"
KEYRING = "etc/rauc/keyring.pem"
# Mount point -> its folder under /data/overlay.
OVERLAYS = {"/var": "var", "/etc/zerolayer": "etc-zerolayer", f"/{layout.STORE}": "firmware"}
HEALTH_UNIT = "zerolayer-slot-health.service"
GROWFS_UNIT = "zerolayer-growfs-data.service"
MACHINE_ID_UNIT = "zerolayer-machine-id.service"
SLOT_FILES = layout.REPO / "image" / "slot-files"  # copied into a slot's root as they are


def unit_name(mount_point: str) -> str:
    return mount_point.strip("/").replace("/", "-") + ".mount"


def mount_units() -> dict[str, str]:
    """The data partition, the ESP and the overlays, as mount units rather than /etc/fstab lines:
    each skips itself in a container (ConditionVirtualization=), so the same root still boots under
    systemd-nspawn with no disk behind it."""
    head = "# Zerolayer A/B slot (image/slots.py).\n[Unit]\nConditionVirtualization=!container\n"
    install = "\n[Install]\nWantedBy=local-fs.target\n"
    data = unit_name(DATA_MOUNT)
    units = {
        # Grown to the end of the disk by systemd-repart first (the first boot), then its file system.
        data: f"{head}After=systemd-repart.service\n\n[Mount]\nWhat=/dev/disk/by-partlabel/{DATA_LABEL}\n"
              f"Where={DATA_MOUNT}\nType=ext4\nOptions=noatime\n{install}",
        unit_name(ESP_MOUNT): f"{head}\n[Mount]\nWhat=/dev/disk/by-partlabel/{ESP_LABEL}\nWhere={ESP_MOUNT}\n"
                              f"Type=vfat\nOptions=umask=0077,noatime\n{install}",
    }  # fmt: skip
    for mount, name in OVERLAYS.items():
        upper = f"{DATA_MOUNT}/overlay/{name}"
        units[unit_name(mount)] = (
            f"{head}Requires={data}\nAfter={data}\n\n[Mount]\nWhat=overlay\nWhere={mount}\nType=overlay\n"
            f"Options=lowerdir={mount},upperdir={upper}/upper,workdir={upper}/work\n{install}"
        )
    return units


def rauc_system_conf() -> str:
    slots = "".join(
        f"\n[slot.rootfs.{i}]\ndevice=/dev/disk/by-partlabel/{slot_label(s)}\ntype=ext4\nbootname={s}\n"
        for i, s in enumerate(SLOTS)
    )
    return f"""# RAUC on the Zerolayer image (image/slots.py): two root slots, GRUB's boot state in the ESP.
[system]
compatible={COMPATIBLE}
bootloader=grub
grubenv={ESP_MOUNT}/{GRUB_DIR}/grubenv
statusfile={STATUS_FILE}
mountprefix=/run/rauc
# Verity bundles only: the payload is checked block by block as it is read.
bundle-formats=-plain

[keyring]
path=/{KEYRING}
# The signer must be a code-signing leaf of the update CA.
check-purpose=codesign
{slots}"""


def repart_conf() -> str:
    """systemd-repart grows the data partition (the only "Linux filesystem" one) to the disk's end."""
    return f"[Partition]\nType=linux-generic\nLabel={DATA_LABEL}\n"


def make_slot_root(root: Path, update_ca: Path) -> None:
    """Turn a populated image root into an A/B slot's root (called before its file system is made)."""
    shutil.copytree(SLOT_FILES, root, dirs_exist_ok=True, symlinks=True)
    units = root / "usr/lib/systemd/system"
    for name, text in mount_units().items():
        (units / name).write_text(text)
    (root / "etc/rauc").mkdir(parents=True, exist_ok=True)
    (root / "etc/rauc/system.conf").write_text(rauc_system_conf())
    shutil.copy(update_ca, root / KEYRING)
    (root / KEYRING).chmod(0o644)
    (root / "usr/lib/repart.d").mkdir(parents=True, exist_ok=True)
    (root / "usr/lib/repart.d/50-zerolayer-data.conf").write_text(repart_conf())
    for point in (DATA_MOUNT, ESP_MOUNT):
        (root / point.lstrip("/")).mkdir(parents=True, exist_ok=True)
    # A persistent journal (on the data partition, through the /var overlay): why a slot was
    # marked bad is still there after the box has fallen back to the other one.
    (root / "var/log/journal").mkdir(parents=True, exist_ok=True)
    run_tool("systemctl", f"--root={root}", "enable", HEALTH_UNIT, GROWFS_UNIT, MACHINE_ID_UNIT, *mount_units())
    # /etc is read-only: the machine-id made on the first boot is kept in grubenv instead, and GRUB
    # passes it on (systemd.machine_id=), so nothing is left for systemd to commit; the units that
    # update /etc and /var after a package change must find them up to date, or they fail on the
    # read-only root at every boot.
    run_tool("systemctl", f"--root={root}", "mask", "systemd-machine-id-commit.service")
    stamp = f"TIMESTAMP_NSEC={os.stat(root / 'usr').st_mtime_ns}\n"
    for d in ("etc", "var"):
        (root / d / ".updated").write_text(stamp)


def slot_status(version: str) -> str:
    """RAUC's status file as it would be had slot A been installed from a bundle of VERSION."""
    return f"[slot.rootfs.0]\nbundle.compatible={COMPATIBLE}\nbundle.version={version}\nstatus=ok\n"


def make_data_fs(out: Path, size: int, version: str) -> None:
    """The data partition as flashed: the overlays' empty folders and RAUC's record of slot A."""
    staging = out.with_suffix(".d")
    shutil.rmtree(staging, ignore_errors=True)
    for name in OVERLAYS.values():
        for sub in ("upper", "work"):
            (staging / "overlay" / name / sub).mkdir(parents=True)
    (staging / "rauc").mkdir()
    (staging / "rauc/status.raucs").write_text(slot_status(version))
    try:
        make_ext4(staging, out, size, label=DATA_LABEL)
    finally:
        shutil.rmtree(staging)


def image_info(version: str, arch: str, dev: bool) -> str:
    """/usr/lib/zerolayer/image.json: what `zerolayer status` and `zerolayer system status` show."""
    return json.dumps({"version": version, "arch": arch, "dev": dev}, indent=2) + "\n"
