"""Checkpoints published with quantized weights (firmware/toolchain/prequantized.py): each format
as tiny_quantized.py writes it from a tiny fixture, dequantized as that format's own reader does
(transformers' CPU dequantization for FP8 and MXFP4, bitsandbytes' own for its folders, which it
writes itself, ONNX Runtime GenAI's loaders for GPTQ and AWQ, the compressed-tensors library's for
its formats, NVFP4 included, and Model Optimizer's NVFP4 as that library does the same codes),
built to firmware that answers as transformers does reading the quantized folder itself; the
formats not read are refused before the export."""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import firmware
from appliance.engine import ModelSession
from firmware.errors import BundleError
from firmware.manifest import LayerConstants
from firmware.toolchain import prequantized, tiny_quantized
from firmware.toolchain.build import BuildOptions, build
from firmware.toolchain.tiny import tiny_hf_dir

IDS = [1, 5, 9, 33, 100, 200, 300, 7, 8, 9, 10, 11, 400, 12, 13, 14]


def _tensors(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(str(folder / "model.safetensors")))


def _dequantized(tmp_path: Path, arch: str, kind: str, **options: Any) -> tuple[Path, dict[str, Any]]:
    quantized = tiny_quantized.write(tiny_hf_dir(arch), tmp_path / "quantized", kind, **options)
    assert prequantized.dequantize_folder(quantized, tmp_path / "float") == CONFIG_METHOD[kind]
    return quantized, _tensors(tmp_path / "float")


CONFIG_METHOD = {"fp8": "fp8", "gptq": "gptq", "awq": "awq", "mxfp4": "mxfp4", "fp8_channel": "compressed-tensors",
                 "int8_channel": "compressed-tensors", "packed": "compressed-tensors", "nvfp4": "compressed-tensors",
                 "bnb_nf4": "bitsandbytes",
                 "bnb_fp4": "bitsandbytes", "bnb_int8": "bitsandbytes"}  # fmt: skip


def _transformers(folder: Path) -> Any:
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)


