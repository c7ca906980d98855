"""The root as files to flash: an ext4 file system made from the folder (`mkfs.ext4 -d`, no loop
mount, no root-owned mount points left behind), and a GPT disk image holding it as its one
partition. The partition carries the Discoverable Partitions type for the architecture's root, so
systemd (gpt-auto-generator, `systemd-nspawn -i`, `systemd-dissect`) finds it without an fstab."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from image.tools import run_tool

MIB = 1 << 20
SECTOR = 512
# The first partition starts at 1 MiB (the usual alignment); the backup GPT needs 33 sectors at
# the end, so 1 MiB is left there too.
FIRST_LBA = MIB // SECTOR
ROOT_TYPES = {  # Discoverable Partitions Specification: "Root Partition (x86-64)" / "(64-bit ARM)"
    "amd64": "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709",
    "arm64": "B921B045-1DF0-41C3-AF44-4C6F280D3FAE",
}
LABEL = "zerolayer-root"


@dataclass(frozen=True)
class Partition:
    number: int
    label: str
    type: str
    offset: int  # bytes from the start of the disk
    size: int

    @property
    def first_lba(self) -> int:
        return self.offset // SECTOR

    @property
    def last_lba(self) -> int:
        return (self.offset + self.size) // SECTOR - 1


@dataclass(frozen=True)
class DiskLayout:
    disk_bytes: int  # the whole GPT image
    root: Partition  # the ext4 file system's partition


def fs_size(used_bytes: int, headroom: float = 0.25, spare: int = 256 * MIB) -> int:
    """The file system for a root of USED bytes: ext4's own overhead (inodes, journal) and room for
    firmware installs and state (a previous bundle is kept beside the current one), in whole MiB."""
    wanted = int(used_bytes * (1 + headroom)) + spare
    return -(-wanted // MIB) * MIB


def layout(fs_bytes: int, arch: str) -> DiskLayout:
    """One root partition of FS_BYTES, 1 MiB in, and 1 MiB after it for the backup GPT."""
    if fs_bytes % MIB:
        raise ValueError(f"file system size {fs_bytes} is not a whole number of MiB")
    return DiskLayout(disk_bytes=MIB + fs_bytes + MIB, root=Partition(1, LABEL, ROOT_TYPES[arch], MIB, fs_bytes))


def used_bytes(root: Path) -> int:
    """What the root takes on disk (du), hard links counted once."""
    out = subprocess.run(["du", "-s", "--block-size=1", str(root)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def make_ext4(root: Path, out: Path, size: int, label: str = LABEL) -> None:
    out.unlink(missing_ok=True)
    # ^orphan_file: e2fsprogs 1.47 turns it on by default, and kernels before 5.15 (Jetson's L4T 35
    # runs 5.10) refuse to mount such a file system read-write.
    run_tool("mkfs.ext4", "-q", "-F", "-L", label, "-O", "^orphan_file", "-E", "root_owner=0:0",
         "-d", root, out, f"{size // 1024}k")  # fmt: skip


def make_gpt(fs_image: Path, out: Path, arch: str) -> DiskLayout:
    plan = layout(fs_image.stat().st_size, arch)
    write_gpt(out, plan.disk_bytes, [plan.root], {1: fs_image})
    return plan


def write_gpt(out: Path, disk_bytes: int, parts: Sequence[Partition], contents: Mapping[int, Path]) -> None:
    """OUT: a sparse disk of DISK_BYTES with PARTS in its GPT, each file system in CONTENTS (by
    partition number) copied to its partition's offset; a partition without one stays empty."""
    for part in parts:
        fs = contents.get(part.number)
        if fs is not None and fs.stat().st_size > part.size:
            raise ValueError(f"{fs} ({fs.stat().st_size} bytes) is larger than partition {part.label} "
                             f"({part.size} bytes)")  # fmt: skip
    out.unlink(missing_ok=True)
    with out.open("wb") as f:
        f.truncate(disk_bytes)  # sparse: the image takes only what the file systems use
    args: list[str | Path] = ["sgdisk", "--clear"]
    for p in parts:
        args += [f"--new={p.number}:{p.first_lba}:{p.last_lba}", f"--typecode={p.number}:{p.type}",
                 f"--change-name={p.number}:{p.label}"]  # fmt: skip
    run_tool(*args, out)
    for p in parts:
        if p.number in contents:
            run_tool("dd", f"if={contents[p.number]}", f"of={out}", f"bs={MIB}", f"seek={p.offset // MIB}",
                     "conv=notrunc,sparse", "status=none")  # fmt: skip
