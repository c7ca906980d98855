"""The amd64 image as a disk that boots on its own and updates itself: GPT with an EFI system
partition (GRUB), two root slots (A and B, RAUC's) and a data partition for what outlives an update.

Boot: OVMF or the box's UEFI starts GRUB from the ESP's removable-media path. GRUB's script picks
the slot as RAUC's GRUB backend expects (grubenv's ORDER, A_OK/A_TRY, B_OK/B_TRY): the first slot
in ORDER that is good and not already being tried; it sets that slot's TRY before booting it, so
a slot that never gets marked good (zerolayer-slot-health.service, after the daemon serves) is
not booted again, and the next boot falls back to the other slot. The kernel and initramfs are the
slot's own (Debian's, at /vmlinuz and /initrd.img in the slot), so an update replaces them too.

Made with no loop device and no mount: mkfs.vfat -C and mtools for the ESP, mkfs.ext4 -d for the
file systems, sgdisk for the table, dd to place them."""

from __future__ import annotations

import tempfile
from pathlib import Path

from image.disk import MIB, ROOT_TYPES, Partition, write_gpt
from image.tools import run_tool

ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
DATA_TYPE = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"  # "Linux filesystem": systemd-repart's linux-generic
ESP_LABEL = "zerolayer-esp"
DATA_LABEL = "zerolayer-data"
SLOTS = ("A", "B")
ESP_BYTES = 64 * MIB
# The data partition as flashed; the first boot grows it to the end of the disk (systemd-repart).
DATA_BYTES = 128 * MIB
SLOT_ALIGN = 256 * MIB
GRUB_DIR = "EFI/BOOT"  # the removable-media path: found with no NVRAM boot entry
# GRUB's modules, built into one EFI program (grub-mkimage from grub-efi-amd64-bin on the builder).
GRUB_MODULES = ("part_gpt", "fat", "ext2", "normal", "linux", "echo", "test", "loadenv", "regexp",
                "serial", "terminal", "gzio", "all_video", "efi_gop", "sleep", "reboot", "configfile")  # fmt: skip
KERNEL_ARGS = "ro rootwait console=tty0 console=ttyS0,115200 panic=10"


def slot_label(slot: str) -> str:
    return f"zerolayer-root-{slot.lower()}"


def slot_size(root_fs_bytes: int) -> int:
    """A root slot: room for a root half as big again as this one (an update may grow), in 256 MiB."""
    wanted = root_fs_bytes + root_fs_bytes // 2
    return -(-wanted // SLOT_ALIGN) * SLOT_ALIGN


def ab_layout(slot_bytes: int) -> list[Partition]:
    """ESP, root A, root B, data, in that order from 1 MiB; the data partition last, so it can grow."""
    if slot_bytes % MIB:
        raise ValueError(f"slot size {slot_bytes} is not a whole number of MiB")
    parts, offset = [], MIB
    for number, (label, kind, size) in enumerate(
        [(ESP_LABEL, ESP_TYPE, ESP_BYTES), *((slot_label(s), ROOT_TYPES["amd64"], slot_bytes) for s in SLOTS),
         (DATA_LABEL, DATA_TYPE, DATA_BYTES)], start=1):  # fmt: skip
        parts.append(Partition(number, label, kind, offset, size))
        offset += size
    return parts


def disk_size(parts: list[Partition]) -> int:
    return parts[-1].offset + parts[-1].size + MIB  # the backup GPT at the end


def grub_config() -> str:
    """The ESP's grub.cfg: pick a slot by RAUC's grubenv variables, count the try, boot it."""
    slots = " ".join(SLOTS)
    pick = "".join(
        f'    if [ "$s" = "{s}" ]; then ok="${s}_OK"; try="${s}_TRY"; {s}_TRY=1; fi\n' for s in SLOTS
    )
    boots = "".join(
        f'if [ "$slot" = "{s}" ]; then part=gpt{n}; label={slot_label(s)}; fi\n' for n, s in enumerate(SLOTS, start=2)
    )
    return f"""# Zerolayer: A/B boot with RAUC's GRUB backend (image/bootdisk.py). No menu: the slot is chosen here.
serial --unit=0 --speed=115200
terminal_input serial console
terminal_output serial console
# The disk GRUB was started from holds the slots too.
regexp --set=1:disk '^([^,]+)' "$root"
set ORDER="{slots}"
{"".join(f"set {s}_OK=0{chr(10)}set {s}_TRY=0{chr(10)}" for s in SLOTS)}load_env
echo "Zerolayer: slot order $ORDER; {", ".join(f"{s}_OK=${s}_OK {s}_TRY=${s}_TRY" for s in SLOTS)}"
set slot=""
for s in $ORDER; do
{pick}    if [ "$ok" = "1" -a "$try" = "0" ]; then slot="$s"; break; fi
done
if [ -z "$slot" ]; then
    # Nothing good left to try: boot the first slot in ORDER anyway, so the box stays reachable.
    for s in $ORDER; do slot="$s"; break; done
    echo "Zerolayer: no slot is marked good and untried; booting $slot"
fi
save_env ORDER {" ".join(f"{s}_OK {s}_TRY" for s in SLOTS)}
{boots}# The box's machine-id, kept here by zerolayer-machine-id.service: /etc is read-only in every slot.
set idarg=""
if [ -n "$MACHINE_ID" ]; then idarg="systemd.machine_id=$MACHINE_ID"; fi
echo "Zerolayer: booting slot $slot"
linux ($disk,$part)/vmlinuz root=PARTLABEL=$label {KERNEL_ARGS} rauc.slot=$slot $idarg
initrd ($disk,$part)/initrd.img
boot
"""


def make_grubenv(path: Path) -> None:
    """Slot A good and booted first; slot B empty until the first update."""
    path.unlink(missing_ok=True)
    run_tool("grub-editenv", path, "create")
    run_tool("grub-editenv", path, "set", f"ORDER={' '.join(SLOTS)}", "A_OK=1", "A_TRY=0", "B_OK=0", "B_TRY=0")


def make_esp(out: Path, size: int = ESP_BYTES) -> None:
    """FAT32 with GRUB as EFI/BOOT/BOOTX64.EFI, its grub.cfg and the grubenv beside it."""
    out.unlink(missing_ok=True)
    run_tool("mkfs.vfat", "-F", "32", "-n", "ZL-ESP", "-C", out, str(size // 1024))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        grub = work / "BOOTX64.EFI"
        run_tool("grub-mkimage", "--format=x86_64-efi", f"--output={grub}", f"--prefix=/{GRUB_DIR}", *GRUB_MODULES)
        (work / "grub.cfg").write_text(grub_config())
        make_grubenv(work / "grubenv")
        run_tool("mmd", "-i", out, "::/EFI", f"::/{GRUB_DIR}")
        for name in ("BOOTX64.EFI", "grub.cfg", "grubenv"):
            run_tool("mcopy", "-i", out, work / name, f"::/{GRUB_DIR}/{name}")


def make_disk(esp: Path, root_fs: Path, data_fs: Path, out: Path, slot_bytes: int) -> list[Partition]:
    """The GPT disk: ESP, slot A holding ROOT_FS, an empty slot B, the data partition."""
    parts = ab_layout(slot_bytes)
    write_gpt(out, disk_size(parts), parts, {1: esp, 2: root_fs, 4: data_fs})
    return parts
