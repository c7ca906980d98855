"""The image end to end: build the amd64 image with the tiny firmware, check what came out, and
boot its root with systemd as PID 1 (systemd-nspawn --boot): zerolayer.service becomes active
through READY=1, answers over its Unix socket from the bundle, comes back within 3 s of a SIGKILL,
applies a config change on reload, and installs, refuses and rolls back firmware with systemctl
doing the restarts. The arm64 root is built and runs `zerolayer --version` under qemu-user in
`make image-test` (marker arm64_image, deselected in `make test`: minutes more than the suite should take).

Needs root, debootstrap, systemd-nspawn and the package registries (the Debian mirror of this
machine's apt sources, PyPI); the debootstrap base is cached under $ZEROLAYER_CACHE/image."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clients import BOX_CLIENT

from firmware.toolchain.devkit import resigned_copy
from firmware.toolchain.paths import cache_dir
from image.boot import Container, booted
from image.build import Image, build_image

SERVICE = "zerolayer.service"
MESSAGE = {"model": "tiny-llama", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def test_image_tools_are_installed() -> None:
    """scripts/setup.sh test installs them; their absence is a broken set-up, not a reason to skip."""
    missing = [t for t in ("debootstrap", "systemd-nspawn", "nsenter", "sgdisk", "mkfs.ext4", "debugfs",
                           "grub-mkimage", "grub-editenv", "mkfs.vfat", "mcopy", "rauc", "mksquashfs",
                           "qemu-system-x86_64") if shutil.which(t) is None]  # fmt: skip
    assert Path("/usr/lib/grub/x86_64-efi/linux.mod").is_file(), "grub-efi-amd64-bin: make setup-test"
    assert Path("/usr/share/OVMF/OVMF_CODE_4M.fd").is_file(), "ovmf: make setup-test"
    assert not missing, f"missing {missing}: make setup-test"
    assert os.geteuid() == 0, "the image build needs root (debootstrap, file owners, nspawn)"


def test_outputs_are_summed_and_described(image: Image) -> None:
    check = subprocess.run(["sha256sum", "--check", "--strict", image.sums.name], cwd=image.out,
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    doc = json.loads(image.manifest.read_text())
    assert doc["arch"] == "amd64" and doc["zerolayer"] == "0.1.0"
    assert doc["firmware"]["name"] == "tiny-llama" and doc["firmware"]["signer"] in doc["trusted_keys"]
    wheels = {w["name"].lower(): w for w in doc["wheels"]}
    assert {"zerolayer", "onnxruntime", "aioquic", "onnx"} <= set(wheels)
    assert "torch" not in wheels and "transformers" not in wheels  # runtime dependencies only
    assert all(len(w["sha256"]) == 64 for w in doc["wheels"])
    assert "python3-systemd" in doc["debian"]["packages"] and "libbpf1" in doc["debian"]["packages"]
    # The disk image's partition is the ext4 file system, which holds the enabled service.
    # The disk: ESP, root slots A and B, data; slot A holds the ext4 file system.
    table = subprocess.run(["sgdisk", "--print", str(image.disk)], capture_output=True, text=True).stdout
    assert [line.split()[-1] for line in table.splitlines() if line.strip()[:1].isdigit()] == [
        "zerolayer-esp", "zerolayer-root-a", "zerolayer-root-b", "zerolayer-data"]
    slot_a = subprocess.run(["sgdisk", "--info=2", str(image.disk)], capture_output=True, text=True).stdout
    assert "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709" in slot_a and "First sector: 133120" in slot_a
    assert doc["dev"] is True and doc["version"] == "0.1.0" and len(doc["update_ca"]) == 64
    wants = subprocess.run(["debugfs", "-R", "ls -l /etc/systemd/system/multi-user.target.wants", str(image.ext4)],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert SERVICE in wants
    listing = subprocess.run(["tar", "-tf", str(image.tar)], capture_output=True, text=True, check=True).stdout
    assert "./opt/zerolayer/bin/zerolayer\n" in listing and "./etc/machine-id\n" in listing


@pytest.fixture(scope="module")
def box(image: Image, work: Path) -> Iterator[Container]:
    with booted(image.root, "zerolayer-test", work / "console.log") as container:
        state = container.run(["systemctl", "is-system-running", "--wait"], timeout=120, check=False).stdout.strip()
        print(f"booted: system {state}")
        yield container


def _show(box: Container) -> dict[str, str]:
    out = box.systemctl("show", "-p", "ActiveState,SubState,StatusText,NRestarts,MainPID,Result", SERVICE)
    return dict(line.split("=", 1) for line in out.splitlines())


def _wait_active(box: Container, timeout: float, since_restarts: int | None = None) -> dict[str, str]:
    """Until the service is active (for Type=notify: after READY=1) with a serving STATUS= line."""
    deadline = time.monotonic() + timeout
    while True:
        state = _show(box)
        restarted = since_restarts is None or int(state["NRestarts"]) > since_restarts
        if state["ActiveState"] == "active" and state["StatusText"].startswith("serving") and restarted:
            return state
        if time.monotonic() > deadline:
            log = box.run(["journalctl", "-b", "-u", SERVICE, "--no-pager", "-n", "40"], check=False).stdout
            raise AssertionError(f"{SERVICE} not active within {timeout} s: {state}\n{log}")
        time.sleep(0.02)


def _call(box: Container, method: str, path: str, body: object = None) -> tuple[int, str]:
    argv = ["/opt/zerolayer/bin/python", "-c", BOX_CLIENT, method, path]
    if body is not None:
        argv.append(json.dumps(body))
    reply = json.loads(box.run(argv, timeout=120).stdout)
    return reply["status"], reply["body"]


def test_service_becomes_active_through_ready(box: Container) -> None:
    state = _wait_active(box, 60)
    assert state["SubState"] == "running" and state["NRestarts"] == "0"
    assert state["StatusText"].startswith("serving tiny-llama")
    # Enabled, not started by hand: the boot brought it up, after its first-boot certificate.
    assert box.systemctl("is-enabled", SERVICE) == "enabled"
    assert box.systemctl("is-active", "zerolayer-tls-init.service") == "active"


def test_a_request_over_the_unix_socket_answers_from_the_bundle(box: Container) -> None:
    status, body = _call(box, "POST", "/v1/messages", MESSAGE)
    assert status == 200, body
    reply = json.loads(body)
    assert reply["model"] == "tiny-llama" and reply["usage"]["output_tokens"] >= 1
    status, body = _call(box, "GET", "/status")
    assert status == 200 and json.loads(body)["firmware"]["path"].startswith("/usr/lib/zerolayer/firmware/tiny-llama-")


def test_sigkill_is_followed_by_a_restart_and_ready_within_3_s(box: Container) -> None:
    before = _wait_active(box, 60)
    killed_at = time.monotonic()
    box.systemctl("kill", "-s", "KILL", SERVICE)
    after = _wait_active(box, 10, since_restarts=int(before["NRestarts"]))
    took = time.monotonic() - killed_at
    print(f"SIGKILL -> active again (READY=1) in {took:.2f} s (RestartSec= included)")
    assert after["MainPID"] != before["MainPID"]
    assert took <= 3.0
    assert _call(box, "POST", "/v1/messages", MESSAGE)[0] == 200


def test_reload_applies_a_config_change(box: Container) -> None:
    _wait_active(box, 60)
    big = {**MESSAGE, "metadata": {"user_id": "x" * 3000}}  # a body of about 3 KB
    assert _call(box, "POST", "/v1/messages", big)[0] != 413
    pid = _show(box)["MainPID"]
    drop_in = Path(f"/proc/{box.leader}/root/etc/zerolayer/conf.d/50-test.toml")
    drop_in.write_text("[limits]\nmax_body_bytes = 2048\n")
    try:
        box.systemctl("reload", SERVICE)
        deadline = time.monotonic() + 10
        while _call(box, "POST", "/v1/messages", big)[0] != 413:  # reload returns before the daemon is done
            assert time.monotonic() < deadline, "the reloaded limit did not apply within 10 s"
            time.sleep(0.1)
        assert _show(box)["MainPID"] == pid  # applied live, not by a restart
        assert _call(box, "POST", "/v1/messages", MESSAGE)[0] == 200
    finally:
        drop_in.unlink()
        box.systemctl("reload", SERVICE)


def test_firmware_install_tamper_and_rollback_on_the_box(box: Container, tiny_bundle_path: Path, dev_key: Path,
                                                         work: Path) -> None:  # fmt: skip
    """`zerolayer firmware install/rollback` as an operator runs them: systemctl restarts the daemon."""
    inside = Path(f"/proc/{box.leader}/root/var/tmp")
    resigned_copy(tiny_bundle_path, inside / "v2", "0.2.0", dev_key)
    resigned_copy(tiny_bundle_path, inside / "v3", "0.3.0", dev_key)
    (inside / "v3/tokenizer.json").write_text("{}")  # tampered after signing

    def version() -> str:
        return str(json.loads(_call(box, "GET", "/status")[1])["firmware"]["version"])

    def current() -> str:
        return box.run(["readlink", "/usr/lib/zerolayer/firmware/current"]).stdout.strip()

    _wait_active(box, 60)
    first = current()
    done = box.run(["zerolayer", "firmware", "install", "/var/tmp/v2"], timeout=120)
    assert f"restarted {SERVICE}" in done.stdout
    assert version() == "0.2.0" and current().startswith("tiny-llama-0.2.0-")
    restarts = _show(box)["NRestarts"]
    refused = box.run(["zerolayer", "firmware", "install", "/var/tmp/v3"], check=False)
    assert refused.returncode == 2 and "tokenizer.json" in refused.stderr
    assert current().startswith("tiny-llama-0.2.0-") and _show(box)["NRestarts"] == restarts
    back = box.run(["zerolayer", "firmware", "rollback"], timeout=120)
    assert f"restarted {SERVICE}" in back.stdout
    assert current() == first and version() == "0.1.0"


@pytest.mark.arm64_image  # about 16 minutes fresh under qemu-user: make image-test, not make test
def test_arm64_root_builds_and_runs_zerolayer_under_qemu(work: Path, tiny_bundle_path: Path,
                                                         trusted_keys: Path) -> None:  # fmt: skip
    from image.rootfs import run_in

    started = time.monotonic()
    built = build_image("arm64", tiny_bundle_path, work / "arm64", trusted_keys, cache=cache_dir(),
                        progress=lambda line: print(line, flush=True))  # fmt: skip
    print(f"arm64 image built in {time.monotonic() - started:.1f} s "
          f"(debootstrap base {'cached' if built.base_cached else 'made now'})")  # fmt: skip
    python = (built.root / "usr/bin/python3.11").read_bytes()[:20]
    assert python[:4] == b"\x7fELF" and int.from_bytes(python[18:20], "little") == 0xB7  # EM_AARCH64
    assert run_in(built.root, ["/usr/local/bin/zerolayer", "--version"]).strip() == "zerolayer 0.1.0"
    assert json.loads(built.manifest.read_text())["arch"] == "arm64"
    table = subprocess.run(["sgdisk", "--info=1", str(built.disk)], capture_output=True, text=True).stdout
    assert "B921B045-1DF0-41C3-AF44-4C6F280D3FAE" in table
