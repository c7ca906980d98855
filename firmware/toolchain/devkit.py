"""Development bundles built once per machine and cached: the demo firmware and the tiny fixture.

Both are signed with a development key generated on this machine (never committed). Builds go to a
temporary directory and are renamed into place, so an interrupted build never leaves a half bundle.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from firmware.manifest import MANIFEST_NAME
from firmware.signing import generate_keypair
from firmware.toolchain.build import Progress, _stderr_progress, sign
from firmware.toolchain.paths import cache_dir

DEV_KEY_NAME = "zerolayer-dev"


def dev_key_dir() -> Path:
    return cache_dir() / "dev-key"


def dev_trusted_keys() -> Path:
    """A directory holding only the development public key: a trusted set for tests and `make run`."""
    ensure_dev_key()
    return dev_key_dir() / "trusted"


def ensure_dev_key() -> Path:
    """The development private key, generated on first use."""
    d = dev_key_dir()
    key = d / f"{DEV_KEY_NAME}.key"
    with _lock(cache_dir() / ".dev-key.lock"):
        if not key.exists():
            pair = generate_keypair(d, DEV_KEY_NAME)
            trusted = d / "trusted"
            trusted.mkdir(exist_ok=True)
            shutil.copy(pair.public_path, trusted / pair.public_path.name)
    return key


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_bundle(name: str, make: Callable[[Path], None], progress: Progress = _stderr_progress) -> Path:
    """Return the cached bundle NAME, building it with make(out_dir) and signing it if absent."""
    key = ensure_dev_key()
    final = cache_dir() / "firmware" / name
    final.parent.mkdir(parents=True, exist_ok=True)
    with _lock(cache_dir() / f".{name}.lock"):
        if (final / "manifest.sig").is_file():
            return final
        progress(f"building the {name} firmware once (cached in {final})")
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{name}-") as tmp:
            out = Path(tmp) / "bundle"
            make(out)
            sign(out, key)
            if final.exists():
                shutil.rmtree(final)
            out.rename(final)
    return final


def resigned_copy(src: Path, dest: Path, version: str, key: Path) -> Path:
    """A copy of bundle `src` re-signed as another version: a second, distinct, valid bundle (for
    install and rollback tests)."""
    shutil.copytree(src, dest)
    doc = json.loads((dest / MANIFEST_NAME).read_text())
    doc["version"] = version
    (dest / MANIFEST_NAME).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    sign(dest, key)
    return dest
