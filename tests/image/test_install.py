"""`scripts/install.sh` on a plain Debian 12 root (the image build's cached debootstrap base, with
nothing of ours in it): it makes the virtualenv offline from a wheelhouse and runs `zerolayer
install`; booted with systemd as PID 1, the service then comes up on its own through READY=1,
answers over its Unix socket, pins its eBPF maps through the directory the unit binds (the
bpffs root's mode untouched), and `systemd-analyze verify` has nothing to say about its units."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

from clients import BOX_CLIENT

from appliance.layout import REPO
from firmware.toolchain.paths import cache_dir
from image import rootfs, sources, wheels
from image.boot import booted


def test_install_script_brings_a_plain_debian_root_to_a_ready_service(work: Path, tiny_bundle_path: Path,
                                                                       trusted_keys: Path) -> None:  # fmt: skip
    found = sources.read_sources()
    mirror = sources.debian_mirror(found, rootfs.SUITE)
    try:
        security: str | None = sources.debian_mirror(found, f"{rootfs.SUITE}-security")
    except LookupError:
        security = None
    base, _ = rootfs.base_root("amd64", mirror, security, cache_dir())
    root = work / "root"
    rootfs.copy_root(base, root)
    assert not (root / "opt/zerolayer").exists() and not (root / "etc/zerolayer").exists()  # a plain host
    house = work / "wheelhouse"
    wheels.build_wheelhouse(house, "amd64", cache_dir() / "image" / "pip")
    out = rootfs.run_in(root, ["bash", "/src/scripts/install.sh", "--wheelhouse", "/mnt/wheelhouse",
                               "--firmware", "/mnt/firmware", "--trusted-keys", "/mnt/keys"],
                        binds=[(REPO, "/src"), (house, "/mnt/wheelhouse"), (tiny_bundle_path, "/mnt/firmware"),
                               (trusted_keys, "/mnt/keys")])  # fmt: skip
    assert "installed firmware tiny-llama" in out and "API key (shown once" in out, out
    # A bpffs of the container's own, root-only as systemd mounts it, and what the kernel layer
    # needs of the container: its capabilities, and bpf() through nspawn's system call filter.
    bpffs = work / "bpffs"
    bpffs.mkdir()
    subprocess.run(["mount", "-t", "bpf", "-o", "mode=0700", "bpf", str(bpffs)], check=True)
    with contextlib.ExitStack() as unmount:
        unmount.callback(subprocess.run, ["umount", "-l", str(bpffs)], check=False)
        box = unmount.enter_context(booted(root, "zerolayer-install", work / "console.log", extra=[
            f"--bind={bpffs}:/sys/fs/bpf", "--capability=CAP_BPF,CAP_PERFMON,CAP_NET_ADMIN",
            "--system-call-filter=bpf"]))  # fmt: skip
        deadline = time.monotonic() + 90
        state = ""
        while time.monotonic() < deadline:
            state = box.systemctl("show", "-p", "ActiveState", "--value", "zerolayer.service").strip()
            if state == "active":
                break
            time.sleep(0.2)
        journal = box.run(["journalctl", "-b", "-u", "zerolayer.service", "--no-pager", "-n", "30"],
                          check=False).stdout  # fmt: skip
        assert state == "active", journal
        # The eBPF maps are pinned in the daemon's own bpffs directory, reached through the bind the
        # unit makes; the bpffs root keeps the root-only mode systemd mounts it with.
        assert "maps pinned under /run/zerolayer/bpf" in journal, journal
        assert sorted(p.name for p in (bpffs / "zerolayer").iterdir()) == [
            "allow", "allow_config", "flows", "ports", "verdicts"]  # fmt: skip
        assert bpffs.stat().st_mode & 0o777 == 0o700
        ask = ["/opt/zerolayer/bin/python", "-c", BOX_CLIENT, "GET", "/readyz"]
        reply = json.loads(box.run(ask, timeout=60).stdout)
        assert reply["status"] == 200, reply
        verify = box.run(["systemd-analyze", "verify", "zerolayer.service", "zerolayer-tls-init.service"],
                         check=False)  # fmt: skip
        assert verify.returncode == 0 and not (verify.stdout + verify.stderr).strip(), verify.stdout + verify.stderr