@pytest.mark.parametrize(("arch", "kind"), [("llama", "fp8"), ("gpt_oss", "mxfp4")])
def test_fp8_and_mxfp4_weights_dequantize_as_transformers_does(tmp_path: Path, arch: str, kind: str) -> None:
    quantized, ours = _dequantized(tmp_path, arch, kind)
    theirs = _transformers(quantized).state_dict()  # without a GPU transformers dequantizes them
    assert set(ours) <= set(theirs)
    for key, value in ours.items():
        assert value.float().equal(theirs[key].float()), key
    config = json.loads((tmp_path / "float" / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert (tmp_path / "float" / "tokenizer.json").is_file() and (tmp_path / "float" / "chat_template.jinja").is_file()


@pytest.mark.parametrize("options", [{"kind": "bnb_nf4"}, {"kind": "bnb_nf4", "storage": "bfloat16"},
                                     {"kind": "bnb_fp4"}, {"kind": "bnb_int8"}],
                         ids=["nf4-double-quant", "nf4-bf16-storage", "fp4", "int8"])  # fmt: skip
def test_bitsandbytes_weights_dequantize_as_bitsandbytes_does(tmp_path: Path, options: dict[str, Any]) -> None:
    """Folders as unsloth publishes its "bnb-4bit" models: written by transformers and bitsandbytes,
    read back without either, equal to bitsandbytes' own dequantization of them."""
    kind = options.pop("kind")
    quantized, ours = _dequantized(tmp_path, "qwen3", kind, **options)
    model = _transformers(quantized)
    stored = _tensors(quantized)
    assert any(k.endswith((".absmax", ".SCB")) for k in stored)  # bitsandbytes' own layout was written
    model.dequantize()
    theirs = model.state_dict()
    floats = _tensors(tiny_hf_dir("qwen3"))
    assert set(ours) == set(floats)
    for key, value in ours.items():
        assert value.float().equal(theirs[key].float()), key
    assert max((ours[k].float() - v.float()).abs().max() for k, v in floats.items()) > 1e-5  # stored, not the floats


def _onnxruntime_genai_weights(quantized: Path, kind: str, bits: int, group: int) -> dict[str, Any]:
    """ONNX Runtime GenAI's own GPTQ and AWQ unpacking and dequantization of each weight."""
    import onnxruntime_genai.models  # noqa: F401  (puts its loaders' folder on sys.path)
    from onnxruntime_genai.models.loaders.awq import AWQModel
    from onnxruntime_genai.models.loaders.gptq import GPTQModel

    stored = _tensors(quantized)
    reader: Any = AWQModel.__new__(AWQModel) if kind == "awq" else GPTQModel.__new__(GPTQModel)
    out = {}
    for key in stored:
        if not key.endswith(".qweight"):
            continue
        prefix = key[: -len(".qweight")]
        g_idx = stored.get(f"{prefix}.g_idx")
        module = types.SimpleNamespace(qweight=stored[key], qzeros=stored[f"{prefix}.qzeros"], bits=bits,
                                       scales=stored[f"{prefix}.scales"].float(), group_size=group,
                                       g_idx=g_idx.long() if g_idx is not None else None)  # fmt: skip
        if kind == "awq":
            module.out_features, module.in_features = module.scales.shape[1], module.qweight.shape[0]
        else:
            module.out_features, module.in_features = module.qweight.shape[1], g_idx.shape[0]
            reader.handle_qzeros(module)  # GPTQ's zero points are stored one less
        reader.unpack(module)
        out[f"{prefix}.weight"] = module.qweight.float()
    return out


@pytest.mark.parametrize("options", [{"kind": "gptq"}, {"kind": "gptq", "act_order": True},
                                     {"kind": "gptq", "bits": 8, "group": 64}, {"kind": "gptq", "bits": 2},
                                     {"kind": "awq"}], ids=["gptq4", "gptq4-act-order", "gptq8", "gptq2", "awq"])
def test_gptq_and_awq_weights_dequantize_as_onnxruntime_genai_s_loaders_do(tmp_path: Path,
                                                                          options: dict[str, Any]) -> None:  # fmt: skip
    kind = options.pop("kind")
    quantized, ours = _dequantized(tmp_path, "llama", kind, **options)
    theirs = _onnxruntime_genai_weights(quantized, kind, options.get("bits", 4), options.get("group", 32))
    assert len(theirs) == 14 and set(ours) == set(_tensors(tiny_hf_dir("llama")))
    for key, value in theirs.items():  # (theirs rounds the zero points' products to float16)
        assert (ours[key] - value).abs().max() <= 1e-3 * value.abs().max(), key


def _compressed_tensors_weight(local: dict[str, Any], quantization: dict[str, Any]) -> Any:
    """One module's weight as the compressed-tensors library dequantizes it (in float32: its NVFP4
    compressor would round to bfloat16 first)."""
    import torch
    from compressed_tensors import compressors
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    group = quantization["config_groups"]["group_0"]
    args = QuantizationArgs(**group["weights"])
    if group["format"] == "nvfp4-pack-quantized":
        packed = local["weight_packed"]
        codes = unpack_fp4_from_uint8(packed, packed.shape[0], packed.shape[1] * 2, dtype=torch.float32)
        return dequantize(codes, local["weight_scale"].float(), args=args, global_scale=local["weight_global_scale"],
                          dtype=torch.float32)  # fmt: skip
    compressor = {"pack-quantized": compressors.PackedQuantizationCompressor,
                  "int-quantized": compressors.IntQuantizationCompressor,
                  "float-quantized": compressors.FloatQuantizationCompressor}[group["format"]]  # fmt: skip
    local = {n: v.float() if n == "weight_scale" else v for n, v in local.items()}
    return compressor.decompress(local, QuantizationScheme(targets=["Linear"], weights=args))["weight"]


def _modules(stored: dict[str, Any], floats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each quantized weight's name -> its module's stored tensors, by their names in the module."""
    out = {}
    for key in floats:
        prefix = key.removesuffix(".weight") + "."
        local = {n[len(prefix):]: v for n, v in stored.items() if n.startswith(prefix)}
        if "weight_scale" in local:
            out[key] = local
    return out


@pytest.mark.parametrize("options", [{"kind": "fp8_channel"}, {"kind": "int8_channel"}, {"kind": "packed"},
                                     {"kind": "packed", "bits": 8}, {"kind": "nvfp4"}],
                         ids=["float-quantized", "int-quantized", "pack-quantized-4", "pack-quantized-8",
                              "nvfp4-pack-quantized"])  # fmt: skip
def test_compressed_tensors_weights_dequantize_as_its_library_does(tmp_path: Path, options: dict[str, Any]) -> None:
    kind = options.pop("kind")
    quantized, ours = _dequantized(tmp_path, "llama", kind, **options)
    floats, stored = _tensors(tiny_hf_dir("llama")), _tensors(quantized)
    quantization = json.loads((quantized / "config.json").read_text())["quantization_config"]
    assert set(ours) == set(floats)  # the activation scales are not weights
    modules = _modules(stored, floats)
    assert len(modules) == 14
    for key, value in floats.items():
        if key not in modules:
            assert ours[key].equal(value), key
            continue
        assert ours[key].equal(_compressed_tensors_weight(modules[key], quantization)), key
        assert not ours[key].equal(value), key  # the stored grid, not the floats


@pytest.mark.parametrize("kind", ["modelopt_nvfp4", "modelopt_fp8"])
def test_model_optimizer_weights_dequantize_as_their_scales_say(tmp_path: Path, kind: str) -> None:
    """NVIDIA's Model Optimizer checkpoints (nvidia/*-FP8, *-FP4): NVFP4 is compressed-tensors'
    grid with the tensor scale stored inverted, so the same codes must dequantize as that library
    does them; FP8 is one scale per tensor. Its first exports state the quantization only in
    hf_quant_config.json, which is read and not copied."""
    quantized = tiny_quantized.write(tiny_hf_dir("llama"), tmp_path / "quantized", kind)
    config = json.loads((quantized / "config.json").read_text())
    stated = config.pop("quantization_config")
    (quantized / "config.json").write_text(json.dumps(config))
    (quantized / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.19.0"},
        "quantization": {k: v for k, v in stated.items() if k != "quant_method"}}))  # fmt: skip
    assert prequantized.dequantize_folder(quantized, tmp_path / "float") == "modelopt"
    assert not (tmp_path / "float" / "hf_quant_config.json").exists()
    ours, floats, stored = _tensors(tmp_path / "float"), _tensors(tiny_hf_dir("llama")), _tensors(quantized)
    assert set(ours) == set(floats)
    modules = _modules(stored, floats)
    assert len(modules) == 14
    for key, local in modules.items():
        if kind == "modelopt_fp8":
            expected = local["weight"].float() * local["weight_scale"]
        else:
            as_compressed = {"weight_packed": local["weight"], "weight_scale": local["weight_scale"],
                             "weight_global_scale": 1 / local["weight_scale_2"].reshape(1)}
            expected = _compressed_tensors_weight(as_compressed, tiny_quantized.CONFIGS["nvfp4"]())
        assert (ours[key] - expected).abs().max() <= 1e-6 * expected.abs().max(), key
        assert not ours[key].equal(floats[key]), key


def _build(source: Path, out: Path, trusted_keys: Path, dev_key: Path) -> firmware.Bundle:
    build(source, out, BuildOptions(precision="fp32", name="quantized", version="0.1.0",
                                    layer=LayerConstants(max_tokens_per_shard=64)), key=dev_key,
          progress=lambda _: None)  # fmt: skip
    return firmware.load(out, trusted_keys)


def test_a_quantized_folder_builds_to_firmware_that_answers_as_transformers_reading_it(
        tmp_path: Path, trusted_keys: Path, dev_key: Path) -> None:  # fmt: skip
    """gpt-oss as OpenAI publishes it (its experts in MXFP4; every format goes through the same
    dequantized folder), its chat template only in the processor's chat_template.json, as
    image-and-text checkpoints (LLaVA's, SmolVLM's, Ministral 3's) keep theirs: the builder does
    not copy that file, so the build reads and packs it."""
    import torch

    arch, kind = "gpt_oss", "mxfp4"
    quantized = tiny_quantized.write(tiny_hf_dir(arch), tmp_path / "quantized", kind)
    template = (quantized / "chat_template.jinja").read_text()
    (quantized / "chat_template.jinja").unlink()
    config = json.loads((quantized / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (quantized / "tokenizer_config.json").write_text(json.dumps(config))
    (quantized / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    bundle = _build(quantized, tmp_path / "bundle", trusted_keys, dev_key)
    assert bundle.manifest.source["dequantized_from"] == kind  # what the operator sees it was built from
    assert bundle.chat_template == template
    session = ModelSession(bundle)
    cache = session.new_cache(len(IDS) + 8)
    logits = session.forward(cache, np.array(IDS, dtype=np.int64))
    model = _transformers(quantized)
    with torch.no_grad():
        theirs = model(torch.tensor([IDS])).logits[0, -1].numpy()
        unquantized = _transformers(tiny_hf_dir(arch))(torch.tensor([IDS])).logits[0, -1].numpy()
    assert np.abs(logits - theirs).max() <= 1e-4
    assert np.abs(theirs - unquantized).max() > 1e-3  # the quantization shows: the weights are the stored ones
    ids, tokens = list(IDS), []
    for _ in range(8):
        tokens.append(int(logits.argmax()))
        logits = session.forward(cache, np.array(tokens[-1:], dtype=np.int64))
    with torch.no_grad():
        expected = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
    assert tokens == expected


@pytest.mark.parametrize(("quantization", "refusal"), [
    ({"quant_method": "hqq", "nbits": 4}, "'hqq', which this build does not read"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "3-bit GPTQ weights"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "AWQ weights in its 'gemv' layout"),
    ({"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "config_groups": {}},
     "the mxfp4-pack-quantized format"),
    ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "Model Optimizer weights quantized as 'W4A8_AWQ'"),
    ({"quant_method": "gptq", "bits": 4, "dynamic": {r"+:.*\.mlp\..*": {"bits": 8}}},
     "other bits or groups per module"),
    ({"quant_method": "awq", "bits": 4, "version": "gemm", "zero_point": False}, "without zero points"),
    ({"quant_method": "compressed-tensors", "format": "mixed-precision", "config_groups": {
        "a": {"format": "pack-quantized", "weights": {"num_bits": 4}},
        "b": {"format": "pack-quantized", "weights": {"num_bits": 8}}}}, "of 4 and 8 bits in different groups"),
])  # fmt: skip
def test_a_format_not_read_is_refused_before_the_export_naming_it(tmp_path: Path, quantization: dict[str, Any],
                                                                 refusal: str) -> None:  # fmt: skip
    source = tmp_path / "source"
    shutil.copytree(tiny_hf_dir("llama"), source)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "quantization_config": quantization}))
    with pytest.raises(BundleError, match=refusal) as refused:
        build(source, tmp_path / "out", BuildOptions(precision="fp32"), progress=lambda _: None)
    assert "unquantized folder" in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_a_block_grid_that_stops_short_of_the_weight_covers_its_edges() -> None:
    """FP8 blocks of 128 on a weight of 200 x 300: a 2 x 3 grid whose last row and column of
    blocks are cut short (DeepSeek's and Qwen3's widths are not all multiples of 128)."""
    import torch

    weight, grid = torch.ones(200, 300), torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    value = prequantized.scaled(weight, grid, block=(128, 128))
    assert value[127, 127] == 1 and value[128, 255] == 5 and value[199, 299] == 6 and value[0, 256] == 3
    with pytest.raises(BundleError, match="does not divide"):
        prequantized.scaled(torch.ones(201, 300), grid)  # without the block size, a cut-short grid is not guessed
