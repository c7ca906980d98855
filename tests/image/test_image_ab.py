"""The amd64 disk image booted as a box boots it: QEMU with software emulation (-accel tcg) and
UEFI firmware (OVMF), GRUB from the ESP, Debian's kernel from slot A, a read-only root and the data
partition grown to the disk on the first boot. Clients on the host reach it through QEMU's port
forwards over HTTP/3 and HTTPS. Then the A/B updates: a broken root (its daemon cannot start) is
tried once, marked bad, and the box comes back on A with its data; a good one boots in slot B,
is marked good and serves.

The booted root is the image's own plus a command runner on serial port 1 (image/qemu.py), which
shipped images do not have. The updates run in `make image-test` (marker ab_update: minutes of
emulated boots); the boot and the requests run in `make test`."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from appliance.client import ApplianceClient
from appliance.system import parse_status
from firmware.toolchain.devkit import resigned_copy
from firmware.toolchain.paths import cache_dir
from image import disk, qemu
from image.build import Image, make_ab_disk
from image.update import dev_update_signer, make_bundle

BOOT_TIMEOUT = 600  # seconds, emulated: about 35 s to the command runner on the 2-core VM
GOOD, BROKEN = "0.1.1", "0.1.2-broken"


@dataclass
class Box:
    machine: qemu.Machine
    ca: Path  # the box's own CA, made on its first boot
    key: str  # an API key added on the box (a debug key: it may read /status)


def _slot_fs(root: Path, out: Path) -> Path:
    disk.make_ext4(root, out, disk.fs_size(disk.used_bytes(root), 0.1, 64 * disk.MIB))
    return out


def _variant(image: Image, work: Path, version: str, broken: bool) -> Path:
    """A newer root: the image's own with another version, and for BROKEN a config its daemon
    refuses (an unknown key), as a bad release would ship."""
    root = work / f"root-{version}"
    shutil.rmtree(root, ignore_errors=True)
    subprocess.run(["cp", "-a", "--reflink=auto", str(image.root), str(root)], check=True)
    info = root / "usr/lib/zerolayer/image.json"
    info.write_text(json.dumps({**json.loads(info.read_text()), "version": version}))
    if broken:
        (root / "etc/zerolayer/conf.d/90-release.toml").write_text("[engine]\nno_such_setting = 1\n")
    try:
        return _slot_fs(root, work / f"root-{version}.ext4")
    finally:
        shutil.rmtree(root)


@pytest.fixture(scope="module")
def disk_image(image: Image, image_work: Path) -> Path:
    work = image_work / "ab"
    work.mkdir(exist_ok=True)
    qemu.add_test_shell(image.root)
    fs = _slot_fs(image.root, work / "root-a.ext4")
    img = work / "box.img"
    make_ab_disk(fs, img, "0.1.0")
    fs.unlink()
    os.truncate(img, img.stat().st_size + (1 << 30))  # a bigger disk than the image: the data partition grows
    return img


@pytest.fixture(scope="module")
def updates(image: Image, image_work: Path, tiny_bundle_path: Path, dev_key: Path) -> Path:
    """A drive for the box: the good and the broken update bundles and a firmware bundle to install."""
    work = image_work / "updates"
    work.mkdir(exist_ok=True)
    signer = dev_update_signer(cache_dir())
    files = work / "files"
    files.mkdir(exist_ok=True)
    for version, broken in ((GOOD, False), (BROKEN, True)):
        fs = _variant(image, work, version, broken)
        started = time.monotonic()
        bundle = make_bundle(fs, version, signer, files / f"{version}.raucb")
        print(f"bundle {version}: {time.monotonic() - started:.1f} s, {bundle.stat().st_size >> 20} MiB")
        fs.unlink()
    resigned_copy(tiny_bundle_path, files / "tiny-0.2.0", "0.2.0", dev_key)
    drive = work / "updates.ext4"
    disk.make_ext4(files, drive, disk.fs_size(disk.used_bytes(files), 0.1, 16 * disk.MIB), label="updates")
    return drive


@pytest.fixture(scope="module")
def box(disk_image: Path, image_work: Path, request: pytest.FixtureRequest) -> Iterator[Box]:
    # The updates drive only where an update test runs: its bundles take a while to make.
    wanted = any(item.get_closest_marker("ab_update") for item in request.session.items)
    drives = [request.getfixturevalue("updates")] if wanted else []
    started = time.monotonic()
    with qemu.booted(disk_image, image_work / "vm", extra_drives=drives) as machine:
        machine.wait_shell(BOOT_TIMEOUT)
        _wait_health(machine)
        print(f"first boot: marked good {time.monotonic() - started:.1f} s after QEMU started")
        key = machine.run("zerolayer keys add host-test --debug 2>/dev/null")[1].strip()
        machine.run("systemctl reload zerolayer")  # the daemon reads its keys at start and on reload
        ca = image_work / "box-ca.crt"
        ca.write_text(machine.run("cat /etc/zerolayer/tls/ca.crt")[1])
        ssl.create_default_context(cafile=str(ca))  # a whole certificate came back
        box = Box(machine, ca, key)
        deadline = time.monotonic() + 60
        while _https(box, "GET", "/v1/models")[0] == 401:  # `systemctl reload` returns before the daemon is done
            assert time.monotonic() < deadline, "the key added on the box was not taken within 60 s"
            time.sleep(1)
        yield box


def _wait_health(machine: qemu.Machine) -> str:
    """Until this boot's health check finished; its journal lines."""
    machine.run("systemctl is-system-running --wait >/dev/null; true", timeout=BOOT_TIMEOUT)
    return machine.run("journalctl -b -u zerolayer-slot-health --no-pager -o cat", check=False)[1]


