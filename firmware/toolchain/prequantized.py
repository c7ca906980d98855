"""Checkpoints published with their weights already quantized (config.json's `quantization_config`):
dequantized into a plain float32 folder before the export, as a GGUF file is, one tensor at a time.

The builder reads such a folder with loaders of its own for a few methods and Llama-shaped models
only (any other failed as "cannot export this architecture"), and transformers' loaders need
GPU kernels or packages the appliance does not ship. Read here: FP8 weights with a scale per block
(`fp8`: Qwen3's, Ministral 3's, DeepSeek's), per output channel (`fbgemm_fp8`) or as
compressed-tensors writes them (`float-quantized`: RedHat's FP8 models), GPTQ and AWQ integers in
groups along the input (2, 4 or 8 bits; their zero points, GPTQ's act-order `g_idx`),
compressed-tensors' packed integers (`pack-quantized`, w4a16 and w8a16), NVFP4 as
compressed-tensors and NVIDIA's Model Optimizer write it (`nvfp4-pack-quantized`; `modelopt`, whose
FP8 is read too), gpt-oss's MXFP4 experts, and bitsandbytes' 4-bit (NF4, FP4; unsloth's
"bnb-4bit" folders) and 8-bit weights. The export then quantizes as asked (`--precision`), in its
own blocks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from firmware.errors import BundleError
from firmware.toolchain import folders

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the nibble of a packed word each of its 8 columns sits in
READ = ("fp8", "fbgemm_fp8", "gptq", "awq", "mxfp4", "compressed-tensors", "bitsandbytes", "modelopt")
MODELOPT_READ = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "NVFP4")  # Model Optimizer's `quant_algo`s read
COMPRESSED_READ = ("float-quantized", "pack-quantized", "int-quantized", "naive-quantized", "nvfp4-pack-quantized",
                   "dense")  # fmt: skip
BNB_4BIT_PARTS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")  # beside a 4-bit `weight`
INT8_ROW_SCALE = 7.874015718698502e-3  # 1/127 as bitsandbytes multiplies by it (a float32)
# Tensors that only quantize activations or the KV cache at run time: nothing to dequantize.
RUN_TIME_SCALES = ("input_scale", "k_scale", "v_scale", "output_scale", "input_global_scale", "activation_scale")
HF_QUANT_CONFIG = "hf_quant_config.json"  # Model Optimizer's statement of the quantization, not copied


def method(config: dict[str, Any]) -> str | None:
    """The checkpoint's quantization method, or None where its weights are plain."""
    quantization = config.get("quantization_config")
    if not isinstance(quantization, dict):
        return None
    return str(quantization.get("quant_method", "unknown")).lower()


def refusal(config: dict[str, Any]) -> str | None:
    """Why this quantized checkpoint cannot be read (None where it can, or is not quantized)."""
    name = method(config)
    if name is None:
        return None
    q = config["quantization_config"]
    advice = ("build from the model's unquantized folder (the one this was quantized from) or from "
              "a GGUF file of it")  # fmt: skip
    if name not in READ:
        return f"weights quantized with {name!r}, which this build does not read (it reads {', '.join(READ)}); {advice}"
    if name == "gptq" and int(q.get("bits", 4)) not in (2, 4, 8):
        return f"{q.get('bits')}-bit GPTQ weights (read: 2, 4 and 8 bits); {advice}"
    if name == "gptq" and q.get("dynamic"):
        return f"GPTQ weights of other bits or groups per module (GPTQModel's `dynamic`); {advice}"
    if name == "awq":
        version = str(q.get("version", "gemm")).lower()
        if version != "gemm" or int(q.get("bits", q.get("w_bit", 4))) != 4 or not q.get("zero_point", True):
            return f"AWQ weights in its {version!r} layout at {q.get('bits', q.get('w_bit'))} bits " \
                   f"{'with' if q.get('zero_point', True) else 'without'} zero points (read: 4 bits with zero " \
                   f"points, the GEMM layout AutoAWQ writes by default); {advice}"
    if name == "compressed-tensors":
        formats = _compressed_formats(q)
        unread = sorted(formats - set(COMPRESSED_READ))
        if unread:
            return f"compressed-tensors weights in the {', '.join(unread)} format (read: float-quantized, " \
                   f"pack-quantized, int-quantized, nvfp4-pack-quantized); {advice}"
        if len(_group_bits(q)) > 1:
            return f"compressed-tensors weights of {' and '.join(map(str, sorted(_group_bits(q))))} bits in " \
                   f"different groups; {advice}"
    if name == "modelopt" and str(q.get("quant_algo")).upper() not in MODELOPT_READ:
        return f"Model Optimizer weights quantized as {q.get('quant_algo')!r} (read: {', '.join(MODELOPT_READ)}); " \
               f"{advice}"
    return None


