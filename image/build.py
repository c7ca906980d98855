"""`zerolayer image build`: a Debian root with Zerolayer installed and enabled, and the files to
flash it from, in numbered, timed steps. Every step is in its own module; this one only orders
them and writes down what went in (manifest.json) and the digests of what came out (SHA256SUMS)."""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

from appliance import __version__, layout
from firmware.manifest import sha256_file
from firmware.toolchain.build import Progress, _stderr_progress, _Step
from image import bootdisk, disk, rootfs, slots, sources, wheels
from image.tools import run_tool

ARCHES = ("amd64", "arm64")


@dataclass(frozen=True)
class Image:
    out: Path
    root: Path  # the tree the files were made from (boot it with systemd-nspawn -D)
    tar: Path
    ext4: Path
    disk: Path
    manifest: Path
    sums: Path
    base_cached: bool  # the debootstrap base came from the cache


def build_image(arch: str, firmware: Path, out: Path, trusted_keys: Path, *, update_ca: Path | None = None,
                dev: bool = False, version: str = __version__, mirror: str | None = None, cache: Path,
                progress: Progress = _stderr_progress) -> Image:  # fmt: skip
    """UPDATE_CA: the certificate the amd64 image trusts for system updates (RAUC's keyring); DEV:
    the keys are development keys, which the image's manifest and `zerolayer status` then say."""
    if arch not in ARCHES:
        raise ValueError(f"--arch {arch}: one of {', '.join(ARCHES)}")
    if arch == "amd64" and update_ca is None:
        raise ValueError("an amd64 image needs the update CA it trusts (--update-ca), or --dev")
    if os.geteuid() != 0:
        raise PermissionError("building an image needs root (debootstrap, file owners, nspawn): run it with sudo")
    layout.check_sources()
    # Absolute: the tools given --root (systemd-sysusers, systemctl) read relative paths differently.
    out, firmware, trusted_keys = out.resolve(), firmware.resolve(), trusted_keys.resolve()
    (cache / "image").mkdir(parents=True, exist_ok=True)
    # One build per architecture at a time: they share the cached base and the wheelhouse.
    with (cache / "image" / f".build-{arch}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(arch, firmware, out, trusted_keys, update_ca, dev, version, mirror, cache, progress)


def _build(arch: str, firmware: Path, out: Path, trusted_keys: Path, update_ca: Path | None, dev: bool,
           version: str, mirror: str | None, cache: Path, progress: Progress) -> Image:  # fmt: skip
    found = sources.read_sources()
    mirror = mirror or sources.debian_mirror(found, rootfs.SUITE)
    try:
        security: str | None = sources.debian_mirror(found, f"{rootfs.SUITE}-security")
    except LookupError:
        security = None
        progress(f"no apt source names {rootfs.SUITE}-security: the image gets {rootfs.SUITE}-updates only")
    out.mkdir(parents=True, exist_ok=True)
    stem = f"zerolayer-{version}-{arch}"
    step = _Step(11 if update_ca is not None else 10, progress)

    t = step(f"Debian {rootfs.SUITE} {arch} base with its updates (debootstrap from {mirror}, cached in "
             f"{cache / 'image'})")  # fmt: skip
    base, made = rootfs.base_root(arch, mirror, security, cache)
    step.done(t)
    if not made:
        progress("      (from the cache)")
    t = step(f"copying the base into {out / 'rootfs'}")
    root = out / "rootfs"
    rootfs.copy_root(base, root)
    step.done(t)

    t = step(f"wheelhouse: zerolayer and its runtime wheels for {arch}, Python {wheels.PYTHON_VERSION}")
    house = cache / "image" / f"wheelhouse-{arch}"
    wheel_files = wheels.build_wheelhouse(house, arch, cache / "image" / "pip")
    step.done(t)

    t = step(f"virtualenv {layout.VENV}, installed offline from the wheelhouse (inside the root)")
    if arch != rootfs.host_arch():
        rootfs.enable_binfmt(arch)
    rootfs.run_in(root, ["python3", "-m", "venv", "--system-site-packages", layout.VENV])
    rootfs.run_in(root, [f"{layout.VENV}/bin/pip", "install", "--quiet", "--no-index", "--no-cache-dir",
                         "--disable-pip-version-check", "--find-links", "/mnt/wheelhouse", *wheels.to_install()],
                  binds=[(house, "/mnt/wheelhouse")])  # fmt: skip
    step.done(t)

    t = step("units (enabled), sysusers, tmpfiles, /etc/zerolayer, trusted keys, firmware, empty machine-id")
    installed = layout.populate(root, firmware, trusted_keys)
    (root / layout.IMAGE_INFO).write_text(slots.image_info(version, arch, dev))
    step.done(t)

    t = step("checking `zerolayer --version` runs inside the root" + (" (under qemu-user)" if arch == "arm64" else ""))
    said = rootfs.run_in(root, ["/usr/local/bin/zerolayer", "--version"]).strip()
    if said != f"zerolayer {__version__}":
        raise RuntimeError(f"zerolayer --version inside the root said {said!r}")
    step.done(t)

    if update_ca is not None:
        t = step("A/B slot: read-only root, data partition mounts, RAUC and its update CA, the health unit")
        slots.make_slot_root(root, update_ca)
        step.done(t)

    t = step(f"root file system tar {stem}.rootfs.tar")
    tar = out / f"{stem}.rootfs.tar"
    # Numeric owners: the root's own passwd names the users, not the build machine's. Paths start
    # with ./, as NVIDIA's L4T flashing tools expect when the tar is unpacked into rootfs/.
    run_tool("tar", "--create", "--file", str(tar), "--numeric-owner", "--xattrs", "--xattrs-include=*", "--acls",
             "--sparse", "-C", str(root), ".")  # fmt: skip
    step.done(t)

    t = step(f"ext4 file system {stem}.ext4 (mkfs.ext4 -d)")
    ext4 = out / f"{stem}.ext4"
    used = disk.used_bytes(root)
    # A slot's root is read-only (state lives on the data partition): it needs no room to grow.
    disk.make_ext4(root, ext4, disk.fs_size(used, 0.1, 64 * disk.MIB) if update_ca else disk.fs_size(used))
    step.done(t)

    img = out / f"{stem}.img"
    if update_ca is not None:
        t = step(f"GPT disk image {stem}.img: ESP with GRUB, root slots A and B, data partition")
        make_ab_disk(ext4, img, version)
    else:
        t = step(f"GPT disk image {stem}.img (one root partition, label {disk.LABEL})")
        disk.make_gpt(ext4, img, arch)
    step.done(t)

    t = step("manifest.json and SHA256SUMS")
    manifest = out / "manifest.json"
    doc = {
        "zerolayer": __version__,
        "version": version,
        "dev": dev,
        "update_ca": sha256_file(update_ca) if update_ca else None,
        "source": _git_describe(),
        "arch": arch,
        "debian": {"suite": rootfs.SUITE, "mirror": mirror, "security": security,
                   "packages": _debian_packages(root)},
        "python": wheels.PYTHON_VERSION,
        "wheels": _installed_wheels(root, wheel_files),
        "firmware": {"name": installed.firmware_name, "version": installed.firmware_version,
                     "signer": installed.firmware_signer, "path": f"/{layout.STORE}/{installed.firmware_dir}"},
        "trusted_keys": list(installed.trusted_key_ids),
        "built": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "builder": platform.node(),
    }  # fmt: skip
    manifest.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    sums = out / "SHA256SUMS"
    sums.write_text("".join(f"{sha256_file(p)}  {p.name}\n" for p in (tar, ext4, img, manifest)))
    step.done(t)
    progress(step.summary(f"image {stem}", [tar, ext4, img, manifest, sums]))
    return Image(out, root, tar, ext4, img, manifest, sums, not made)


def make_ab_disk(root_fs: Path, out: Path, version: str) -> list[bootdisk.Partition]:
    """The bootable disk around ROOT_FS (a slot's file system, in slot A; VERSION is what RAUC's
    status says slot A holds)."""
    esp, data = out.with_suffix(".esp"), out.with_suffix(".data")
    try:
        bootdisk.make_esp(esp)
        slots.make_data_fs(data, bootdisk.DATA_BYTES, version)
        return bootdisk.make_disk(esp, root_fs, data, out, bootdisk.slot_size(root_fs.stat().st_size))
    finally:
        esp.unlink(missing_ok=True)
        data.unlink(missing_ok=True)


def _installed_wheels(root: Path, wheel_files: list[Path]) -> list[dict[str, str]]:
    """Name and version of every distribution in the venv, with the sha256 of the wheel it came from."""
    by_name = {_norm(w.name.split("-")[0]): w for w in wheel_files}
    found = []
    for meta in sorted(root.glob(f"{layout.VENV.lstrip('/')}/lib/python3*/site-packages/*.dist-info/METADATA")):
        fields = dict(line.split(": ", 1) for line in meta.read_text().splitlines()[:10] if ": " in line)
        name, version = fields.get("Name", ""), fields.get("Version", "")
        if name in ("pip", "setuptools"):  # the venv's own, from Debian's ensurepip
            continue
        wheel = by_name.get(_norm(name))
        found.append({"name": name, "version": version, "wheel": wheel.name if wheel else "",
                      "sha256": sha256_file(wheel) if wheel else ""})  # fmt: skip
    return found


def _debian_packages(root: Path) -> dict[str, str]:
    out = run_tool("dpkg-query", f"--admindir={root / 'var/lib/dpkg'}", "--show",
                   "--showformat=${Package} ${Version}\\n")
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def _git_describe() -> str:
    result = subprocess.run(["git", "-C", str(layout.REPO), "describe", "--always", "--dirty"],
                            capture_output=True, text=True, check=False)  # fmt: skip
    return result.stdout.strip() or "unknown"


def _norm(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")
