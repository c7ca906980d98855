"""The amd64 image, built once per session for the modules that boot it (under systemd-nspawn and
under QEMU), in a folder under /var/tmp removed at the end."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from firmware.toolchain.paths import cache_dir
from image.build import Image, build_image
from image.update import dev_update_signer


@pytest.fixture(scope="session")
def image_work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="zerolayer-image-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def image(image_work: Path, tiny_bundle_path: Path, trusted_keys: Path) -> Image:
    started = time.monotonic()
    built = build_image("amd64", tiny_bundle_path, image_work / "amd64", trusted_keys,
                        update_ca=dev_update_signer(cache_dir()).ca, dev=True, cache=cache_dir(),
                        progress=lambda line: print(line, flush=True))  # fmt: skip
    print(f"amd64 image built in {time.monotonic() - started:.1f} s "
          f"(debootstrap base {'cached' if built.base_cached else 'made now'})")  # fmt: skip
    return built