def folder_config(source: Path) -> dict[str, Any]:
    """A folder's config.json, with the quantization Model Optimizer's older exports state only in
    hf_quant_config.json (NVIDIA's first FP8 checkpoints) as its `quantization_config`."""
    config: dict[str, Any] = json.loads((source / "config.json").read_text())
    sidecar = source / HF_QUANT_CONFIG
    if "quantization_config" not in config and sidecar.is_file():
        stated = json.loads(sidecar.read_text()).get("quantization")
        if isinstance(stated, dict) and stated.get("quant_algo"):
            config["quantization_config"] = {"quant_method": "modelopt", **stated}
    return config


def dequantize_folder(source: Path, out: Path) -> str:
    """`source` with its weights dequantized to float32 into `out` (its other files copied, the
    config without `quantization_config`); returns the method read."""
    config = folder_config(source)
    why = refusal(config)
    if why is not None:
        raise BundleError(f"{source}: {why}")
    name = method(config)
    assert name is not None
    quantization = config.pop("quantization_config")
    keys, tensor = folders.opened(source, "quantized checkpoints")
    for nested in (config, config.get("text_config") or {}):
        for field in ("dtype", "torch_dtype"):
            if field in nested:
                nested[field] = "float32"
    folders.rewrite(source, out, config, _dequantized(name, quantization, keys, tensor), (HF_QUANT_CONFIG,))
    return name


def _dequantized(name: str, quantization: dict[str, Any], keys: list[str],
                 tensor: Callable[[str], Any]) -> Iterator[tuple[str, Any]]:  # fmt: skip
    """Every tensor the float model has, in float32 where it was quantized, the rest as stored."""
    present = set(keys)
    consumed: set[str] = set()
    for key in keys:  # each quantized weight, with the scales and zero points it is made of
        made = _module(name, quantization, key, present, tensor)
        if made is not None:
            out_key, value, used = made
            consumed.update(used)
            yield out_key, value
    for key in keys:  # then what is stored as it is
        if key not in consumed and key.rsplit(".", 1)[-1] not in RUN_TIME_SCALES:
            yield key, tensor(key)


