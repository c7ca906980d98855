"""Firmware install and rollback on the box (firmware/install.py): verify before anything is
written, switch `current` atomically, keep only current and previous, and leave the store as it
was when a bundle is refused. The daemon's restart is injected: here it only counts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from firmware import BundleError
from firmware.install import CURRENT, PREVIOUS, InstallError, install, read_link, remove, restart_daemon, rollback
from firmware.toolchain.build import sign
from firmware.toolchain.devkit import resigned_copy


class Restarts:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> str:
        self.count += 1
        return "restarted (test)"


@pytest.fixture()
def bundles(tiny_bundle_path: Path, dev_key: Path, tmp_path: Path) -> list[Path]:
    return [resigned_copy(tiny_bundle_path, tmp_path / f"v{i}", f"0.{i}.0", dev_key) for i in (1, 2, 3)]


def _snapshot(store: Path) -> dict[str, str]:
    """Every entry of the store: links with their targets, directories by name."""
    return {p.name: os.readlink(p) if p.is_symlink() else "dir" for p in store.iterdir() if p.name != ".lock"}


def test_install_switches_current_and_keeps_the_previous(bundles: list[Path], trusted_keys: Path,
                                                         tmp_path: Path) -> None:  # fmt: skip
    store, restarts = tmp_path / "store", Restarts()
    first = install(bundles[0], trusted_keys, restarts, store)
    assert first.previous is None and first.current.startswith("tiny-llama-0.1.0-")
    assert read_link(store, CURRENT) == first.current and read_link(store, PREVIOUS) is None
    second = install(bundles[1], trusted_keys, restarts, store)
    assert second.current.startswith("tiny-llama-0.2.0-") and second.previous == first.current
    assert (read_link(store, CURRENT), read_link(store, PREVIOUS)) == (second.current, first.current)
    assert restarts.count == 2
    # The daemon loads the link: it resolves to a verified, world-readable copy.
    from firmware import load

    loaded = load(store / CURRENT, trusted_keys)
    assert loaded.version == "0.2.0" and loaded.root == store / second.current
    assert all(p.stat().st_mode & 0o004 for p in loaded.root.iterdir())
    assert not [p for p in store.iterdir() if p.name.startswith(".staging")]


def test_only_current_and_previous_are_kept(bundles: list[Path], trusted_keys: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    names = [install(b, trusted_keys, Restarts(), store).current for b in bundles]
    assert sorted(p.name for p in store.iterdir() if p.is_dir() and not p.is_symlink()) == sorted(names[1:])
    third = rollback(trusted_keys, Restarts(), store)
    assert third.current == names[1] and third.previous == names[2]


def test_installing_the_current_bundle_again_changes_nothing(bundles: list[Path], trusted_keys: Path,
                                                             tmp_path: Path) -> None:  # fmt: skip
    store, restarts = tmp_path / "store", Restarts()
    install(bundles[0], trusted_keys, restarts, store)
    again = install(bundles[0], trusted_keys, restarts, store)
    assert not again.changed and restarts.count == 1


def test_rollback_returns_to_the_previous_and_a_second_undoes_it(bundles: list[Path], trusted_keys: Path,
                                                                 tmp_path: Path) -> None:  # fmt: skip
    store, restarts = tmp_path / "store", Restarts()
    a = install(bundles[0], trusted_keys, restarts, store).current
    b = install(bundles[1], trusted_keys, restarts, store).current
    back = rollback(trusted_keys, restarts, store)
    assert (back.current, back.previous) == (a, b) and read_link(store, CURRENT) == a
    forth = rollback(trusted_keys, restarts, store)
    assert (forth.current, forth.previous) == (b, a)
    assert restarts.count == 4


def test_rollback_without_a_previous_says_what_to_do(bundles: list[Path], trusted_keys: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    install(bundles[0], trusted_keys, Restarts(), store)
    with pytest.raises(InstallError, match=r"no previous firmware .*`zerolayer firmware install"):
        rollback(trusted_keys, Restarts(), store)
    with pytest.raises(InstallError, match=r"no firmware store at .*nowhere: nothing was ever installed there"):
        rollback(trusted_keys, Restarts(), tmp_path / "nowhere")  # the lock file's FileNotFoundError before
    assert not (tmp_path / "nowhere").exists()


def test_a_tampered_bundle_leaves_the_store_untouched(bundles: list[Path], trusted_keys: Path, tmp_path: Path) -> None:
    store, restarts = tmp_path / "store", Restarts()
    install(bundles[0], trusted_keys, restarts, store)
    install(bundles[1], trusted_keys, restarts, store)
    before = _snapshot(store)
    onnx = next(bundles[2].glob("*.onnx"))
    data = bytearray(onnx.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one changed byte
    onnx.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"\.onnx: sha256 does not match"):
        install(bundles[2], trusted_keys, restarts, store)
    assert _snapshot(store) == before and restarts.count == 2


def test_a_bundle_signed_by_an_untrusted_key_is_refused(bundles: list[Path], trusted_keys: Path,
                                                        tmp_path: Path) -> None:  # fmt: skip
    from firmware.signing import generate_keypair

    store = tmp_path / "store"
    sign(bundles[0], generate_keypair(tmp_path / "stranger", "stranger").private_path)
    with pytest.raises(BundleError):
        install(bundles[0], trusted_keys, Restarts(), store)
    assert not store.exists()  # refused before the store was even made


def test_a_previous_bundle_damaged_since_is_not_rolled_back_to(bundles: list[Path], trusted_keys: Path,
                                                               tmp_path: Path) -> None:  # fmt: skip
    store = tmp_path / "store"
    a = install(bundles[0], trusted_keys, Restarts(), store).current
    install(bundles[1], trusted_keys, Restarts(), store)
    (store / a / "tokenizer.json").write_text("{}")
    before = _snapshot(store)
    with pytest.raises(BundleError, match=r"tokenizer\.json"):
        rollback(trusted_keys, Restarts(), store)
    assert _snapshot(store) == before


def test_restart_without_systemd_says_no_daemon_was_restarted(tmp_path: Path) -> None:
    said = restart_daemon(systemd_root=tmp_path / "no-systemd")
    assert "no daemon was restarted" in said


def test_cli_install_and_rollback(bundles: list[Path], trusted_keys: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"

    def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "appliance.cli", "firmware", *map(str, args),
                               "--trusted-keys", str(trusted_keys), "--store", str(store), "--no-restart"],
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip

    for b in bundles[:2]:
        r = cli("install", b)
        assert r.returncode == 0, r.stderr
    assert "previous: " + str(store / "tiny-llama-0.1.0-") in r.stdout and "no daemon was restarted" in r.stdout
    r = cli("rollback")
    assert r.returncode == 0 and read_link(store, CURRENT).startswith("tiny-llama-0.1.0-")  # type: ignore[union-attr]
    (bundles[2] / "tokenizer.json").write_text("{}")
    r = cli("install", bundles[2])
    assert r.returncode == 2 and "firmware refused: tokenizer.json" in r.stderr


def test_a_bundle_installed_beside_current_has_a_slot_of_its_own(bundles: list[Path], trusted_keys: Path,
                                                                   tmp_path: Path) -> None:  # fmt: skip
    store = tmp_path / "store"
    current = install(bundles[0], trusted_keys, Restarts(), store).current
    beside = install(bundles[1], trusted_keys, Restarts(), store, slot="qwen")
    assert read_link(store, CURRENT) == current and read_link(store, "qwen") == beside.current
    again = install(bundles[2], trusted_keys, Restarts(), store, slot="qwen")
    # Every bundle a link names is kept: current's, and both of the slot's.
    assert again.previous == beside.current and not again.removed
    kept = {p.name for p in store.iterdir() if p.is_dir() and not p.is_symlink()}
    assert kept == {current, beside.current, again.current}
    back = rollback(trusted_keys, Restarts(), store, slot="qwen")
    assert back.current == beside.current and read_link(store, CURRENT) == current
    assert set(remove("qwen", Restarts(), store)) == {again.current, beside.current}
    assert read_link(store, "qwen") is None and read_link(store, CURRENT) == current
    assert {p.name for p in store.iterdir() if p.is_dir() and not p.is_symlink()} == {current}
    for bad in ("previous", "x.previous", "../etc", ""):
        with pytest.raises(InstallError, match="cannot name a slot"):
            install(bundles[0], trusted_keys, Restarts(), store, slot=bad)
