"""System updates for the amd64 image: a RAUC bundle of a newer root (`zerolayer image bundle`),
signed by a code-signing leaf of the update CA that the image trusts (/etc/rauc/keyring.pem).

The update CA is not the firmware signing key: a firmware bundle changes the model a box serves, a
system bundle changes everything it runs, and the two are held by different people in a serious
deployment. `--dev` uses a development CA made once on this machine (under the build cache); an
image built with it says so in its manifest and in `zerolayer status`."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.tls import make_ca, make_code_signer
from image.slots import COMPATIBLE
from image.tools import run_tool

ROOT_IMAGE = "rootfs.ext4"


@dataclass(frozen=True)
class UpdateSigner:
    ca: Path  # what the box trusts (its keyring)
    cert: Path  # signs bundles: a code-signing leaf of the CA
    key: Path


def dev_update_signer(cache: Path) -> UpdateSigner:
    """This machine's development update CA and its signer, made on first use (10 years)."""
    home = cache / "image" / "dev-update-ca"
    signer = UpdateSigner(home / "ca.crt", home / "signer.crt", home / "signer.key")
    if not all(p.is_file() for p in (signer.ca, signer.cert, signer.key)):
        home.mkdir(parents=True, exist_ok=True)
        validity = datetime.timedelta(days=3650)
        make_ca(signer.ca, home / "ca.key", "Zerolayer development update CA", validity)
        make_code_signer(signer.ca, home / "ca.key", "Zerolayer development update signer", signer.cert, signer.key,
                         validity)  # fmt: skip
    return signer


def manifest(version: str) -> str:
    return f"""[update]
compatible={COMPATIBLE}
version={version}
description=Zerolayer appliance root {version}

[bundle]
format=verity

[image.rootfs]
filename={ROOT_IMAGE}
"""


def make_bundle(root_fs: Path, version: str, signer: UpdateSigner, out: Path) -> Path:
    """OUT: a signed RAUC bundle that writes ROOT_FS (an ext4 slot image) into the inactive slot.
    The bundle is checked against the CA before it is handed out, as the box will check it."""
    out.unlink(missing_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        content = Path(tmp) / "content"
        content.mkdir()
        (content / "manifest.raucm").write_text(manifest(version))
        try:
            os.link(root_fs, content / ROOT_IMAGE)  # same file system: no copy of a GiB
        except OSError:
            shutil.copy(root_fs, content / ROOT_IMAGE)
        # zstd: as small as mksquashfs's default (gzip -9) and 30 times faster to make (measured: 2.4 s
        # against 75 s for a 681 MiB root on 2 cores); the Debian kernel reads it.
        _rauc("bundle", f"--cert={signer.cert}", f"--key={signer.key}", f"--keyring={signer.ca}",
              "--mksquashfs-args=-comp zstd -Xcompression-level 3", str(content), str(out))  # fmt: skip
    bundle_info(out, signer.ca)
    return out


def bundle_info(bundle: Path, ca: Path) -> dict[str, Any]:
    """`rauc info` of BUNDLE, its signature checked against CA as the box checks it (or RuntimeError)."""
    return dict(json.loads(_rauc("info", f"--keyring={ca}", "--output-format=json", str(bundle))))


def _rauc(*args: str) -> str:
    """rauc on the build machine, with the box's signature policy: its default purpose (S/MIME
    signing) refuses a code-signing leaf, which the box's check-purpose=codesign asks for."""
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "system.conf"
        conf.write_text(f"[system]\ncompatible={COMPATIBLE}\nbootloader=noop\n\n[keyring]\ncheck-purpose=codesign\n")
        return run_tool("rauc", f"--conf={conf}", *args)
