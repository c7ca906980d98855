"""A tiny fixture's folder written as a quantized checkpoint is published (the tests' source of
FP8, GPTQ, AWQ, compressed-tensors, MXFP4 and bitsandbytes folders: no hub). Each weight is rounded
to the method's grid and stored in its layout; the float model those stored values stand for is
what a build from the folder must reproduce. bitsandbytes' folders are written by transformers and
bitsandbytes themselves, on the CPU, as unsloth's "bnb-4bit" folders were."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from firmware.toolchain.prequantized import AWQ_ORDER, FP4_VALUES

FP8_MAX = 448.0  # E4M3's largest finite value


def write(source: Path, out: Path, kind: str, **options: Any) -> Path:
    """`source` (a float folder of one safetensors file) as `kind`: fp8 (block-wise, Qwen3's
    and DeepSeek's), fp8_channel and int8_channel (compressed-tensors' float-quantized and
    int-quantized), gptq, awq, packed (compressed-tensors' pack-quantized), nvfp4 (its
    nvfp4-pack-quantized), modelopt_nvfp4 and modelopt_fp8 (NVIDIA's Model Optimizer), mxfp4 (gpt-oss's
    experts), or bitsandbytes' bnb_nf4 (double quantization; `storage` the dtype its codes are
    stored as), bnb_fp4 or bnb_int8."""
    import torch
    from safetensors.torch import load_file, save_file

    if kind.startswith("bnb_"):
        return _bitsandbytes(source, out, kind, **options)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(source, out)
    state = load_file(str(source / "model.safetensors"))
    stored: dict[str, Any] = {}
    writer = WRITERS[kind]
    for key, value in state.items():
        prefix = key.rpartition(".")[0]
        linear = key.endswith("proj.weight") and value.dim() == 2 and kind != "mxfp4"
        experts = kind == "mxfp4" and ".experts." in key and not key.endswith("_bias")
        if linear or experts:
            stored.update(writer(prefix if linear else key, value.to(torch.float32), **options))
        else:
            stored[key] = value
    save_file({k: v.contiguous() for k, v in stored.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = CONFIGS[kind](**options)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def _fp8(prefix: str, w: Any, block: int = 32) -> dict[str, Any]:
    import torch

    o, i = w.shape
    grid = w.reshape(o // block, block, i // block, block).abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    q = (w.reshape(o // block, block, i // block, block) / grid[:, None, :, None]).reshape(o, i)
    return {f"{prefix}.weight": q.to(torch.float8_e4m3fn), f"{prefix}.weight_scale_inv": grid}


def _fp8_channel(prefix: str, w: Any) -> dict[str, Any]:
    import torch

    scale = (w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX).to(torch.bfloat16)
    return {f"{prefix}.weight": (w / scale.float()).to(torch.float8_e4m3fn), f"{prefix}.weight_scale": scale,
            f"{prefix}.input_scale": torch.ones(1)}  # fmt: skip


def _int8_channel(prefix: str, w: Any) -> dict[str, Any]:
    import torch

    scale = (w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127).to(torch.bfloat16)
    return {f"{prefix}.weight": torch.round(w / scale.float()).to(torch.int8), f"{prefix}.weight_scale": scale}


def _grid(w: Any, bits: int, groups: Any) -> tuple[Any, Any, Any]:
    """Asymmetric round-to-nearest of [out, in] weights, inputs grouped by `groups` (each input's
    group): (integers [out, in], zero points [groups, out], scales [groups, out], in float16)."""
    import torch

    count = int(groups.max()) + 1
    top = (1 << bits) - 1
    scales = torch.empty(count, w.shape[0])
    zeros = torch.empty(count, w.shape[0])
    for g in range(count):
        part = w[:, groups == g]
        low, high = part.amin(dim=1).clamp(max=0), part.amax(dim=1).clamp(min=0)
        scales[g] = ((high - low) / top).clamp(min=1e-8).half().float()
        zeros[g] = torch.round(-low / scales[g]).clamp(0, top)
    q = torch.clamp(torch.round(w / scales[groups].T) + zeros[groups].T, 0, top)
    return q.to(torch.int32), zeros.to(torch.int32), scales.half()


def _packed(values: Any, bits: int, axis: int) -> Any:
    """int32 words of 32 // bits values along `axis`, element 0 in the lowest bits."""
    import torch

    per = 32 // bits
    v = values.to(torch.int64)
    if axis == 0:
        v = v.reshape(v.shape[0] // per, per, v.shape[1])
        words = sum(v[:, k] << (bits * k) for k in range(per))
    else:
        v = v.reshape(v.shape[0], v.shape[1] // per, per)
        words = sum(v[:, :, k] << (bits * k) for k in range(per))
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)  # the word's bits, signed


def _gptq(prefix: str, w: Any, bits: int = 4, group: int = 32, act_order: bool = False) -> dict[str, Any]:
    import torch

    inputs = w.shape[1]
    order = torch.randperm(inputs, generator=torch.Generator().manual_seed(inputs)) if act_order \
        else torch.arange(inputs)  # fmt: skip
    g_idx = torch.empty(inputs, dtype=torch.int32)
    g_idx[order] = (torch.arange(inputs) // group).to(torch.int32)
    q, zeros, scales = _grid(w, bits, g_idx.long())
    return {f"{prefix}.qweight": _packed(q.T, bits, 0), f"{prefix}.qzeros": _packed((zeros - 1) & ((1 << bits) - 1),
            bits, 1), f"{prefix}.scales": scales, f"{prefix}.g_idx": g_idx}  # fmt: skip


def _awq(prefix: str, w: Any, group: int = 32) -> dict[str, Any]:
    import torch

    q, zeros, scales = _grid(w, 4, torch.arange(w.shape[1]) // group)

    def awq_words(columns: Any) -> Any:  # nibble k of each word holds column AWQ_ORDER[k] of its 8
        c = columns.reshape(columns.shape[0], -1, 8)[:, :, list(AWQ_ORDER)]
        return _packed(c.reshape(columns.shape[0], -1), 4, 1)

    return {f"{prefix}.qweight": awq_words(q.T), f"{prefix}.qzeros": awq_words(zeros), f"{prefix}.scales": scales}


def _packed_ct(prefix: str, w: Any, bits: int = 4, group: int = 32) -> dict[str, Any]:
    import torch

    offset = 1 << (bits - 1)
    groups = torch.arange(w.shape[1]) // group
    scale = (w.reshape(w.shape[0], -1, group).abs().amax(dim=2) / (offset - 1)).clamp(min=1e-8).to(torch.bfloat16)
    q = torch.clamp(torch.round(w / scale.float()[:, groups]), -offset, offset - 1).to(torch.int32) + offset
    return {f"{prefix}.weight_packed": _packed(q, bits, 1), f"{prefix}.weight_scale": scale,
            f"{prefix}.weight_shape": torch.tensor(list(w.shape), dtype=torch.int64)}  # fmt: skip


def _mxfp4(key: str, w: Any) -> dict[str, Any]:
    """[experts, in, out] experts as blocks [experts, out, in / 32, 16] and exponents."""
    import torch

    t = w.transpose(1, 2).contiguous()
    e, r, c = t.shape
    groups = t.reshape(e, r, c // 32, 32)
    exponent = torch.ceil(torch.log2(groups.abs().amax(dim=-1).clamp(min=1e-30) / 6.0)).clamp(-127, 127)
    packed = _fp4_packed(groups / torch.pow(2.0, exponent).unsqueeze(-1))
    return {f"{key}_blocks": packed, f"{key}_scales": (exponent + 127).to(torch.uint8)}


def _fp4_packed(units: Any) -> Any:
    """Values (in units of their scale) rounded to the nearest FP4 (E2M1) code, two to a byte along
    the last dimension, the low nibble first."""
    import torch

    lut = torch.tensor(FP4_VALUES[:8])
    codes = (units.abs().unsqueeze(-1) - lut).abs().argmin(dim=-1) + 8 * (units < 0).to(torch.long)
    pairs = codes.to(torch.uint8).reshape(*units.shape[:-1], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def _nvfp4(prefix: str, w: Any, modelopt: bool = False) -> dict[str, Any]:
    """NVFP4 as compressed-tensors writes it (a global scale of 448 x 6 over the weight's largest
    magnitude; each group of 16 an FP8 scale of the group's over 6, in those units) or, where
    `modelopt`, as Model Optimizer does (the inverse tensor scale, `weight_scale_2`)."""
    import torch

    amax = w.abs().amax().clamp(min=1e-12).reshape(1)
    global_scale = (FP8_MAX * 6.0 / amax).to(torch.float32)
    groups = w.reshape(w.shape[0], -1, 16)
    block = (groups.abs().amax(dim=-1) / 6.0 * global_scale).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    effective = block.to(torch.float32) / global_scale
    packed = _fp4_packed((groups / effective.clamp(min=1e-30).unsqueeze(-1)).reshape(w.shape))
    if modelopt:
        return {f"{prefix}.weight": packed, f"{prefix}.weight_scale": block,
                f"{prefix}.weight_scale_2": (1 / global_scale).reshape(()), f"{prefix}.input_scale": torch.ones(())}
    return {f"{prefix}.weight_packed": packed, f"{prefix}.weight_scale": block,
            f"{prefix}.weight_global_scale": global_scale}  # fmt: skip


def _modelopt_fp8(prefix: str, w: Any) -> dict[str, Any]:
    import torch

    scale = (w.abs().amax().clamp(min=1e-12) / FP8_MAX).to(torch.float32)
    return {f"{prefix}.weight": (w / scale).to(torch.float8_e4m3fn), f"{prefix}.weight_scale": scale,
            f"{prefix}.input_scale": torch.ones(())}  # fmt: skip


def _bitsandbytes(source: Path, out: Path, kind: str, storage: str = "uint8") -> Path:
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    if kind == "bnb_int8":
        asked = BitsAndBytesConfig(load_in_8bit=True)
    else:
        asked = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=kind[4:], bnb_4bit_quant_storage=storage,
                                   bnb_4bit_compute_dtype=torch.float32, bnb_4bit_use_double_quant=kind == "bnb_nf4")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(source, out)
    for weights in out.glob("model*.safetensors*"):
        weights.unlink()
    model = AutoModelForCausalLM.from_pretrained(str(source), quantization_config=asked, device_map="cpu",
                                                 dtype=torch.float32)  # fmt: skip
    model.save_pretrained(str(out))
    return out


def _ct_config(fmt: str, bits: int, strategy: str, group: int | None, kind: str) -> dict[str, Any]:
    return {"quant_method": "compressed-tensors", "format": fmt, "ignore": ["lm_head"], "config_groups": {
        "group_0": {"targets": ["Linear"], "format": fmt, "weights": {
            "num_bits": bits, "type": kind, "symmetric": True, "strategy": strategy, "group_size": group}}}}


WRITERS: dict[str, Any] = {"fp8": _fp8, "fp8_channel": _fp8_channel, "int8_channel": _int8_channel, "gptq": _gptq,
                           "awq": _awq, "packed": _packed_ct, "mxfp4": _mxfp4, "nvfp4": _nvfp4,
                           "modelopt_nvfp4": lambda prefix, w: _nvfp4(prefix, w, modelopt=True),
                           "modelopt_fp8": _modelopt_fp8}  # fmt: skip
CONFIGS: dict[str, Any] = {
    "fp8": lambda block=32: {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                             "weight_block_size": [block, block]},
    "fp8_channel": lambda: _ct_config("float-quantized", 8, "channel", None, "float"),
    "int8_channel": lambda: _ct_config("int-quantized", 8, "channel", None, "int"),
    "gptq": lambda bits=4, group=32, act_order=False: {"quant_method": "gptq", "bits": bits, "group_size": group,
                                                      "desc_act": act_order, "sym": False,
                                                      "checkpoint_format": "gptq"},
    "awq": lambda group=32: {"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm",
                             "zero_point": True},
    "packed": lambda bits=4, group=32: _ct_config("pack-quantized", bits, "group", group, "int"),
    "nvfp4": lambda: _ct_config("nvfp4-pack-quantized", 4, "tensor_group", 16, "float"),
    "modelopt_nvfp4": lambda: {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                               "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]},
    "modelopt_fp8": lambda: {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": None,
                             "exclude_modules": ["lm_head"]},
    "mxfp4": lambda: {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                         "model.layers.*.mlp.router",
                                                                         "model.embed_tokens", "lm_head"]},
}
