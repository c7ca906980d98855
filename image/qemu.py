"""Boot the amd64 disk image in QEMU with UEFI (OVMF), as a box would boot it: for the A/B test
(`make image-test`) and for a look by hand. Serial port 0 is the console (kernel, systemd, GRUB),
written to a file; ports forwarded from the host reach the box's 8443 over UDP (HTTP/3) and TCP.

Tests that must run commands inside add a command runner on serial port 1 to the root they boot
(`add_test_shell`, never in a shipped image): each command goes in base64 and comes back with its
exit status, so nothing depends on a terminal's echo or line endings."""

from __future__ import annotations

import base64
import contextlib
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
SHELL_UNIT = "zerolayer-test-shell.service"
_SHELL = r"""#!/bin/bash
# Tests only (image/qemu.py): run base64 commands from serial port 1, answer with status and output.
exec </dev/ttyS1 >/dev/ttyS1 2>&1
stty raw -echo
echo "@@ready@@"
while read -r id cmd; do
    # The x keeps the output's trailing newlines, which $(...) would strip.
    out=$(printf '%s' "$cmd" | base64 -d | bash 2>&1; r=$?; echo x; exit $r)
    rc=$?
    out=${out%x}
    printf '@@%s %s %s %s@@\n' "$id" "$rc" "$(printf '%s' "$out" | wc -c)" "$(printf '%s' "$out" | base64 -w0)"
done
"""


def add_test_shell(root: Path) -> None:
    """The command runner on serial port 1, enabled in ROOT (a root folder before its file system is made)."""
    script = root / "usr/local/sbin/zerolayer-test-shell"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(_SHELL)
    script.chmod(0o755)
    (root / "usr/lib/systemd/system" / SHELL_UNIT).write_text(
        "[Unit]\nDescription=Test command runner on ttyS1 (tests only)\nDefaultDependencies=no\n"
        "After=local-fs.target\nConditionVirtualization=!container\nConditionPathExists=/dev/ttyS1\n\n[Service]\nExecStart=/usr/local/sbin/zerolayer-test-shell\nRestart=always\n"
        "\n[Install]\nWantedBy=multi-user.target\n"
    )
    subprocess.run(["systemctl", f"--root={root}", "enable", SHELL_UNIT], check=True, capture_output=True)


@dataclass
class Machine:
    process: subprocess.Popen[bytes]
    console: Path
    shell_path: Path
    ports: dict[str, int]  # "udp"/"tcp" -> the host port forwarded to the box's 8443
    _shell: socket.socket | None = None
    _buffer: bytes = b""
    _next_id: int = 0

    def console_text(self) -> str:
        return self.console.read_text(errors="replace")

    def wait_console(self, pattern: str, timeout: float, after: int = 0) -> re.Match[str]:
        """The first match of PATTERN in the console past offset AFTER, waiting up to TIMEOUT s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"qemu exited {self.process.returncode}: {self.console_text()[-3000:]}")
            found = re.compile(pattern).search(self.console_text(), after)
            if found:
                return found
            time.sleep(0.5)
        raise TimeoutError(f"no {pattern!r} on the console within {timeout} s: {self.console_text()[-3000:]}")

    def _connect(self, timeout: float) -> socket.socket:
        if self._shell is None:
            self._shell = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._shell.connect(str(self.shell_path))
        self._shell.settimeout(timeout)
        return self._shell

    def run(self, command: str, timeout: float = 120, check: bool = True) -> tuple[int, str]:
        """COMMAND (bash) inside the box; its exit status and output. Waits for the runner to start."""
        sock = self._connect(timeout)
        self._next_id += 1
        ident = str(self._next_id)
        sock.sendall(f"{ident} {base64.b64encode(command.encode()).decode()}\n".encode())
        pattern = re.compile(rb"@@" + ident.encode() + rb" (\d+) (\d+) ([^@]*)@@")
        deadline = time.monotonic() + timeout
        while True:
            found = pattern.search(self._buffer)
            if found:
                self._buffer = self._buffer[found.end():]
                rc, size, raw = int(found[1]), int(found[2]), found[3]
                try:
                    data = base64.b64decode(raw, validate=True)
                except ValueError:
                    data = b""
                if len(data) != size:  # the reply was garbled on the way: say so, never guess
                    raise RuntimeError(f"{command!r}: garbled reply ({len(raw)} characters for {size} bytes)")
                out = data.decode(errors="replace")
                if check and rc != 0:
                    raise RuntimeError(f"{command!r} in the box exited {rc}: {out[-2000:]}")
                return rc, out
            if time.monotonic() > deadline:
                raise TimeoutError(f"{command!r}: no answer within {timeout} s")
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                chunk = sock.recv(65536)
                if not chunk:
                    raise RuntimeError("the box's command runner closed")
                self._buffer += chunk

    def wait_shell(self, timeout: float) -> None:
        """Until the runner of this boot answers (after a reboot, the old one's replies are gone)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.run("true", timeout=min(10.0, max(1.0, deadline - time.monotonic())))
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
                self._buffer = b""


def _free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def booted(disk: Path, work: Path, memory_mib: int = 2048, extra_drives: Sequence[Path] = (),
           accel: str = "tcg") -> Iterator[Machine]:  # fmt: skip
    """Start DISK under QEMU (UEFI, virtio disk and network, 2 CPUs) and yield at once; the caller
    waits for what it needs on the console. Powered off on the way out."""
    if shutil.which("qemu-system-x86_64") is None or not OVMF_CODE.is_file():
        raise FileNotFoundError("qemu-system-x86_64 and OVMF are needed: apt-get install qemu-system-x86 ovmf")
    work.mkdir(parents=True, exist_ok=True)
    varstore = work / "OVMF_VARS.fd"
    shutil.copy(OVMF_VARS, varstore)  # the box's own UEFI variables, writable
    console, shell = work / "console.log", work / "shell.sock"
    shell.unlink(missing_ok=True)
    ports = {"udp": _free_port(socket.SOCK_DGRAM), "tcp": _free_port(socket.SOCK_STREAM)}
    cmd = [
        "qemu-system-x86_64", "-accel", accel, "-machine", "q35", "-cpu", "max", "-smp", "2", "-m", str(memory_mib),
        "-display", "none", "-nodefaults", "-no-user-config",
        "-drive", f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
        "-drive", f"if=pflash,format=raw,unit=1,file={varstore}",
        "-drive", f"if=virtio,format=raw,file={disk}",
        *(arg for d in extra_drives for arg in ("-drive", f"if=virtio,format=raw,readonly=on,file={d}")),
        "-netdev", f"user,id=net0,hostfwd=udp:127.0.0.1:{ports['udp']}-:8443,"
                   f"hostfwd=tcp:127.0.0.1:{ports['tcp']}-:8443",
        "-device", "virtio-net-pci,netdev=net0",
        "-serial", f"file:{console}", "-serial", f"unix:{shell},server=on,wait=off",
        "-device", "virtio-rng-pci",
    ]  # fmt: skip
    with (work / "qemu.log").open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    machine = Machine(proc, console, shell, ports)
    try:
        deadline = time.monotonic() + 30
        while not (shell.exists() and console.exists()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"qemu did not start: {(work / 'qemu.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield machine
    finally:
        if machine._shell is not None:
            machine._shell.close()
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