def _module(name: str, q: dict[str, Any], key: str, present: set[str],
            tensor: Callable[[str], Any]) -> tuple[str, Any, set[str]] | None:  # fmt: skip
    """(the float weight's name, its value, the stored tensors it was made of) where `key` is the
    quantized part of a weight; None where `key` is stored as it is."""
    prefix, _, leaf = key.rpartition(".")
    part = (lambda n: f"{prefix}.{n}") if prefix else (lambda n: n)
    if name == "mxfp4" and leaf.endswith("_blocks") and key[:-7] + "_scales" in present:
        return key[:-7], mxfp4(tensor(key), tensor(key[:-7] + "_scales")), {key, key[:-7] + "_scales"}
    if name in ("gptq", "awq") and leaf == "qweight":
        pieces = {n: tensor(part(n)) for n in ("qweight", "qzeros", "scales", "g_idx") if part(n) in present}
        bits = int(q.get("bits", q.get("w_bit", 4)))
        if name == "awq":
            value = awq(pieces["qweight"], pieces["qzeros"], pieces["scales"])
        else:
            value = gptq(pieces["qweight"], pieces.get("qzeros"), pieces["scales"], pieces.get("g_idx"), bits,
                         offset_zeros=q.get("checkpoint_format", "gptq") != "gptq_v2", symmetric=q.get("sym", True))
        return part("weight"), value, {part(n) for n in pieces}
    if name == "compressed-tensors" and leaf == "weight_packed" and part("weight_global_scale") in present:
        used = {key, part("weight_scale"), part("weight_global_scale")}
        value = nvfp4(tensor(key), tensor(part("weight_scale")), tensor(part("weight_global_scale")), inverse=True)
        return part("weight"), value, used
    if name == "modelopt" and leaf == "weight" and part("weight_scale_2") in present:
        used = {key, part("weight_scale"), part("weight_scale_2")}
        return key, nvfp4(tensor(key), tensor(part("weight_scale")), tensor(part("weight_scale_2"))), used
    if name == "compressed-tensors" and leaf == "weight_packed":
        pieces = {n: tensor(part(n)) for n in ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point",
                                              "weight_g_idx") if part(n) in present}  # fmt: skip
        value = packed_integers(pieces, _weight_bits(q, prefix))
        return part("weight"), value, {part(n) for n in pieces}
    if name == "bitsandbytes" and leaf == "weight":
        state = next((part(f"weight.quant_state.bitsandbytes__{kind}") for kind in ("nf4", "fp4")
                      if part(f"weight.quant_state.bitsandbytes__{kind}") in present), None)  # fmt: skip
        if state is not None:
            pieces = {n: tensor(part(f"weight.{n}")) for n in BNB_4BIT_PARTS if part(f"weight.{n}") in present}
            value = bnb_4bit(tensor(key), pieces, json.loads(bytes(tensor(state).tolist())), prefix)
            return key, value, {key, state} | {part(f"weight.{n}") for n in pieces}
        if part("SCB") in present:
            layout = part("weight_format")
            if layout in present and int(tensor(layout)) != 0:  # 0: row-major; the rest were GPU tile layouts
                raise BundleError(f"{prefix}: 8-bit bitsandbytes weights in tile layout {int(tensor(layout))} "
                                  "(read: row-major, what bitsandbytes 0.45 and later write)")  # fmt: skip
            used = {key, part("SCB")} | ({layout} if layout in present else set())
            return key, bnb_int8(tensor(key), tensor(part("SCB"))), used
    if leaf == "weight" and name in ("fp8", "fbgemm_fp8", "compressed-tensors", "modelopt"):
        for scale_name in ("weight_scale_inv", "weight_scale"):
            if part(scale_name) in present:
                zero = tensor(part("weight_zero_point")) if part("weight_zero_point") in present else None
                value = scaled(tensor(key), tensor(part(scale_name)), zero, _block(q))
                used = {key, part(scale_name)} | ({part("weight_zero_point")} if zero is not None else set())
                return key, value, used
    return None


def scaled(weight: Any, scale: Any, zero_point: Any = None, block: tuple[int, int] | None = None) -> Any:
    """An [out, in] weight (FP8 or integers) times its scale: one number, one per output row, one
    per group of the input along each row, or one per `block` (a grid of ceil(out/b0) x
    ceil(in/b1)); minus a zero point of the scale's shape first, where it has one."""
    import torch

    w = weight.to(torch.float32)
    if zero_point is not None:
        w = w - _expanded(zero_point.to(torch.float32), w.shape, block)
    return w * _expanded(scale.to(torch.float32), w.shape, block)


