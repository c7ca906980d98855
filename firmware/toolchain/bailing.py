"""inclusionAI's Ling 2.0 (BailingMoeV2ForCausalLM: Ling-mini-2.0, Ling-flash-2.0, Ring-mini-2.0 and
Ring-flash-2.0), whose checkpoints run through their own remote code, which transformers does not
ship: read before the export as the GLM-4.5 (Glm4MoeForCausalLM) it computes, a new folder of
GLM-4.5's config and names.

Its layers are GLM-4.5's: per-head query and key RMS norms, half of each head rotated by halves,
dense leading layers (first_k_dense_replace), then experts chosen by sigmoid scores plus a
correction bias within the best topk_group of n_group groups (each ranked by its two best
scores), mixed by those scores scaled to sum to 1 and by routed_scaling_factor, beside shared
experts added as they are. What differs is the layout: the queries, keys and values one projection
(all queries, then keys, then values), the embeddings, output projection and norms named its way,
the correction bias the router's `expert_bias`, and its multi-token prediction layers saved after
the model's (left out: they do not run when decoding)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from firmware.errors import BundleError
from firmware.toolchain import folders

ARCHITECTURE = "BailingMoeV2ForCausalLM"
# Ling 2.0's names -> GLM-4.5's (the fused queries, keys and values are split: glm4_moe_tensors).
RENAMED = ((r"^model\.word_embeddings\.", "model.embed_tokens."), (r"\.attention\.dense\.", ".self_attn.o_proj."),
           (r"\.attention\.query_layernorm\.", ".self_attn.q_norm."),
           (r"\.attention\.key_layernorm\.", ".self_attn.k_norm."),
           (r"\.mlp\.gate\.expert_bias$", ".mlp.gate.e_score_correction_bias"))  # fmt: skip
# BailingMoeV2Config's defaults where a published config.json leaves them out.
DEFAULTS = {"partial_rotary_factor": 0.5, "rope_theta": 600000.0, "use_qk_norm": True, "n_group": 1, "topk_group": 1,
            "routed_scaling_factor": 1.0, "first_k_dense_replace": 0, "num_shared_experts": 0}


def refusal(config: dict[str, Any]) -> str | None:
    """What of a Ling 2.0 config GLM-4.5's layers do not compute, or None."""
    if config.get("use_bias"):
        return "its attention's output projection has a bias (use_bias), which GLM-4.5's has not"
    scores = str(config.get("score_function", config.get("scoring_func", "sigmoid")))
    if scores != "sigmoid":
        return f"its experts are chosen by {scores} scores, not sigmoid ones"
    if int(config["num_experts_per_tok"]) < 2:  # (one chosen expert keeps its score, GLM-4.5's a weight of 1)
        return "it chooses one expert a token, whose score Ling 2.0 keeps unscaled"
    if config.get("norm_head"):
        return "its LM head is normalized (norm_head)"
    if config.get("use_sliding_window"):
        return "it slides its attention window (use_sliding_window)"
    return None


def glm4_moe_config(config: dict[str, Any]) -> dict[str, Any]:
    """A Ling 2.0 config.json -> GLM-4.5's, computing the same; refused (BundleError) where it cannot."""
    why = refusal(config)
    if why is not None:
        raise BundleError(f"a Ling 2.0 checkpoint (BailingMoeV2ForCausalLM) is read as GLM-4.5, but {why}; "
                          "not supported")  # fmt: skip
    c = {**DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    heads = int(c["num_attention_heads"])
    rope = folders.transformers4_rope(c, float(DEFAULTS["rope_theta"]),
                                      partial_rotary_factor=float(c["partial_rotary_factor"]))
    kept = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_key_value_heads",
            "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "bos_token_id",
            "eos_token_id", "pad_token_id", "moe_intermediate_size", "first_k_dense_replace", "n_group",
            "topk_group", "routed_scaling_factor", "num_experts_per_tok", "use_qk_norm", "torch_dtype", "dtype")
    return {**{k: c[k] for k in kept if k in c}, "model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"],
            "num_attention_heads": heads, "head_dim": int(c.get("head_dim") or int(c["hidden_size"]) // heads),
            "n_routed_experts": int(c["num_experts"]), "n_shared_experts": int(c["num_shared_experts"]),
            "attention_bias": bool(c.get("use_qkv_bias", False)), "norm_topk_prob": True,
            "num_nextn_predict_layers": 0, "rope_parameters": rope}  # fmt: skip


def glm4_moe_tensors(glm: dict[str, Any], tensors: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """Ling 2.0's weights (name, tensor) in GLM-4.5's names, for the GLM-4.5 config `glm`
    (glm4_moe_config's); the queries, keys and values split, a router without a correction bias
    given one of zeros, the prediction layers left out."""
    import torch

    layers, heads, kv, width = (glm["num_hidden_layers"], glm["num_attention_heads"], glm["num_key_value_heads"],
                                glm["head_dim"])  # fmt: skip
    routers, biased = set(), set()
    for name, tensor in tensors:
        layer = re.match(r"model\.layers\.(\d+)\.", name)
        if layer and int(layer.group(1)) >= layers:
            continue
        if ".attention.query_key_value." in name:
            prefix, suffix = name.split(".attention.query_key_value.")
            parts = tensor.split([heads * width, kv * width, kv * width])
            for proj, part in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
                yield f"{prefix}.self_attn.{proj}.{suffix}", part
            continue
        for pattern, replacement in RENAMED:
            name = re.sub(pattern, replacement, name)
        if name.endswith(".mlp.gate.weight"):
            routers.add(name.removesuffix(".weight"))
        if name.endswith(".mlp.gate.e_score_correction_bias"):
            biased.add(name.removesuffix(".e_score_correction_bias"))
        yield name, tensor
    for router in sorted(routers - biased):  # (moe_router_enable_expert_bias false: no bias)
        yield f"{router}.e_score_correction_bias", torch.zeros(glm["n_routed_experts"], dtype=torch.float32)


def as_glm4_moe(source: Path, out: Path) -> None:
    """The Ling 2.0 folder `source` as GLM-4.5's, written into `out` (its other files copied)."""
    config = json.loads((source / "config.json").read_text())
    glm = glm4_moe_config(config)
    names, tensor = folders.opened(source, "Ling 2.0 checkpoints")
    folders.rewrite(source, out, glm, glm4_moe_tensors(glm, ((name, tensor(name)) for name in names)))
