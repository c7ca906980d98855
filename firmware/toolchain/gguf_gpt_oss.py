"""gpt-oss from a GGUF file as llama.cpp writes it (ggml-org's gpt-oss-20b and 120b files, the ones
llama.cpp and Ollama users have): transformers' GGUF loader reads none of the architecture, so its
config and tensors are read here. llama.cpp's converter splits each layer's experts' fused gate and
up projections (whose columns alternate gate, up) into ffn_gate_exps and ffn_up_exps, keeps the
experts in MXFP4 (dequantized here by gguf's own reader), and writes no layer pattern nor the
SwiGLU clamp: llama.cpp runs every other layer sliding, from the first, and clamps at 7, as every
published gpt-oss does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from firmware.errors import BundleError

ARCH = "gpt-oss"
SWIGLU_LIMIT = 7.0  # llama.cpp's constant for the architecture (llama-graph.cpp), gpt-oss's own
# llama.cpp's tensor names -> transformers' GptOss names, per layer ({} is the layer), or whole.
LAYER_TENSORS = {"attn_norm.weight": "input_layernorm.weight",
                 "post_attention_norm.weight": "post_attention_layernorm.weight",
                 "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
                 "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
                 "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
                 "attn_output.weight": "self_attn.o_proj.weight", "attn_output.bias": "self_attn.o_proj.bias",
                 "attn_sinks.weight": "self_attn.sinks", "ffn_gate_inp.weight": "mlp.router.weight",
                 "ffn_gate_inp.bias": "mlp.router.bias", "ffn_down_exps.bias": "mlp.experts.down_proj_bias"}
MODEL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}  # fmt: skip


def config(meta: dict[str, Any]) -> Any:
    """GptOssConfig from the file's metadata (gguf_to_hf's `_gguf_metadata`)."""
    from transformers import GptOssConfig

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{ARCH}.{name}")
        return default if value is None else value

    layers, shapes = int(key("block_count")), meta["shapes"]
    pattern = key("attention.sliding_window_pattern")
    sliding = [bool(s) for s in pattern] if isinstance(pattern, list) else [i % 2 == 0 for i in range(layers)]
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(key("rope.freq_base", 10000.0))}
    if key("rope.scaling.type") == "yarn":  # gpt-oss's YaRN, not truncated (its config's `truncate`)
        rope.update(rope_type="yarn", factor=float(key("rope.scaling.factor")), truncate=False,
                    original_max_position_embeddings=int(key("rope.scaling.original_context_length")),
                    beta_fast=float(key("rope.scaling.yarn_beta_fast", 32.0)),
                    beta_slow=float(key("rope.scaling.yarn_beta_slow", 1.0)))  # fmt: skip
    elif key("rope.scaling.type") not in (None, "none"):
        raise BundleError(f"a gpt-oss file with RoPE scaling {key('rope.scaling.type')!r} (read: yarn)")
    return GptOssConfig(
        vocab_size=shapes["token_embd.weight"][0], hidden_size=int(key("embedding_length")), num_hidden_layers=layers,
        num_attention_heads=int(key("attention.head_count")), num_key_value_heads=int(key("attention.head_count_kv")),
        head_dim=int(key("attention.key_length")), intermediate_size=int(key("expert_feed_forward_length")),
        num_local_experts=int(key("expert_count")), num_experts_per_tok=int(key("expert_used_count")),
        sliding_window=int(key("attention.sliding_window")), max_position_embeddings=int(key("context_length")),
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        rms_norm_eps=float(f"{float(key('attention.layer_norm_rms_epsilon')):.7g}"),  # stored as a float32
        rope_parameters=rope, swiglu_limit=SWIGLU_LIMIT, attention_bias=True,
        tie_word_embeddings="output.weight" not in shapes, architectures=["GptOssForCausalLM"],
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"), eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )  # fmt: skip


def state(gguf: Path, model_config: Any) -> dict[str, Any]:
    """Every weight of the model in transformers' names, dequantized to float32; a tensor the model
    needs and the file lacks is refused, naming it."""
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize

    found = {}
    for t in GGUFReader(str(gguf)).tensors:
        shape = [int(d) for d in reversed(t.shape)]  # GGUF lists a tensor's dimensions innermost first
        found[t.name] = torch.from_numpy(dequantize(t.data, t.tensor_type).astype("float32").reshape(shape))

    def take(name: str) -> Any:
        if name not in found:
            raise BundleError(f"{gguf}: the file has no tensor {name} (a tensor layout this build does not read)")
        return found[name]

    out = {hf: take(name) for name, hf in MODEL_TENSORS.items() if name != "output.weight" or name in found}
    for i in range(model_config.num_hidden_layers):
        blk, layer = f"blk.{i}.", f"model.layers.{i}."
        out |= {layer + hf: take(blk + name) for name, hf in LAYER_TENSORS.items()}
        # [experts, width, hidden] gate and up -> [experts, hidden, 2 x width], their columns alternating.
        gate, up = take(blk + "ffn_gate_exps.weight"), take(blk + "ffn_up_exps.weight")
        out[layer + "mlp.experts.gate_up_proj"] = torch.stack((gate, up), dim=2).flatten(1, 2).transpose(1, 2)
        out[layer + "mlp.experts.gate_up_proj_bias"] = torch.stack(
            (take(blk + "ffn_gate_exps.bias"), take(blk + "ffn_up_exps.bias")), dim=2).flatten(1, 2)
        out[layer + "mlp.experts.down_proj"] = take(blk + "ffn_down_exps.weight").transpose(1, 2)
    return {k: v.contiguous() for k, v in out.items()}
