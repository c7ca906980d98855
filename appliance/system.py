"""`zerolayer system ...` on an A/B image (image/README.md): the root slots RAUC manages, a system
update, and the boot-time verdict that marks the booted slot good or bad.

The core is pure: `parse_status` reads `rauc status --output-format=json`, `verdict` decides what a
boot's health check does. The runner around them calls rauc, systemctl and the daemon."""

from __future__ import annotations

import enum
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance import layout

IMAGE_INFO = Path("/") / layout.IMAGE_INFO


@dataclass(frozen=True)
class Slot:
    name: str  # RAUC's: rootfs.0
    bootname: str  # the boot loader's: A
    device: str
    booted: bool
    boot_status: str  # good or bad, as the boot loader will treat it ("" when RAUC does not say)
    version: str  # of the bundle installed into it ("" when none was)
    installed: str  # when ("" when never)


@dataclass(frozen=True)
class SystemStatus:
    compatible: str
    primary: str  # the slot the next boot tries first
    slots: tuple[Slot, ...]

    @property
    def booted(self) -> Slot | None:
        return next((s for s in self.slots if s.booted), None)

    def other(self, slot: Slot) -> Slot | None:
        return next((s for s in self.slots if s.name != slot.name), None)


def parse_status(text: str) -> SystemStatus:
    """`rauc status --detailed --output-format=json`: RAUC lists each slot as a one-key object."""
    doc = json.loads(text)
    slots = []
    for entry in doc.get("slots", []):
        for name, fields in entry.items():
            if fields.get("class") != "rootfs":
                continue
            status = fields.get("slot_status") or {}
            slots.append(Slot(
                name=name, bootname=fields.get("bootname") or "", device=fields.get("device") or "",
                booted=fields.get("state") == "booted", boot_status=fields.get("boot_status") or "",
                version=((status.get("bundle") or {}).get("version")) or "",
                installed=((status.get("installed") or {}).get("timestamp")) or "",
            ))  # fmt: skip
    return SystemStatus(doc.get("compatible") or "", doc.get("boot_primary") or "", tuple(slots))


