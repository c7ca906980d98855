"""Checkpoints of remote code read before the export as the family they compute (build.READ_AS):
Ling 2.0's as GLM-4.5 (firmware/toolchain/bailing.py), MiniCPM's as Granite (minicpm.py). What the
architecture matrix's ling2 and minicpm fixtures (tests/engine/test_architectures.py,
test_gguf_architectures.py) do not hold: Ling 2.0's multi-token prediction layers and a router
without a correction bias, and the options the family read as does not compute, refused before the
export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from firmware.errors import BundleError
from firmware.toolchain import bailing, minicpm
from firmware.toolchain.build import BuildOptions, build
from firmware.toolchain.tiny import tiny_hf_dir


def _folder() -> tuple[dict[str, Any], dict[str, Any]]:
    from safetensors.torch import load_file

    folder = tiny_hf_dir("ling2")
    return json.loads((folder / "config.json").read_text()), dict(load_file(str(folder / "model.safetensors")))


def test_the_prediction_layers_are_left_out_and_a_router_without_a_bias_gets_zeros() -> None:
    import torch

    config, tensors = _folder()
    layers = config["num_hidden_layers"]
    config |= {"num_nextn_predict_layers": 1, "moe_router_enable_expert_bias": False}
    mtp = {f"model.layers.{layers}.{name}": torch.ones(4) for name in ("attention.dense.weight", "enorm.weight")}
    unbiased = {name: value for name, value in tensors.items() if not name.endswith("expert_bias")}
    glm = dict(bailing.glm4_moe_tensors(bailing.glm4_moe_config(config), [*unbiased.items(), *mtp.items()]))
    assert not [name for name in glm if name.startswith(f"model.layers.{layers}.")]
    routers = [name for name in glm if name.endswith("mlp.gate.weight")]
    assert routers and all(glm[name.replace(".weight", ".e_score_correction_bias")].eq(0).all() for name in routers)
    assert bailing.glm4_moe_config(config)["num_hidden_layers"] == layers


def test_the_queries_keys_and_values_are_split_as_ling_2_0_lays_them_out() -> None:
    config, tensors = _folder()
    glm = dict(bailing.glm4_moe_tensors(bailing.glm4_moe_config(config), tensors.items()))
    fused = tensors["model.layers.0.attention.query_key_value.weight"]
    width, heads, kv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    assert glm["model.layers.0.self_attn.q_proj.weight"].equal(fused[: heads * width])
    assert glm["model.layers.0.self_attn.k_proj.weight"].equal(fused[heads * width : (heads + kv) * width])
    assert glm["model.layers.0.self_attn.v_proj.weight"].equal(fused[(heads + kv) * width :])


@pytest.mark.parametrize(("option", "refused"), [
    ({"use_bias": True}, r"output projection has a bias \(use_bias\)"),
    ({"score_function": "softmax"}, r"chosen by softmax scores"),
    ({"num_experts_per_tok": 1}, r"one expert a token"),
    ({"norm_head": True}, r"LM head is normalized \(norm_head\)"),
    ({"use_sliding_window": True}, r"use_sliding_window"),
])  # fmt: skip
def test_what_glm_4_5_does_not_compute_is_refused_naming_it(option: dict[str, Any], refused: str,
                                                            tmp_path: Path) -> None:  # fmt: skip
    hf = tmp_path / "hf"
    shutil.copytree(tiny_hf_dir("ling2"), hf)
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps(config | option))
    with pytest.raises(BundleError, match=rf"Ling 2\.0 .* read as GLM-4\.5, but .*{refused}"):
        build(hf, tmp_path / "out", BuildOptions(precision="fp32"))


def test_a_minicpm_checkpoint_is_granite_with_its_scales_and_its_folder_s_weights(tmp_path: Path) -> None:
    config = json.loads((tiny_hf_dir("minicpm") / "config.json").read_text())
    granite = minicpm.granite_config(config)
    assert granite["embedding_multiplier"] == config["scale_emb"]
    assert granite["logits_scaling"] == config["hidden_size"] / config["dim_model_base"]
    assert granite["attention_multiplier"] == (config["hidden_size"] // config["num_attention_heads"]) ** -0.5
    minicpm.as_granite(tiny_hf_dir("minicpm"), tmp_path / "granite")
    weights = tmp_path / "granite" / "model.safetensors"
    assert weights.resolve() == (tiny_hf_dir("minicpm") / "model.safetensors").resolve()  # (linked, not copied)


def test_a_minicpm_checkpoint_with_experts_is_refused(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    shutil.copytree(tiny_hf_dir("minicpm"), hf)
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps(config | {"num_experts": 8, "num_experts_per_tok": 2}))
    with pytest.raises(BundleError, match=r"MiniCPM .* read as Granite, but it has experts \(num_experts"):
        build(hf, tmp_path / "out", BuildOptions(precision="fp32"))


def test_a_published_config_s_rope_scaling_becomes_the_family_s_rope_parameters() -> None:
    """transformers 4's keys (rope_theta, rope_scaling with its "type"), as Ling 2.0's and MiniCPM's
    configs write them, over what the family read as keeps of its own (Ling 2.0's half rotation)."""
    config, _ = _folder()
    scaled = config | {"rope_theta": 50000.0, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                                "original_max_position_embeddings": 4096}}
    assert bailing.glm4_moe_config(scaled)["rope_parameters"] == {
        "rope_type": "yarn", "rope_theta": 50000.0, "partial_rotary_factor": 0.5, "factor": 4.0,
        "original_max_position_embeddings": 4096}
    minicpm_config = json.loads((tiny_hf_dir("minicpm") / "config.json").read_text())
    rope = minicpm.granite_config(minicpm_config)["rope_parameters"]
    assert rope["rope_type"] == "longrope" and rope["short_factor"] == minicpm_config["rope_scaling"]["short_factor"]


def test_a_ling_2_0_folder_without_safetensors_is_refused_saying_why(tmp_path: Path) -> None:
    source = tmp_path / "ling"
    source.mkdir()
    shutil.copy2(tiny_hf_dir("ling2") / "config.json", source / "config.json")
    (source / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(BundleError, match=r"no \.safetensors file \(Ling 2\.0 checkpoints are read from safetensors "
                                          r"only\)"):  # fmt: skip
        bailing.as_glm4_moe(source, tmp_path / "out")
