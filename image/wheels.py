"""The wheelhouse: Zerolayer's wheel and its runtime dependencies for the target's CPU and Python,
fetched on the build machine so the root installs them offline (`pip install --no-index`).

Versions are pinned to those installed here (the ones the tests ran against) where the target has
them. systemd-python has no wheels: the root gets Debian's python3-systemd, built against the
root's own libsystemd, and the venv sees it through --system-site-packages. Building that wheel
ourselves would need a compiler and libsystemd-dev for each target (under qemu for arm64).
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from appliance.kernel.loader import build_object
from appliance.layout import REPO

# Debian bookworm's Python and glibc (2.36): wheels for this or older are what its root can run.
PYTHON_VERSION = "3.11"
GLIBC_MINOR = 36
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}
# Provided by the root's Debian packages, not by the wheelhouse.
FROM_DEBIAN = {"systemd-python"}


# The image's ONNX Runtime: the CPU build (the extra that pulls it; see pyproject.toml).
RUNTIME_EXTRA = "cpu"


def runtime_requirements() -> list[str]:
    """Zerolayer's own dependencies and its ONNX Runtime, without the other extras (no torch,
    transformers, test tools)."""
    found = []
    for req in importlib.metadata.requires("zerolayer") or []:
        requirement, _, marker = req.partition(";")
        if "extra ==" in marker:
            if marker.strip() != f'extra == "{RUNTIME_EXTRA}"':
                continue
            req = requirement.strip()
        name = re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0]
        if _norm(name) not in FROM_DEBIAN:
            found.append(req)
    return found


def to_install() -> list[str]:
    """What `pip install` in the root asks for: zerolayer with its ONNX Runtime (its dependencies
    come with it)."""
    return [f"zerolayer[{RUNTIME_EXTRA}]"]


def pins() -> list[str]:
    """name==version of everything installed in this Python: constraints, so the target gets the
    versions tested here where they exist for it (pip ignores pins of packages it does not need)."""
    return sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                  if d.metadata["Name"] and _norm(d.metadata["Name"]) != "zerolayer")  # fmt: skip


def build_wheelhouse(out: Path, arch: str, pip_cache: Path) -> list[Path]:
    """Fill OUT with zerolayer's wheel and every runtime wheel for ARCH; returns the wheels."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="zerolayer-wheel-") as tmp:
        # A copy of the sources, so that building the wheel leaves no build/ in the checkout.
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(REPO / name, src / name)
        for pkg in ("appliance", "firmware"):
            shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        build_object(src / "appliance" / "kernel")  # the kernel layer's BPF object rides in the wheel
        _pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", out, src, cache=pip_cache)
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("\n".join(pins()) + "\n")
        _pip("download", "--dest", out, "--only-binary=:all:", *platform_args(arch),
             "--python-version", PYTHON_VERSION, "--implementation", "cp", "-c", constraints,
             *runtime_requirements(), cache=pip_cache)  # fmt: skip
    return sorted(out.glob("*.whl"))


def platform_args(arch: str) -> list[str]:
    """Every manylinux tag the root's glibc runs, spelled out: pip does not widen a newer tag
    (manylinux_2_36) to the older ones the wheels carry (manylinux_2_17, manylinux2014)."""
    machine = MACHINES[arch]
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(GLIBC_MINOR, 16, -1)]
    return [arg for tag in [*tags, f"manylinux2014_{machine}"] for arg in ("--platform", tag)]


def _pip(*args: str | Path, cache: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "--cache-dir", str(cache),
           *map(str, args)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"pip {args[0]} failed: {result.stderr.strip()[-2000:]}")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
