"""OpenBMB's MiniCPM (MiniCPMForCausalLM: MiniCPM-1B and -2B, MiniCPM4-0.5B and -8B, MiniCPM4.1-8B),
whose checkpoints run through their own remote code, which transformers does not ship: read before
the export as the Granite (GraniteForCausalLM) it computes, a folder of Granite's config beside the
same weights (a Llama's names, which Granite's are too), as llama.cpp runs MiniCPM with its Granite
graph.

MiniCPM is a Llama with µP's scales: the embeddings times scale_emb (Granite's
embedding_multiplier), each sublayer's output times scale_depth / sqrt(layers) before the residual
sum (residual_multiplier), the LM head's input over hidden_size / dim_model_base (logits_scaling),
and the attention's scores at 1/sqrt(head width) (attention_multiplier). MiniCPM4's sparse attention
(InfLLM v2, `sparse_config`), which its remote code runs past `dense_len` with a CUDA kernel of its
own, is computed densely at every length, as its remote code does without that kernel and as
llama.cpp does."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from firmware.errors import BundleError
from firmware.toolchain import folders

ARCHITECTURE = "MiniCPMForCausalLM"
# MiniCPM's config keys Granite's config takes as they are.
KEPT = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
        "bos_token_id", "eos_token_id", "pad_token_id", "attention_bias", "torch_dtype", "dtype")  # fmt: skip


def granite_config(config: dict[str, Any]) -> dict[str, Any]:
    """A MiniCPM config.json -> Granite's, computing the same; refused (BundleError) where it cannot."""
    if config.get("num_experts"):  # (MiniCPM-MoE-8x2B names the same class)
        raise BundleError("a MiniCPM checkpoint (MiniCPMForCausalLM) is read as Granite, but it has experts "
                          "(num_experts: MiniCPM-MoE), which Granite's layers have not; not supported")  # fmt: skip
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    layers = int(config["num_hidden_layers"])
    rope = folders.transformers4_rope(config, 10000.0)  # (MiniCPM4's LongRoPE in its rope_scaling)
    return {**{k: config[k] for k in KEPT if k in config}, "model_type": "granite",
            "architectures": ["GraniteForCausalLM"], "rope_parameters": rope,
            "embedding_multiplier": float(config["scale_emb"]),
            "residual_multiplier": float(config["scale_depth"]) / math.sqrt(layers),
            "logits_scaling": hidden / float(config["dim_model_base"]),
            "attention_multiplier": (hidden // heads) ** -0.5}  # fmt: skip


def as_granite(source: Path, out: Path) -> None:
    """The MiniCPM folder `source` as Granite's, written into `out`: its config; its weights and other
    files linked, as they are."""
    config = json.loads((source / "config.json").read_text())
    folders.relabel(source, out, granite_config(config))
