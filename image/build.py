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
from image import disk, rootfs, sources, wheels

ARCHES = ("amd64", "arm64")
STEPS = 10


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


def build_image(arch: str, firmware: Path, out: Path, trusted_keys: Path, *, mirror: str | None = None,
                cache: Path, progress: Progress = _stderr_progress) -> Image:  # fmt: skip
    if arch not in ARCHES:
        raise ValueError(f"--arch {arch}: one of {', '.join(ARCHES)}")
    if os.geteuid() != 0:
        raise PermissionError("building an image needs root (debootstrap, file owners, nspawn): run it with sudo")
    layout.check_sources()
    # Absolute: the tools given --root (systemd-sysusers, systemctl) read relative paths differently.
    out, firmware, trusted_keys = out.resolve(), firmware.resolve(), trusted_keys.resolve()
    (cache / "image").mkdir(parents=True, exist_ok=True)
    # One build per architecture at a time: they share the cached base and the wheelhouse.
    with (cache / "image" / f".build-{arch}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(arch, firmware, out, trusted_keys, mirror, cache, progress)


def _build(arch: str, firmware: Path, out: Path, trusted_keys: Path, mirror: str | None, cache: Path,
           progress: Progress) -> Image:  # fmt: skip
    found = sources.read_sources()
    mirror = mirror or sources.debian_mirror(found, rootfs.SUITE)
    try:
        security: str | None = sources.debian_mirror(found, f"{rootfs.SUITE}-security")
    except LookupError:
        security = None
        progress(f"no apt source names {rootfs.SUITE}-security: the image gets {rootfs.SUITE}-updates only")
    out.mkdir(parents=True, exist_ok=True)
    stem = f"zerolayer-{__version__}-{arch}"
    step = _Step(STEPS, progress)

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
    step.done(t)

    t = step("checking `zerolayer --version` runs inside the root" + (" (under qemu-user)" if arch == "arm64" else ""))
    said = rootfs.run_in(root, ["/usr/local/bin/zerolayer", "--version"]).strip()
    if said != f"zerolayer {__version__}":
        raise RuntimeError(f"zerolayer --version inside the root said {said!r}")
    step.done(t)

    t = step(f"root file system tar {stem}.rootfs.tar")
    tar = out / f"{stem}.rootfs.tar"
    # Numeric owners: the root's own passwd names the users, not the build machine's. Paths start
    # with ./, as NVIDIA's L4T flashing tools expect when the tar is unpacked into rootfs/.
    _run(["tar", "--create", "--file", str(tar), "--numeric-owner", "--xattrs", "--xattrs-include=*", "--acls",
          "--sparse", "-C", str(root), "."])  # fmt: skip
    step.done(t)

    t = step(f"ext4 file system {stem}.ext4 (mkfs.ext4 -d)")
    ext4 = out / f"{stem}.ext4"
    disk.make_ext4(root, ext4, disk.fs_size(disk.used_bytes(root)))
    step.done(t)

    t = step(f"GPT disk image {stem}.img (one root partition, label {disk.LABEL})")
    img = out / f"{stem}.img"
    disk.make_gpt(ext4, img, arch)
    step.done(t)

    t = step("manifest.json and SHA256SUMS")
    manifest = out / "manifest.json"
    doc = {
        "zerolayer": __version__,
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
    out = _run(["dpkg-query", f"--admindir={root / 'var/lib/dpkg'}", "--show", "--showformat=${Package} ${Version}\\n"])
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def _git_describe() -> str:
    result = subprocess.run(["git", "-C", str(layout.REPO), "describe", "--always", "--dirty"],
                            capture_output=True, text=True, check=False)  # fmt: skip
    return result.stdout.strip() or "unknown"


def _norm(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _run(cmd: list[str]) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return result.stdout