def _expanded(grid: Any, shape: Any, block: tuple[int, int] | None = None) -> Any:
    """A per-tensor, per-row, per-group or per-block grid of values repeated to `shape` [out, in]:
    each cell covers `block` where given (the last row and column of cells may be cut short),
    else an equal share of the rows and of the columns."""
    rows, cols = shape
    if grid.numel() == 1:
        return grid.reshape(1, 1)
    if grid.dim() == 1:
        grid = grid.reshape(-1, 1)
    r, c = grid.shape
    if block is None:
        if rows % r or cols % c:
            raise BundleError(f"a scale grid of {r} x {c} does not divide a weight of {rows} x {cols}")
        block = (rows // r, cols // c)
    grid = grid.repeat_interleave(block[0], 0)[:rows]
    return grid.repeat_interleave(block[1], 1)[:, :cols]


def _block(q: dict[str, Any]) -> tuple[int, int] | None:
    """The [rows, columns] each scale covers where the config states blocks (FP8's
    `weight_block_size`, compressed-tensors' `block_structure`)."""
    sizes = q.get("weight_block_size")
    for group in (q.get("config_groups") or {}).values():
        weights = group.get("weights") if isinstance(group, dict) else None
        if isinstance(weights, dict) and weights.get("block_structure"):
            sizes = weights["block_structure"]
    if isinstance(sizes, str):  # compressed-tensors' older "AxB"
        sizes = sizes.lower().split("x")
    return (int(sizes[0]), int(sizes[1])) if sizes else None


def unpacked(packed: Any, bits: int, axis: int) -> Any:
    """int32 words of 32 // bits values each, element 0 in the lowest bits, unpacked along `axis`
    (0: each word holds consecutive rows; 1: consecutive columns)."""
    import torch

    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    words = packed.to(torch.int32)
    if axis == 0:
        values = (words.unsqueeze(1) >> shifts.reshape(1, -1, 1)) & ((1 << bits) - 1)
        return values.reshape(words.shape[0] * per_word, words.shape[1])
    values = (words.unsqueeze(2) >> shifts.reshape(1, 1, -1)) & ((1 << bits) - 1)
    return values.reshape(words.shape[0], words.shape[1] * per_word)


def gptq(qweight: Any, qzeros: Any, scales: Any, g_idx: Any, bits: int, *, offset_zeros: bool = True,
         symmetric: bool = True) -> Any:  # fmt: skip
    """GPTQ's [out, in] weight: qweight [in / (32/bits), out] packed down the input, qzeros
    [groups, out / (32/bits)] packed along the output, stored one less than the zero point (the
    original format, not gptq_v2's), scales [groups, out], and each input's group (`g_idx`, which
    act-order permutes; consecutive groups where absent)."""
    import torch

    q = unpacked(qweight, bits, 0).to(torch.float32)  # [in, out]
    groups = scales.shape[0]
    if qzeros is not None:
        zeros = unpacked(qzeros, bits, 1)[:, : scales.shape[1]]
        if offset_zeros:
            zeros = (zeros + 1) & ((1 << bits) - 1)
    elif symmetric:
        zeros = torch.full(scales.shape, 1 << (bits - 1), dtype=torch.int32)
    else:
        raise BundleError("GPTQ weights without zero points that are not symmetric")
    if g_idx is None:
        g_idx = torch.arange(q.shape[0]) // math.ceil(q.shape[0] / groups)
    g = g_idx.to(torch.long)
    return ((q - zeros.to(torch.float32)[g]) * scales.to(torch.float32)[g]).T


def awq(qweight: Any, qzeros: Any, scales: Any) -> Any:
    """AWQ's (GEMM layout) [out, in] weight: qweight [in, out / 8] and qzeros [groups, out / 8]
    packed along the output, AWQ's column order in each word; scales [groups, out]."""
    import torch

    order = torch.tensor(AWQ_ORDER)
    inverse = torch.argsort(order)  # the column each nibble holds -> the nibble each column is in

    def columns(words: Any) -> Any:
        values = unpacked(words, 4, 1).reshape(words.shape[0], -1, 8)
        return values[:, :, inverse].reshape(words.shape[0], -1)

    q, zeros = columns(qweight).to(torch.float32), columns(qzeros).to(torch.float32)
    group = q.shape[0] // scales.shape[0]
    return ((q - zeros.repeat_interleave(group, 0)) * scales.to(torch.float32).repeat_interleave(group, 0)).T


def packed_integers(pieces: dict[str, Any], bits: int) -> Any:
    """compressed-tensors' pack-quantized [out, in] weight: weight_packed [out, in / (32/bits)],
    each value stored plus 2^(bits-1) (unsigned), element 0 in a word's lowest bits; the scale per
    row, per group or per tensor; a zero point of the scale's shape packed down the output where
    asymmetric; act-order's `weight_g_idx` mapping each input to its group."""
    import torch

    rows, cols = (int(n) for n in pieces["weight_shape"].tolist())
    offset = 1 << (bits - 1)
    q = unpacked(pieces["weight_packed"], bits, 1)[:, :cols].to(torch.float32) - offset
    scale = pieces["weight_scale"].to(torch.float32)
    zero = pieces.get("weight_zero_point")
    if zero is not None:
        zero = (unpacked(zero, bits, 0)[:rows] - offset).to(torch.float32) if zero.dtype == torch.int32 \
            else zero.to(torch.float32)  # fmt: skip
    g_idx = pieces.get("weight_g_idx")
    if g_idx is not None and bool((g_idx >= 0).all()) and scale.dim() == 2 and scale.shape[1] > 1:  # -1: in order
        g = g_idx.to(torch.long)
        if zero is not None:
            q = q - zero[:, g]
        return q * scale[:, g]
    return scaled(q, scale, zero)


def bnb_4bit(packed: Any, pieces: dict[str, Any], state: dict[str, Any], prefix: str = "") -> Any:
    """bitsandbytes' 4-bit weight as Params4bit serializes it: the weight's codes flattened, two to
    a byte, the first in the high nibble (bytes of another storage dtype where `quant_storage` says
    so); each block of `blocksize` codes is its entry in the file's table (`quant_map`: NF4's or
    FP4's) times the block's absmax, which double quantization stores as 8-bit codes of
    `nested_quant_map` in blocks of `nested_blocksize`, each times its `nested_absmax`, plus
    `nested_offset`."""
    import torch

    if "quant_map" not in pieces or "absmax" not in pieces:
        raise BundleError(f"{prefix}: 4-bit bitsandbytes weights without their quant_map or absmax (written by a "
                          "bitsandbytes older than 0.41.3, which did not save them)")  # fmt: skip
    shape = [int(n) for n in state["shape"]]
    count = math.prod(shape)
    data = packed.reshape(-1).view(torch.uint8)
    codes = torch.stack((data >> 4, data & 0x0F), dim=1).reshape(-1)[:count].to(torch.long)
    absmax = pieces["absmax"]
    if "nested_absmax" in pieces:
        nested = pieces["nested_quant_map"].to(torch.float32)[absmax.to(torch.long)]
        absmax = _by_block(nested, pieces["nested_absmax"], int(state["nested_blocksize"])) + \
            float(state["nested_offset"])  # fmt: skip
    values = _by_block(pieces["quant_map"].to(torch.float32)[codes], absmax, int(state["blocksize"]))
    return values.reshape(shape)


def _by_block(values: Any, scales: Any, block: int) -> Any:
    """Each run of `block` consecutive values (the last may be short) times its own scale."""
    return values * scales.to(values.dtype).repeat_interleave(block)[: values.numel()]


def bnb_int8(weight: Any, row_absmax: Any) -> Any:
    """bitsandbytes' 8-bit (LLM.int8) [out, in] weight: int8 values, each row times its absmax (`SCB`)
    over 127."""
    import torch

    return weight.to(torch.float32) * row_absmax.to(torch.float32).reshape(-1, 1) * INT8_ROW_SCALE


def fp4_values(packed: Any) -> Any:
    """FP4 (E2M1) codes two to a byte, the low nibble first, as float32 values: the last dimension
    doubles."""
    import torch

    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).to(torch.long)
    return torch.tensor(FP4_VALUES, dtype=torch.float32)[codes].reshape(*packed.shape[:-1], -1)


