"""Boot a built root with systemd as PID 1 in a container (systemd-nspawn --boot), and run commands
inside it (nsenter into all of its namespaces). For the image test and for a look by hand.

--volatile=overlay: the container writes to a tmpfs laid over the root, so the built tree is left
as it was and every boot is a first boot (empty machine-id, presets applied). --private-network: the
container gets its own loopback only, so its port 8443 and its networkd touch nothing of the host.
--register=no --keep-unit: there is no systemd-machined or host D-Bus on these build machines."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Container:
    name: str
    leader: int  # the container's PID 1 (its systemd), as the host sees it
    log: Path  # the console: systemd's boot messages

    def run(self, argv: Sequence[str], timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        """ARGV inside the container: its mounts, PIDs, network, as root."""
        cmd = ["nsenter", "-t", str(self.leader), "-a", "--", *argv]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} in {self.name} failed ({result.returncode}): "
                               f"{(result.stdout + result.stderr).strip()[-2000:]}")  # fmt: skip
        return result

    def systemctl(self, *args: str, check: bool = True) -> str:
        return self.run(["systemctl", "--no-pager", *args], check=check).stdout.strip()


def _container_init(nspawn_pid: int) -> int | None:
    """The child of nspawn that is PID 1 in its own PID namespace."""
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            if int(fields["PPid"]) == nspawn_pid and fields.get("NSpid", "").split()[-1] == "1":
                return int(status.parent.name)
    return None


@contextlib.contextmanager
def booted(root: Path, name: str, log: Path, timeout: float = 120,
           extra: Sequence[str] = ()) -> Iterator[Container]:  # fmt: skip
    """Boot ROOT, wait until its systemd answers, yield; power it off (or kill it) on the way out."""
    cmd = ["systemd-nspawn", f"--directory={root}", "--boot", "--register=no", "--keep-unit",
           "--console=read-only", "--volatile=overlay", f"--machine={name}", "--private-network", *extra]  # fmt: skip
    with log.open("w") as out:
        # Its own session: the container's shutdown signals never reach the caller.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + timeout
        leader = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {proc.returncode}: {log.read_text()[-3000:]}")
            leader = leader or _container_init(proc.pid)
            if leader and Path(f"/proc/{leader}/root/run/systemd/private").exists():
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"{name}: systemd did not come up within {timeout} s: {log.read_text()[-3000:]}")
        assert leader is not None
        yield Container(name, leader, log)
    finally:
        _shut_down(proc, name)


def _shut_down(proc: subprocess.Popen[bytes], name: str) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)  # nspawn asks the container's systemd to power off
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