def _http3(box: Box, method: str, path: str, body: dict[str, object] | None = None) -> tuple[int, str]:
    client = ApplianceClient(url=f"https://127.0.0.1:{box.machine.ports['udp']}", ca=str(box.ca), api_key=box.key,
                             timeout=120)  # fmt: skip
    reply = client.request(method, path, body)
    return reply.status, "\n".join(reply.lines)


def _https(box: Box, method: str, path: str, body: dict[str, object] | None = None) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(box.ca))
    conn = http.client.HTTPSConnection("127.0.0.1", box.machine.ports["tcp"], context=context, timeout=120)
    conn.request(method, path, body=json.dumps(body) if body else None,
                 headers={"content-type": "application/json", "x-api-key": box.key})  # fmt: skip
    resp = conn.getresponse()
    return resp.status, resp.read().decode()


MESSAGE = {"model": "tiny-llama", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def _status(box: Box) -> dict[str, object]:
    code, body = _https(box, "GET", "/status")
    assert code == 200, body
    return dict(json.loads(body))


def test_boots_under_uefi_and_serves_http3_and_https_from_the_host(box: Box) -> None:
    code, body = _http3(box, "POST", "/v1/messages", MESSAGE)
    assert code == 200, body
    assert json.loads(body)["usage"]["output_tokens"] >= 1
    code, body = _https(box, "POST", "/v1/messages", MESSAGE)
    assert code == 200 and json.loads(body)["model"] == "tiny-llama", body
    # The image says it trusts development keys, to the operator's `zerolayer status` too.
    assert _status(box)["image"] == {"version": "0.1.0", "arch": "amd64", "dev": True}
    shown = box.machine.run("zerolayer status")[1]
    assert "DEVELOPMENT image" in shown


def test_the_root_is_read_only_and_the_data_partition_filled_the_disk(box: Box) -> None:
    run = box.machine.run
    assert "ro" in run("findmnt -no OPTIONS /")[1].split(",")
    assert run("touch /usr/x", check=False)[0] != 0
    data_bytes = int(run("findmnt -bno SIZE /data")[1])
    assert data_bytes > 1 << 30, f"/data is {data_bytes} bytes: not grown into the extra GiB"
    for point in ("/var", "/etc/zerolayer", "/usr/lib/zerolayer/firmware"):
        assert run(f"findmnt -no FSTYPE {point}")[1].strip() == "overlay", point
    assert run("systemctl --failed --no-legend --plain")[1].strip() == ""
    # The machine-id made on the first boot is kept in grubenv for every later boot (/etc is read-only).
    machine_id = run("cat /etc/machine-id")[1].strip()
    assert f"MACHINE_ID={machine_id}" in run("grub-editenv /boot/efi/EFI/BOOT/grubenv list")[1]


def test_rauc_status_and_zerolayer_system_status_agree(box: Box) -> None:
    rauc = parse_status(box.machine.run("rauc status --detailed --output-format=json")[1])
    ours = json.loads(box.machine.run("zerolayer system status --json")[1])
    assert rauc.booted is not None and rauc.booted.bootname == "A" and rauc.booted.boot_status == "good"
    assert {s["bootname"]: (s["booted"], s["boot_status"], s["version"]) for s in ours["slots"]} == {
        s.bootname: (s.booted, s.boot_status, s.version) for s in rauc.slots}
    assert ours["slots"][0]["version"] or ours["slots"][1]["version"]  # slot A: 0.1.0, from the image's record
    text = box.machine.run("zerolayer system status")[1]
    assert "booted: slot A, version 0.1.0 (development image" in text


def _mount_updates(machine: qemu.Machine) -> None:
    """The updates drive at /run/updates (a tmpfs: mounted again after every boot)."""
    machine.run("mountpoint -q /run/updates || { mkdir -p /run/updates && mount -o ro /dev/vdb /run/updates; }")


def _reboot_into(box: Box, command: str, slots: str) -> str:
    """Run COMMAND (it reboots the box), wait until GRUB has booted each of SLOTS in turn ("BA": B,
    then A) and the last boot's command runner answers; the console from then on."""
    machine = box.machine
    mark = len(machine.console_text())
    _mount_updates(machine)
    started = time.monotonic()
    machine.run(f"({command}) > /run/update.log 2>&1 &", timeout=30)
    at = mark
    for slot in slots:
        try:
            at = machine.wait_console(f"Zerolayer: booting slot {slot}", BOOT_TIMEOUT, after=at).end()
        except TimeoutError:
            said = machine.run("cat /run/update.log", timeout=30, check=False)[1] if at == mark else ""
            raise AssertionError(f"slot {slot} was not booted; the update said: {said}") from None
    machine.wait_shell(BOOT_TIMEOUT)
    _wait_health(machine)
    print(f"{command}: slots {' then '.join(slots)} booted, the last one checked, {time.monotonic() - started:.0f} s")
    return machine.console_text()[mark:]


@pytest.mark.ab_update
def test_a_broken_update_is_tried_once_marked_bad_and_the_box_comes_back_on_a(box: Box) -> None:
    machine = box.machine
    _mount_updates(machine)
    machine.run("zerolayer firmware install /run/updates/tiny-0.2.0", timeout=300)
    assert _status(box)["firmware"]["version"] == "0.2.0"  # type: ignore[index]
    state_before = machine.run("ls /var/lib/zerolayer")[1].split()
    # GRUB tries B once; its health check marks it bad and reboots; GRUB then boots A.
    console = _reboot_into(box, f"zerolayer system update /run/updates/{BROKEN}.raucb --reboot", "BA")
    assert "B_OK=1 B_TRY=0" in console  # what RAUC's install left for GRUB
    health = _wait_health(machine)
    assert "slot A serves: marked good" in health
    # The box kept its machine-id and its journal: B's verdict is there after the fall back.
    previous = machine.run("journalctl -b -1 -u zerolayer-slot-health --no-pager -o cat")[1]
    assert "slot B does not serve: marked bad" in previous, previous
    status = parse_status(machine.run("rauc status --detailed --output-format=json")[1])
    slots = {s.bootname: s for s in status.slots}
    assert slots["A"].booted and slots["A"].boot_status == "good"
    assert slots["B"].boot_status == "bad" and slots["B"].version == BROKEN
    # Nothing on the data partition was lost: the key, the installed firmware, the daemon's state.
    code, body = _http3(box, "POST", "/v1/messages", MESSAGE)
    assert code == 200, body
    assert _status(box)["firmware"]["version"] == "0.2.0"  # type: ignore[index]
    assert set(state_before) <= set(machine.run("ls /var/lib/zerolayer")[1].split())


@pytest.mark.ab_update
def test_a_good_update_boots_in_b_is_marked_good_and_serves(box: Box) -> None:
    machine = box.machine
    _reboot_into(box, f"zerolayer system update /run/updates/{GOOD}.raucb --reboot", "B")
    health = _wait_health(machine)
    assert "slot B serves: marked good" in health, health
    status = parse_status(machine.run("rauc status --detailed --output-format=json")[1])
    assert status.booted is not None and status.booted.bootname == "B" and status.booted.boot_status == "good"
    assert status.booted.version == GOOD
    assert f"booted: slot B, version {GOOD}" in machine.run("zerolayer system status")[1]
    code, body = _http3(box, "POST", "/v1/messages", MESSAGE)  # the same key, from the data partition
    assert code == 200, body
    assert _status(box)["image"]["version"] == GOOD  # type: ignore[index]
    assert _status(box)["firmware"]["version"] == "0.2.0"  # type: ignore[index]