def nvfp4(packed: Any, block_scale: Any, tensor_scale: Any, inverse: bool = False) -> Any:
    """An NVFP4 [out, in] weight: packed [out, in / 2] (fp4_values), each group of 16 inputs times
    its FP8 (E4M3) scale [out, in / 16] times the tensor's float32 scale (Model Optimizer's
    `weight_scale_2`), or over it where `inverse` (compressed-tensors' `weight_global_scale`)."""
    import torch

    values = fp4_values(packed)
    block, whole = block_scale.to(torch.float32), tensor_scale.to(torch.float32)
    scale = block / whole if inverse else block * whole
    return values * _expanded(scale, values.shape)


def mxfp4(blocks: Any, scales: Any) -> Any:
    """gpt-oss's MXFP4 experts: blocks [experts, rows, groups, 16] of two FP4 codes per byte
    (fp4_values), each group of 32 scaled by 2^(its uint8 exponent - 127); returned
    [experts, groups * 32, rows], the layout transformers' GptOss experts hold."""
    import torch

    values = torch.ldexp(fp4_values(blocks), (scales.to(torch.int32) - 127).unsqueeze(-1))
    experts, rows = blocks.shape[0], blocks.shape[1]
    return values.reshape(experts, rows, -1).transpose(1, 2)


def _compressed_formats(q: dict[str, Any]) -> set[str]:
    formats = {str(group.get("format")) for group in (q.get("config_groups") or {}).values()
               if isinstance(group, dict) and group.get("format")}  # fmt: skip
    return formats or {str(q.get("format", "dense"))}


def _group_bits(q: dict[str, Any]) -> set[int]:
    """The bits compressed-tensors' config groups give their weights."""
    found = set()
    for group in (q.get("config_groups") or {}).values():
        weights = group.get("weights") if isinstance(group, dict) else None
        if isinstance(weights, dict) and weights.get("num_bits"):
            found.add(int(weights["num_bits"]))
    return found


def _weight_bits(q: dict[str, Any], prefix: str) -> int:
    """The bits of compressed-tensors' packed weights (refusal() leaves one width for all groups)."""
    bits = _group_bits(q)
    if not bits:
        raise BundleError(f"{prefix}: compressed-tensors packed weights, but no config group states their bits")
    return bits.pop()