def image_info(path: Path = IMAGE_INFO) -> dict[str, Any]:
    """The booted root's own record (version, development keys); empty where it is not an image."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def render(status: SystemStatus, info: dict[str, Any]) -> list[str]:
    booted = status.booted
    dev = " (development image: trusts development keys)" if info.get("dev") else ""
    lines = [f"booted: slot {booted.bootname if booted else '?'}, version {info.get('version', '?')}{dev}"]
    for slot in status.slots:
        state = "booted" if slot.booted else "inactive"
        next_boot = "  <- next boot" if slot.name == status.primary else ""
        lines.append(f"  slot {slot.bootname} ({slot.name}, {slot.device}): {state}, {slot.boot_status or '?'}, "
                     f"version {slot.version or '-'}, installed {slot.installed or '-'}{next_boot}")  # fmt: skip
    return lines


class Action(enum.Enum):
    MARK_GOOD = "mark-good"
    MARK_BAD_AND_REBOOT = "mark-bad-and-reboot"
    STAY = "stay"  # broken, but there is nothing better to boot


def verdict(serving: bool, status: SystemStatus) -> Action:
    """A slot that serves is good. One that does not is marked bad and left for the other slot, if
    that one is good; otherwise the box stays up on it, reachable, rather than reboot forever."""
    if serving:
        return Action.MARK_GOOD
    booted = status.booted
    other = status.other(booted) if booted else None
    return Action.MARK_BAD_AND_REBOOT if other is not None and other.boot_status == "good" else Action.STAY


# ----- the runner: rauc, systemctl, the daemon ----------------------------------------------------


def _run(argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)


def read_status() -> SystemStatus:
    result = _run(["rauc", "status", "--detailed", "--output-format=json"])
    if result.returncode != 0:
        raise RuntimeError(f"rauc status failed: {result.stderr.strip() or result.stdout.strip()}")
    return parse_status(result.stdout)


def _unit_state(unit: str) -> str:
    out = _run(["systemctl", "show", unit, "--property=ActiveState", "--value"]).stdout.strip()
    return out or "unknown"


def _answers(socket_path: str) -> str | None:
    """None when the daemon answers a request on its socket (a one-token completion of its first
    model); else why not."""
    from appliance.client import ApplianceClient

    client = ApplianceClient(socket_path, timeout=60)
    try:
        code, models = client.get_json("/v1/models")
        if code != 200 or not models.get("data"):
            return f"GET /v1/models answered {code}"
        body = {"model": models["data"][0]["id"], "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        reply = client.request("POST", "/v1/messages", body)
        text = "\n".join(reply.lines)
        return None if reply.status == 200 else f"POST /v1/messages answered {reply.status}: {text[:200]}"
    except (OSError, ValueError) as exc:
        return str(exc)


def wait_serving(deadline_s: float, socket_path: str, log: Callable[[str], None]) -> bool:
    """Until zerolayer.service is active and answers, or fails for good, or the deadline passes."""
    end, why = time.monotonic() + deadline_s, "not started"
    while time.monotonic() < end:
        state = _unit_state("zerolayer.service")
        if state == "failed":
            log("zerolayer.service failed (see journalctl -u zerolayer)")
            return False
        if state == "active":
            problem = _answers(socket_path)
            if problem is None:
                return True
            why = problem
        else:
            why = f"zerolayer.service is {state}"
        time.sleep(2)
    log(f"zerolayer did not serve within {deadline_s:.0f} s: {why}")
    return False


def mark_boot(timeout: float, socket_path: str, log: Callable[[str], None] = print) -> int:
    status = read_status()
    booted = status.booted
    if booted is None:
        log("rauc names no booted slot: not an A/B boot, nothing to mark")
        return 0
    serving = wait_serving(timeout, socket_path, log)
    action = verdict(serving, status)
    if action is Action.MARK_GOOD:
        _rauc_mark("good")
        log(f"slot {booted.bootname} serves: marked good")
        return 0
    if action is Action.MARK_BAD_AND_REBOOT:
        _rauc_mark("bad")
        log(f"slot {booted.bootname} does not serve: marked bad; rebooting into the other slot")
        _run(["systemctl", "reboot"])
        return 0
    # Exit 0: the unit's FailureAction=reboot is for a check that could not run at all.
    log(f"slot {booted.bootname} does not serve, and no other slot is good: staying on it. Fix it and "
        "run `zerolayer system mark-boot`, or install an update")  # fmt: skip
    return 0


def _rauc_mark(how: str) -> None:
    result = _run(["rauc", "status", f"mark-{how}", "booted"])
    if result.returncode != 0:  # the command fails, and the unit's FailureAction=reboot takes over
        raise RuntimeError(f"rauc status mark-{how} failed: {result.stderr.strip()}")


def update(bundle: Path, reboot: bool, log: Callable[[str], None] = print) -> int:
    """`rauc install`: verify the bundle against the update CA, write the inactive slot, make it
    the next boot's first try. The old slot stays as it was: the way back if the new one fails."""
    if not bundle.is_file():
        log(f"zerolayer: no update bundle at {bundle}")
        return 2
    result = subprocess.run(["rauc", "install", str(bundle)], text=True, check=False,
                            stdout=sys.stdout, stderr=sys.stderr)  # fmt: skip
    if result.returncode != 0:
        log(f"zerolayer: the update was not installed (rauc install exit {result.returncode}); nothing changed")
        return 1
    status = read_status()
    target = next((s for s in status.slots if s.name == status.primary), None)
    log(f"installed into slot {target.bootname if target else '?'}: the next boot tries it, and falls back if "
        "it does not serve")  # fmt: skip
    if reboot:
        _run(["systemctl", "reboot"])
    else:
        log("reboot to run it (systemctl reboot)")
    return 0
