"""Firmware on the box: install a bundle beside the running one and switch to it atomically, or
roll back to the one before.

The store (/usr/lib/zerolayer/firmware) holds one directory per installed bundle and two symbolic
links per slot: `current`, which the daemon loads (`firmware.path`), and `previous`, where a
rollback goes. A bundle served beside it (`--beside NAME`, a `[firmware.bundles]` entry) has its
own slot, the links `NAME` and `NAME.previous`. A switch renames a freshly made link over the old
one, so a reader (the daemon starting, a power cut) sees either the old bundle or the new one,
never neither. Only bundles some link names are kept, so repeated installs do not fill the disk.

Nothing is written before the bundle verifies, and the copy is verified again before `current`
points to it: what the daemon loads is exactly what was checked.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from firmware.bundle import TrustedKeys, verify
from firmware.manifest import MANIFEST_NAME, Manifest

DEFAULT_STORE = Path("/usr/lib/zerolayer/firmware")
CURRENT = "current"
PREVIOUS = "previous"
SERVICE = "zerolayer.service"
# A slot beside `current` is named as its model is (appliance/config.py reads the same pattern).
SLOT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

# Tells the daemon to pick up the switched bundle; returns one line for the operator.
Apply = Callable[[], str]


class InstallError(Exception):
    """The store cannot do what was asked (nothing to roll back to, a broken link). Says what to do."""


@dataclass(frozen=True)
class Switched:
    """The store after an install or a rollback."""

    current: str
    previous: str | None
    removed: tuple[str, ...]  # bundle directories dropped to keep only current and previous
    applied: str  # what Apply said (the daemon restarted, or why not)
    changed: bool = True  # False: the bundle was already current, nothing was switched


def bundle_dir_name(manifest: Manifest, manifest_bytes: bytes) -> str:
    """NAME-VERSION-DIGEST: two builds of one version never share a directory."""
    return f"{manifest.name}-{manifest.version}-{hashlib.sha256(manifest_bytes).hexdigest()[:12]}"


def read_link(store: Path, name: str) -> str | None:
    """The directory a store link names, or None when the link is absent."""
    link = store / name
    if not link.is_symlink():
        if link.exists():
            raise InstallError(f"{link} is not a symbolic link: move it away, then install again")
        return None
    target = os.readlink(link)
    if "/" in target:
        raise InstallError(f"{link} points outside the store ({target}): remove it, then install again")
    return target


def slot_links(slot: str = CURRENT) -> tuple[str, str]:
    """A slot's two links: `current` and `previous`, or NAME and NAME.previous for one beside them."""
    if slot == CURRENT:
        return CURRENT, PREVIOUS
    if not SLOT_NAME.fullmatch(slot) or slot == PREVIOUS or slot.endswith(".previous"):
        raise InstallError(f"{slot!r} cannot name a slot: use a model name (letters, digits, '.', '_', ':', '-') "
                           "other than current and previous")  # fmt: skip
    return slot, f"{slot}.previous"


