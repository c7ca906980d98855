"""Running the build machine's tools (mkfs, sgdisk, rauc, debootstrap, ...): their output, or an
error that names the command and ends with what it printed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def run_tool(*args: str | Path) -> str:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C.UTF-8"}
    argv = [str(a) for a in args]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip()[-3000:]
        shown = " ".join(argv[:6]) + (" ..." if len(argv) > 6 else "")
        raise RuntimeError(f"{shown} failed ({result.returncode}):\n{tail}")
    return result.stdout
