"""The A/B image's parts that need no boot: the disk layout, GRUB's slot choice as RAUC's GRUB
backend expects it, the mounts and RAUC's configuration, the verdict of the boot's health check,
rauc's status as `zerolayer system status` reads it, and a bundle made and checked by rauc itself.
(test_image_ab.py boots all of it.)"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest

from appliance.cli import main
from appliance.system import Action, parse_status, render, verdict
from image import bootdisk, slots
from image.disk import MIB
from image.update import UpdateSigner, bundle_info, make_bundle

# `rauc status --detailed --output-format=json` on the booted image after a broken update to B
# (trimmed to the fields read; the keys and nesting are RAUC 1.8's).
RAUC_STATUS = {
    "compatible": "zerolayer-amd64", "variant": "", "booted": "A", "boot_primary": "rootfs.0",
    "slots": [
        {"rootfs.1": {"class": "rootfs", "device": "/dev/disk/by-partlabel/zerolayer-root-b", "type": "ext4",
                      "bootname": "B", "state": "inactive", "parent": None, "mountpoint": None, "boot_status": "bad",
                      "slot_status": {"bundle": {"compatible": "zerolayer-amd64", "version": "0.1.2-broken"},
                                      "installed": {"timestamp": "2026-12-03T18:50:01Z", "count": 1},
                                      "status": "ok"}}},
        {"rootfs.0": {"class": "rootfs", "device": "/dev/disk/by-partlabel/zerolayer-root-a", "type": "ext4",
                      "bootname": "A", "state": "booted", "parent": None, "mountpoint": "/", "boot_status": "good",
                      "slot_status": {"bundle": {"compatible": "zerolayer-amd64", "version": "0.1.0"},
                                      "status": "ok"}}},
    ],
}  # fmt: skip


def test_layout_puts_the_data_partition_last_so_it_can_grow() -> None:
    parts = bootdisk.ab_layout(bootdisk.slot_size(900 * MIB))
    assert [p.label for p in parts] == ["zerolayer-esp", "zerolayer-root-a", "zerolayer-root-b", "zerolayer-data"]
    assert parts[0].offset == MIB and parts[1].size == parts[2].size == 1536 * MIB  # 1.5x, in 256 MiB
    for before, after in itertools.pairwise(parts):
        assert after.offset == before.offset + before.size  # packed, no overlap
    assert bootdisk.disk_size(parts) == parts[-1].offset + parts[-1].size + MIB
    with pytest.raises(ValueError, match="whole number of MiB"):
        bootdisk.ab_layout(MIB + 1)


def test_grub_boots_the_first_good_untried_slot_and_counts_the_try() -> None:
    cfg = bootdisk.grub_config()
    # RAUC's GRUB backend: install sets ORDER and X_OK=1 X_TRY=0; mark-good X_OK=1 X_TRY=0; mark-bad X_OK=0.
    assert 'if [ "$s" = "A" ]; then ok="$A_OK"; try="$A_TRY"; A_TRY=1; fi' in cfg
    assert 'if [ "$ok" = "1" -a "$try" = "0" ]; then slot="$s"; break; fi' in cfg
    assert "save_env ORDER A_OK A_TRY B_OK B_TRY" in cfg
    assert cfg.index("save_env") < cfg.index("linux ($disk,$part)")  # the try is counted before the boot
    assert "root=PARTLABEL=$label" in cfg and "rauc.slot=$slot" in cfg and "console=ttyS0" in cfg


def test_grubenv_starts_on_a_good_slot_a(tmp_path: Path) -> None:
    env = tmp_path / "grubenv"
    bootdisk.make_grubenv(env)
    assert env.stat().st_size == 1024  # GRUB's fixed-size block, which save_env rewrites in place
    listed = subprocess.run(["grub-editenv", str(env), "list"], capture_output=True, text=True, check=True).stdout
    assert set(listed.split()) == {"ORDER=A", "B", "A_OK=1", "A_TRY=0", "B_OK=0", "B_TRY=0"}


def test_mount_units_put_what_the_box_writes_on_the_data_partition() -> None:
    units = slots.mount_units()
    assert set(units) == {"data.mount", "boot-efi.mount", "var.mount", "etc-zerolayer.mount",
                          "usr-lib-zerolayer-firmware.mount"}  # fmt: skip
    for name, text in units.items():
        assert "ConditionVirtualization=!container" in text, name  # the same root boots under nspawn
    assert "What=/dev/disk/by-partlabel/zerolayer-data" in units["data.mount"]
    assert "Options=lowerdir=/var,upperdir=/data/overlay/var/upper,workdir=/data/overlay/var/work" in units["var.mount"]
    assert "Requires=data.mount" in units["etc-zerolayer.mount"]


def test_rauc_config_names_both_slots_and_the_update_ca() -> None:
    conf = slots.rauc_system_conf()
    assert "bootloader=grub\ngrubenv=/boot/efi/EFI/BOOT/grubenv" in conf
    assert "[slot.rootfs.1]\ndevice=/dev/disk/by-partlabel/zerolayer-root-b\ntype=ext4\nbootname=B" in conf
    assert "path=/etc/rauc/keyring.pem" in conf and "check-purpose=codesign" in conf
    assert "bundle-formats=-plain" in conf


def test_rauc_status_is_read_as_slots() -> None:
    status = parse_status(json.dumps(RAUC_STATUS))
    assert status.booted is not None and status.booted.bootname == "A" and status.primary == "rootfs.0"
    other = status.other(status.booted)
    assert other is not None and (other.bootname, other.boot_status, other.version) == ("B", "bad", "0.1.2-broken")
    lines = render(status, {"version": "0.1.0", "dev": True})
    assert lines[0] == "booted: slot A, version 0.1.0 (development image: trusts development keys)"
    assert any("slot B (rootfs.1" in line and "bad, version 0.1.2-broken" in line for line in lines)
    assert any(line.endswith("<- next boot") and "slot A" in line for line in lines)


def test_verdict_marks_a_slot_bad_only_when_the_other_is_good() -> None:
    status = parse_status(json.dumps(RAUC_STATUS))
    assert verdict(True, status) is Action.MARK_GOOD
    # A serving nothing: B is bad, so stay on A (reachable) rather than reboot forever.
    assert verdict(False, status) is Action.STAY
    swapped = json.loads(json.dumps(RAUC_STATUS))
    swapped["slots"][0]["rootfs.1"].update(state="booted", boot_status="good")
    swapped["slots"][1]["rootfs.0"].update(state="inactive")
    assert verdict(False, parse_status(json.dumps(swapped))) is Action.MARK_BAD_AND_REBOOT


def test_a_bundle_is_signed_by_the_update_ca_and_refused_by_another(tmp_path: Path) -> None:
    from appliance.tls import make_ca, make_code_signer

    make_ca(tmp_path / "ca.crt", tmp_path / "ca.key", "test update CA")
    make_code_signer(tmp_path / "ca.crt", tmp_path / "ca.key", "test signer", tmp_path / "s.crt", tmp_path / "s.key")
    signer = UpdateSigner(tmp_path / "ca.crt", tmp_path / "s.crt", tmp_path / "s.key")
    (tmp_path / "files").mkdir()
    (tmp_path / "files/payload").write_bytes(os.urandom(65536))  # squashfs needs more than one block
    fs = tmp_path / "root.ext4"
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(tmp_path / "files"), str(fs), "4M"], check=True)
    bundle = make_bundle(fs, "9.9.9", signer, tmp_path / "update.raucb")
    doc = bundle_info(bundle, signer.ca)
    assert doc["compatible"] == "zerolayer-amd64" and doc["version"] == "9.9.9"
    make_ca(tmp_path / "other.crt", tmp_path / "other.key", "someone else's CA")
    with pytest.raises(RuntimeError, match="signature verification failed"):
        bundle_info(bundle, tmp_path / "other.crt")


def test_image_build_refuses_to_guess_which_keys_the_box_trusts(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                                ) -> None:  # fmt: skip
    code = main(["image", "build", "--arch", "amd64", "--firmware", str(tmp_path), "--out", str(tmp_path / "o"),
                 "--trusted-keys", str(tmp_path)])  # fmt: skip
    assert code == 2 and "--update-ca CA.pem" in capsys.readouterr().err
    code = main(["image", "build", "--arch", "arm64", "--firmware", str(tmp_path), "--out", str(tmp_path / "o")])
    assert code == 2 and "--trusted-keys DIR, or --dev" in capsys.readouterr().err
    code = main(["image", "bundle", "--image", str(tmp_path), "--out", str(tmp_path / "u.raucb"), "--dev"])
    assert code == 1 and "image bundle failed" in capsys.readouterr().err