def install(bundle: Path, trusted_keys: TrustedKeys, apply: Apply, store: Path = DEFAULT_STORE,
            slot: str = CURRENT) -> Switched:  # fmt: skip
    """Verify BUNDLE, copy it into the store, verify the copy, make it the slot's current, then apply."""
    now_link, before_link = slot_links(slot)
    manifest, _ = verify(bundle, trusted_keys)  # refused here: nothing in the store was touched
    manifest_bytes = (bundle / MANIFEST_NAME).read_bytes()
    name = bundle_dir_name(manifest, manifest_bytes)
    store.mkdir(parents=True, exist_ok=True)
    with _locked(store):
        current, previous = read_link(store, now_link), read_link(store, before_link)
        if current == name:
            return Switched(name, previous, (), "already current: nothing switched, the daemon left as it is", False)
        staging = Path(tempfile.mkdtemp(prefix=f".staging-{name}-", dir=store))
        try:
            shutil.copytree(bundle, staging, dirs_exist_ok=True)
            _readable(staging)
            verify(staging, trusted_keys)  # the copy, not the source, is what the daemon will load
            final = store / name
            if final.exists():  # installed before and since dropped from current: replace it whole
                shutil.rmtree(final)
            staging.rename(final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        os.sync()  # the files are on disk before a link points at them
        return _switch(store, (now_link, before_link), name, current, apply)


def rollback(trusted_keys: TrustedKeys, apply: Apply, store: Path = DEFAULT_STORE, slot: str = CURRENT) -> Switched:
    """Make the slot's previous bundle current again (and the current one previous, so a second
    rollback undoes it)."""
    links = slot_links(slot)
    with _locked(store):
        current, previous = read_link(store, links[0]), read_link(store, links[1])
        if previous is None or not (store / previous).is_dir():
            beside = f" --beside {slot}" if slot != CURRENT else ""
            raise InstallError(f"no previous firmware in {store} to roll back to: install the bundle you want "
                               f"with `zerolayer firmware install{beside} BUNDLE`")  # fmt: skip
        verify(store / previous, trusted_keys)  # a bundle damaged since is refused, and nothing changes
        return _switch(store, links, previous, current, apply)


def remove(slot: str, apply: Apply, store: Path = DEFAULT_STORE) -> tuple[str, ...]:
    """Drop a slot beside `current` (its two links, and the bundles no other link names), then apply."""
    links = slot_links(slot)
    if slot == CURRENT:
        raise InstallError("the current firmware cannot be removed, only replaced (install) or rolled back")
    with _locked(store):
        if read_link(store, links[0]) is None:
            raise InstallError(f"no firmware slot {slot!r} in {store}")
        for link in links:
            (store / link).unlink(missing_ok=True)
        _fsync_dir(store)
        removed = _prune(store)
    apply()
    return removed


def _switch(store: Path, links: tuple[str, str], new: str, old: str | None, apply: Apply) -> Switched:
    # The previous link first: if we stop between the two renames, the current link is untouched
    # and the previous one already names the bundle it will name.
    if old is not None:
        _replace_link(store, links[1], old)
    _replace_link(store, links[0], new)
    _fsync_dir(store)
    removed = _prune(store)
    return Switched(new, old, removed, apply())


def _replace_link(store: Path, name: str, target: str) -> None:
    tmp = store / f".{name}.tmp-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, store / name)  # rename(2): atomic, the link is never absent


def _prune(store: Path) -> tuple[str, ...]:
    """Remove the bundle directories no link of any slot names."""
    keep = {os.readlink(link) for link in store.iterdir() if link.is_symlink()}
    removed = []
    for entry in sorted(store.iterdir()):
        if entry.is_symlink() or not entry.is_dir() or entry.name in keep:
            continue
        # Hidden: staging left by an install that was killed (we hold the lock, so none is live).
        shutil.rmtree(entry)
        if not entry.name.startswith("."):
            removed.append(entry.name)
    return tuple(removed)


def _readable(root: Path) -> None:
    """The daemon runs as user zerolayer: bundles are world-readable whatever the source's modes."""
    root.chmod(0o755)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _locked(store: Path) -> Iterator[None]:
    """One install or rollback at a time."""
    if not store.is_dir():
        raise InstallError(f"no firmware store at {store}: nothing was ever installed there (--store names another)")
    with (store / ".lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def restart_daemon(unit: str = SERVICE, systemd_root: Path = Path("/run/systemd/system")) -> str:
    """Apply a switch: restart the daemon if systemd runs it. A restart, not `systemctl reload`:
    SIGHUP re-reads the config but keeps the loaded engine, and a new bundle needs a new engine.
    The socket units hold the listening sockets meanwhile, so clients queue instead of being refused.
    """
    if not systemd_root.is_dir():
        return "systemd is not running here: no daemon was restarted (the new firmware loads at its next start)"
    state = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True, check=False)
    if state.stdout.strip() not in ("active", "reloading", "activating"):
        now = state.stdout.strip() or "unknown"
        return f"{unit} is {now}: not restarted (it loads the new firmware when it starts)"
    # Waits for READY=1: a bundle the daemon cannot load fails here, not silently later.
    result = subprocess.run(["systemctl", "try-restart", unit], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise InstallError(f"`systemctl try-restart {unit}` failed ({result.stderr.strip()}): see `systemctl "
                           f"status {unit}`; `zerolayer firmware rollback` returns to the previous bundle")  # fmt: skip
    return f"restarted {unit}: it serves the new firmware"


def serve_beside(conf_dir: Path, slot: str, store: Path = DEFAULT_STORE) -> Path:
    """The config drop-in that serves a slot's bundle under its name ([firmware.bundles]), written
    once (atomically); returns its path."""
    slot_links(slot)  # refuses a bad name
    drop_in = conf_dir / "conf.d" / f"60-firmware-{slot}.toml"
    text = f"# Written by `zerolayer firmware install --beside {slot}`.\n[firmware.bundles]\n" \
           f"{json.dumps(slot)} = {json.dumps(str(store / slot))}\n"  # fmt: skip
    if drop_in.is_file() and drop_in.read_text() == text:
        return drop_in
    drop_in.parent.mkdir(parents=True, exist_ok=True)
    tmp = drop_in.with_name(f".{drop_in.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, drop_in)
    return drop_in


def reload_daemon(unit: str = SERVICE, systemd_root: Path = Path("/run/systemd/system")) -> str:
    """Apply a change to a bundle served beside `current`: a reload (SIGHUP), which loads what
    changed and drains what was dropped while every other model keeps serving."""
    if not systemd_root.is_dir():
        return "systemd is not running here: no daemon was reloaded (the daemon serves the slot when it starts)"
    state = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True, check=False)
    if state.stdout.strip() not in ("active", "reloading"):
        now = state.stdout.strip() or "unknown"
        return f"{unit} is {now}: not reloaded (it serves the slot when it starts)"
    result = subprocess.run(["systemctl", "reload", unit], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise InstallError(f"`systemctl reload {unit}` failed ({result.stderr.strip()}): see `journalctl -u {unit}`")
    return f"reloaded {unit}: it loads the slot in the background (`journalctl -u {unit}` says when it serves it)"


def no_restart() -> str:
    return "--no-restart: no daemon was restarted (restart zerolayer.service to serve the new firmware)"
