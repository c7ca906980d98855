"""A Hugging Face folder written again with other weights or another config, one shard at a time:
what a checkpoint read before the export becomes (prequantized's dequantized weights, bailing's
Ling 2.0 as GLM-4.5), its other files (tokenizer, templates, generation config, licence) copied;
or with another config alone, beside its own files (minicpm's MiniCPM as Granite)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from firmware.errors import BundleError

# Written out in shards of at most this many bytes, so that one is held at a time.
SHARD_BYTES = 2 << 30
# Weights not copied into the new folder: the ones read, and other forms of them a repository may
# carry beside (Mistral's consolidated.safetensors, Meta's original/, a GGUF file).
WEIGHT_FILES = (".safetensors", ".safetensors.index.json", ".bin", ".bin.index.json", ".pth", ".pt", ".gguf")
WEIGHT_FOLDERS = ("original",)


def opened(source: Path, what: str) -> tuple[list[str], Callable[[str], Any]]:
    """The names of `source`'s tensors, and a reader of each by name (each shard opened once;
    `what`: what such folders are, for the refusal of one without a safetensors file)."""
    from safetensors import safe_open

    where = _shards(source, what)
    handles = {file: safe_open(str(source / file), framework="pt") for file in set(where.values())}
    return list(where), lambda name: handles[where[name]].get_tensor(name)


def _shards(source: Path, what: str) -> dict[str, str]:
    """Each tensor's name -> the safetensors file of `source` holding it."""
    from safetensors import safe_open

    index = source / "model.safetensors.index.json"
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    # A Hugging Face checkpoint's own files (model*.safetensors) where it has them, not Mistral's
    # consolidated.safetensors of the same weights under other names.
    files = sorted(p.name for p in source.glob("model*.safetensors")) or \
        sorted(p.name for p in source.glob("*.safetensors"))  # fmt: skip
    if not files:
        raise BundleError(f"{source}: no .safetensors file ({what} are read from safetensors only)")
    found: dict[str, str] = {}
    for file in files:
        with safe_open(str(source / file), framework="pt") as handle:
            found.update(dict.fromkeys(handle.keys(), file))
    return found


def transformers4_rope(config: dict[str, Any], theta: float, **extra: float) -> dict[str, Any]:
    """A published config's RoPE in transformers 4's keys (rope_theta, or `theta` where it has none;
    rope_scaling, a type and its parameters, or null) as transformers 5's rope_parameters, over
    `extra` (partial_rotary_factor, say): what a config read as another family's takes."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(config.get("rope_theta") or theta), **extra}
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict):
        rope |= {k: v for k, v in scaling.items() if k != "type"} | {"rope_type": scaling.get("rope_type",
                                                                                              scaling.get("type"))}
    return rope


def relabel(source: Path, out: Path, config: dict[str, Any]) -> None:
    """`source` in `out` with `config` for its own, every other file linked (its weights read as
    they are)."""
    out.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name != "config.json":
            (out / item.name).symlink_to(item.resolve())
    (out / "config.json").write_text(json.dumps(config, indent=2))


def rewrite(source: Path, out: Path, config: dict[str, Any], tensors: Iterable[tuple[str, Any]],
            left: tuple[str, ...] = ()) -> None:  # fmt: skip
    """`source` written into `out` with `config` and `tensors` (name, tensor) for its own, in
    shards: its other files copied but its weights and those named in `left`."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name == "config.json" or item.name in left or item.name.endswith(WEIGHT_FILES) or \
                item.name in WEIGHT_FOLDERS:  # fmt: skip
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, out / item.name)
    weight_map: dict[str, str] = {}
    pending: dict[str, Any] = {}
    written = 0

    def flush() -> None:
        nonlocal written
        if not pending:
            return
        file = f"model-{written + 1:05d}.safetensors"
        save_file(pending, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(pending, file))
        written += 1
        pending.clear()

    size = 0
    for key, value in tensors:
        pending[key] = value.contiguous()
        size += value.numel() * value.element_size()
        if size >= SHARD_BYTES:
            flush()
            size = 0
    flush()
    if written == 1:  # one shard: the name transformers looks for first, no index
        (out / "model-00001.safetensors").rename(out / "model.safetensors")
    else:
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map},
                                                                     indent=2))  # fmt: skip
    (out / "config.json").write_text(json.dumps(config, indent=2))
