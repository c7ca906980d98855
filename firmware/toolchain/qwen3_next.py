"""Qwen3-Next (Qwen3-Next-80B-A3B and its instruct and thinking models) built as the Qwen3.5
mixture-of-experts language model it grew into: transformers builds the second from the first's
classes (gated delta-net and gated full-attention layers, the same norms, experts and shared
expert), and the builder has a class for the second only. Only the layout of two projections
differs: Qwen3-Next fuses each linear-attention layer's queries, keys, values and output gate
(`in_proj_qkvz`) and its two gates (`in_proj_ba`) key head by key head, where Qwen3.5 keeps them
apart, head-major. Its routing renormalizes the chosen experts' weights only where
`norm_topk_prob` (every published config), Qwen3.5's always: a config without is refused."""

from __future__ import annotations

from typing import Any

ARCHITECTURE = "Qwen3NextForCausalLM"
# Qwen3-Next config fields Qwen3.5's text config takes as they are.
SHARED_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "hidden_act", "rms_norm_eps", "attention_bias", "attention_dropout",
                 "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                 "linear_num_value_heads", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                 "shared_expert_intermediate_size", "tie_word_embeddings", "layer_types", "max_position_embeddings",
                 "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range")  # fmt: skip


def refusal(config: dict[str, Any]) -> str | None:
    """What of a Qwen3-Next config Qwen3.5's layers do not compute (None: nothing)."""
    if config.get("model_type") != "qwen3_next":
        return None
    if not config.get("norm_topk_prob", True):
        return "Qwen3-Next with norm_topk_prob false (its experts' weights not renormalized) is not exported"
    if config.get("mlp_only_layers") or int(config.get("decoder_sparse_step", 1)) != 1:
        return "Qwen3-Next with dense layers (mlp_only_layers, decoder_sparse_step) is not exported"
    return None


def as_qwen3_5_moe_config(config: Any) -> Any:
    """A Qwen3-Next config -> Qwen3.5's mixture-of-experts text config of the same model, named as
    its language model saved alone (which the builder's Qwen3.5 classes build); any other config as
    it is."""
    import sys

    if list(getattr(config, "architectures", None) or ())[:1] != [ARCHITECTURE]:
        return config
    transformers = sys.modules["transformers"]
    fields = {name: getattr(config, name) for name in SHARED_FIELDS if hasattr(config, name)}
    rope = dict(getattr(config, "rope_parameters", None) or {})
    rope.setdefault("partial_rotary_factor", getattr(config, "partial_rotary_factor", 0.25))
    text = transformers.Qwen3_5MoeTextConfig(**fields, rope_parameters={
        "rope_type": "default", "rope_theta": rope.get("rope_theta", 10000.0),
        "partial_rotary_factor": rope["partial_rotary_factor"]})  # fmt: skip
    text.architectures = ["Qwen3_5MoeForCausalLM"]
    text._name_or_path = config._name_or_path
    text.zerolayer_qwen3_next = True
    return text


def as_qwen3_5_moe(model: Any, config: Any) -> Any:
    """A loaded Qwen3NextForCausalLM -> Qwen3_5MoeForCausalLM of `config` (as_qwen3_5_moe_config's)
    holding the same weights, the linear-attention layers' fused projections split."""
    import sys

    import torch

    transformers = sys.modules["transformers"]
    nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv, r = config.linear_key_head_dim, config.linear_value_head_dim, nv // nk
    state = {}
    for key, value in model.state_dict().items():
        prefix, _, leaf = key.rpartition(".in_proj_")
        if leaf == "qkvz.weight":  # per key head: its query, its key, its r values, their r output gates
            q, k, v, z = value.reshape(nk, 2 * dk + 2 * r * dv, -1).split([dk, dk, r * dv, r * dv], dim=1)
            hidden = value.shape[-1]
            state[f"{prefix}.in_proj_qkv.weight"] = torch.cat([q.reshape(-1, hidden), k.reshape(-1, hidden),
                                                                v.reshape(-1, hidden)])  # fmt: skip
            state[f"{prefix}.in_proj_z.weight"] = z.reshape(-1, hidden)
        elif leaf == "ba.weight":  # per key head: the r values' b gates, then their a gates
            gates = value.reshape(nk, 2 * r, -1)
            state[f"{prefix}.in_proj_b.weight"] = gates[:, :r].reshape(nv, -1)
            state[f"{prefix}.in_proj_a.weight"] = gates[:, r:].reshape(nv, -1)
        else:
            state[key] = value
    with torch.device("meta"):  # no second copy of the weights: the loaded tensors are assigned
        converted = transformers.Qwen3_5MoeForCausalLM(config)
    converted.load_state_dict(state, strict=True, assign=True)
    rotary = converted.model.rotary_emb  # its frequencies are a buffer made, not loaded
    converted.model.rotary_emb = type(rotary)(config=config)
    assert not any(t.is_meta for t in (*converted.parameters(), *converted.buffers()))
    return converted.eval()
