"""The Debian base of the image: `debootstrap --variant=minbase` of one suite and architecture,
cached per machine (the base changes only with the package list or the mirror), and a way to run
commands inside a root (systemd-nspawn: it mounts /proc, /sys and /dev itself and leaves no mount
behind; a foreign root's programs run through qemu-user via binfmt_misc)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from image.tools import run_tool

# Debian 12: the systemd (252) the units are written and tested for, and the Python (3.11) the
# wheelhouse targets. Debian 13 would need both checked again.
SUITE = "bookworm"
PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "udev",  # the service manager the appliance is run by
    "python3", "python3-venv",  # the venv at /opt/zerolayer (venv brings ensurepip's pip)
    "python3-systemd",  # systemd-python, which has no wheels (see wheels.py)
    "libbpf1",  # the kernel layer loads its programs through libbpf.so.1
    "procps",  # /bin/kill, which zerolayer.service's ExecReload= runs (minbase has none)
    "iproute2",  # `ip` and `tc`, for the operator looking at the attached programs
)  # fmt: skip
# What the amd64 image needs to boot on its own and update itself (image/bootdisk.py): the
# Jetson root gets its kernel and boot loader from NVIDIA's BSP instead.
BOOT_PACKAGES = (
    "linux-image-amd64", "initramfs-tools",  # Debian's kernel; the initramfs mounts the slot's root
    "rauc", "rauc-service",  # A/B system updates; the service is what `rauc install` talks to
    "grub-common",  # grub-editenv: RAUC's GRUB backend keeps the slots' boot state in grubenv
    "e2fsprogs",  # resize2fs, which systemd-growfs needs to grow the data partition's file system
)  # fmt: skip
QEMU = {"arm64": "qemu-aarch64"}



def packages(arch: str) -> tuple[str, ...]:
    return PACKAGES + (BOOT_PACKAGES if arch == "amd64" else ())


def host_arch() -> str:
    return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()


def base_root(arch: str, mirror: str, security: str | None, cache: Path, suite: str = SUITE) -> tuple[Path, bool]:
    """The cached debootstrap root for ARCH, with Debian's updates (made if absent); True if it was
    made just now. SECURITY: the mirror of SUITE-security, or None to build without its fixes."""
    key = hashlib.sha256(repr((arch, suite, mirror, security, packages(arch))).encode()).hexdigest()[:12]
    home = cache / "image" / f"debian-{suite}-{arch}-{key}"
    if (home / "complete").is_file():
        return home / "root", False
    partial = home.with_name(home.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    root = partial / "root"
    foreign = arch != host_arch()
    run_tool("debootstrap", "--variant=minbase", f"--arch={arch}", f"--include={','.join(packages(arch))}",
             *(["--foreign"] if foreign else []), suite, str(root), mirror)  # fmt: skip
    if foreign:
        enable_binfmt(arch)
        # The second stage runs the packages' own scripts: arm64 programs, through qemu-user. In a
        # chroot: nspawn refuses a half-made root ("Failed to resolve /proc").
        try:
            run_tool("chroot", str(root), "/debootstrap/debootstrap", "--second-stage")
        finally:
            unmount_below(root)  # debootstrap mounts /proc and /sys inside, and may leave them
    upgrade(root, mirror, security, suite)
    slim(root)
    shutil.rmtree(home, ignore_errors=True)
    partial.rename(home)
    (home / "complete").write_text(f"{arch} {suite} {mirror}\n")
    for stale in home.parent.glob(f"debian-{suite}-{arch}-*"):  # made for an older package list
        if stale != home:
            shutil.rmtree(stale, ignore_errors=True)
    return home / "root", True


def unmount_below(root: Path) -> None:
    """Detach whatever is mounted inside ROOT, deepest first."""
    prefix = str(root.resolve()) + "/"
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False)


def upgrade(root: Path, mirror: str, security: str | None, suite: str) -> None:
    """Debian's fixes since the point release the suite holds (SUITE-updates, SUITE-security): the
    box never runs apt, so what it ships with is what it has. These sources stay in the image for
    an operator who does upgrade by hand."""
    lines = [f"deb {mirror} {suite} main", f"deb {mirror} {suite}-updates main"]
    if security is not None:
        lines.append(f"deb {security} {suite}-security main")
    (root / "etc/apt/sources.list").write_text("\n".join(lines) + "\n")
    run_in(root, ["sh", "-c", "apt-get update -qq && apt-get upgrade -y -qq"], network=True,
           env={"DEBIAN_FRONTEND": "noninteractive"})  # fmt: skip


def slim(root: Path) -> None:
    """Nothing is downloaded on the box: apt's package lists and downloaded .debs are dead weight."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*_*"):
        for path in root.glob(pattern):
            path.unlink()


def enable_binfmt(arch: str) -> None:
    """Let the kernel run ARCH's programs through qemu-user-static (binfmt_misc, mounted if needed)."""
    name = QEMU[arch]
    if not Path("/proc/sys/fs/binfmt_misc/register").exists():
        run_tool("mount", "-t", "binfmt_misc", "binfmt_misc", "/proc/sys/fs/binfmt_misc")
    if not Path(f"/proc/sys/fs/binfmt_misc/{name}").exists():
        if shutil.which("update-binfmts") is None:
            raise RuntimeError(f"cannot run {arch} programs: apt-get install qemu-user-static binfmt-support")
        run_tool("update-binfmts", "--enable", name)


def copy_root(base: Path, dest: Path) -> None:
    """A private copy of the cached base to build on (owners, modes, device nodes kept)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    run_tool("cp", "-a", "--reflink=auto", str(base), str(dest))


def run_in(root: Path, argv: Sequence[str], binds: Sequence[tuple[Path, str]] = (),
           env: dict[str, str] | None = None, network: bool = False) -> str:  # fmt: skip
    """Run ARGV inside ROOT, return its output. No network (--private-network) unless asked: the
    wheels are installed with nothing to fall back on but the wheelhouse.

    --register=no --keep-unit: this machine has neither systemd-machined nor a host D-Bus, and
    nspawn fails without them otherwise."""
    cmd = ["systemd-nspawn", "--quiet", f"--directory={root}", "--register=no", "--keep-unit", "--pipe",
           "--settings=no", "--timezone=off"]  # fmt: skip
    # With the network, the host's resolver (the root keeps its own resolv.conf afterwards).
    cmd += ["--resolv-conf=bind-host"] if network else ["--private-network", "--resolv-conf=off"]
    cmd += [f"--bind-ro={host}:{inside}" for host, inside in binds]
    cmd += [f"--setenv={k}={v}" for k, v in (env or {}).items()]
    return run_tool(*cmd, "--", *argv)
