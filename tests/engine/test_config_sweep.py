"""Config options the published checkpoints leave unset, tried on tiny models of the families the
build checks (`make config-sweep`, 22 minutes on 2 cores; not part of `make test`).

Each variant is a fixture of tiny.py with some options changed, its biases and norm weights made
random (transformers initializes them to zeros and ones, under which a dropped one does not show),
built to fp32 firmware and compared with transformers over the architecture matrix's conversation:
the prefill's logits and one decoding step's within 1e-4. A variant the build cannot export as
transformers runs it must be refused before the export, naming the option.

What it found, each mended or refused since: a Gemma 3 config naming an attention cap (its
attention never reads one; the builder applied it: 0.24 off), a gpt-oss whose layers do not
alternate (the builder's class slid every even layer: 3 off), a Nemotron-H with MLP biases (the
builder's class dropped them: 5.2 off), a Granite MoE whose shared MLP has width 0 (the export
failed: transformers leaves the layer's shared MLP None), and a Phi with query and key norms or an
LFM2 with a convolution bias (both dropped by the builder: 0.88 and 6.2 off, now refused).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_architectures import CONVERSATION, _hf_logits

import firmware
from appliance.engine import ModelSession
from appliance.engine.chat import ChatTemplate
from appliance.engine.tokenizer import TextTokenizer
from firmware.toolchain import tiny

# Options changed on a fixture: (the fixture, the options, what the refusal says, or None: it builds).
Variant = tuple[str, dict[str, Any], str | None]
VARIANTS: dict[str, Variant] = {
    "llama_biases": ("llama", {"attention_bias": True, "mlp_bias": True}, None),
    "llama_tied": ("llama", {"tie_word_embeddings": True}, None),
    "llama_head_dim": ("llama", {"head_dim": 32}, None),
    "llama_mha": ("llama", {"num_key_value_heads": 4}, None),
    "llama_mqa": ("llama", {"num_key_value_heads": 1}, None),
    "llama_gelu": ("llama", {"hidden_act": "gelu_pytorch_tanh"}, None),
    "llama_dynamic_rope": ("llama", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0,
                                                         "factor": 2.0}}, None),
    "qwen2_tied": ("qwen2", {"tie_word_embeddings": True}, None),
    "qwen2_window": ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}, None),
    "qwen3_tied_mqa": ("qwen3", {"tie_word_embeddings": True, "num_key_value_heads": 1}, None),
    "qwen3_attention_bias": ("qwen3", {"attention_bias": True}, None),
    "qwen3_window": ("qwen3", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}, None),
    "qwen3_moe_unscaled": ("qwen3_moe", {"norm_topk_prob": False}, None),
    "qwen3_moe_sparse_step": ("qwen3_moe", {"decoder_sparse_step": 2, "num_hidden_layers": 3}, None),
    "mistral_head_dim": ("mistral", {"head_dim": 32, "sliding_window": None}, None),
    "mistral_tied": ("mistral", {"tie_word_embeddings": True}, None),
    "mixtral_window": ("mixtral", {"sliding_window": 16}, None),
    "olmoe_scaled": ("olmoe", {"norm_topk_prob": True}, None),
    "phi3_tied": ("phi3", {"tie_word_embeddings": True}, None),
    "phi3_window": ("phi3", {"sliding_window": 16}, None),
    # Phi-4-mini's shape: heads of 128, three quarters rotated, LongRoPE past an original context of 64.
    "phi4_mini_shape": ("phi3_longrope", {
        "hidden_size": 256, "intermediate_size": 512, "original_max_position_embeddings": 64, "rope_parameters": {
            "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "original_max_position_embeddings": 64, "short_factor": [1.0 + 0.02 * i for i in range(48)],
            "long_factor": [1.0 + 0.3 * i for i in range(48)]}}, None),
    "phi_qk_norms": ("phi", {"qk_layernorm": True}, r"qk_layernorm \(.*\) is not exported for Phi"),
    "gemma2_uncapped": ("gemma2", {"final_logit_softcapping": None, "attn_logit_softcapping": None}, None),
    "gemma2_query_scale": ("gemma2", {"query_pre_attn_scalar": 8}, None),
    "gemma3_caps": ("gemma3", {"final_logit_softcapping": 3.0, "attn_logit_softcapping": 5.0}, None),
    "gemma3_query_scale": ("gemma3", {"query_pre_attn_scalar": 8}, None),
    "gemma3_three_layers": ("gemma3", {"num_hidden_layers": 3,
                                       "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]},
                            None),
    "gemma3_attention_bias": ("gemma3", {"attention_bias": True}, None),
    "granite_tied": ("granite", {"tie_word_embeddings": True, "num_key_value_heads": 1}, None),
    "granite_biases": ("granite", {"attention_bias": True, "mlp_bias": True}, None),
    "granitemoe_untied_biases": ("granitemoe", {"tie_word_embeddings": False, "attention_bias": True}, None),
    "granitemoe_top1": ("granitemoeshared", {"num_experts_per_tok": 1, "num_key_value_heads": 4}, None),
    "gpt_oss_limit": ("gpt_oss", {"swiglu_limit": 7.0, "num_key_value_heads": 1}, None),
    "hunyuan_biases": ("hunyuan", {"num_key_value_heads": 1, "attention_bias": True}, None),
    "exaone4_global": ("exaone4", {"layer_types": ["full_attention", "full_attention"], "sliding_window": None},
                       None),
    "smollm3_window": ("smollm3", {"use_sliding_window": True, "sliding_window": 16, "no_rope_layers": [1, 1, 1, 1]},
                       None),
    "olmo2_mqa": ("olmo2", {"num_key_value_heads": 1}, None),
    "glm4_mqa": ("glm4", {"num_key_value_heads": 1}, None),
    "stablelm_mqa": ("stablelm", {"num_key_value_heads": 1, "use_qkv_bias": False}, None),
    "nemotron_full_rotary": ("nemotron", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                              "partial_rotary_factor": 1.0}}, None),
    "nemotron_h_biases": ("nemotron_h", {"mamba_proj_bias": True, "use_conv_bias": False, "attention_bias": True},
                          None),
    # Nemotron 3 Super's experts: on a latent projection of the stream (hidden 64, latent 32).
    "nemotron_h_moe_latent": ("nemotron_h_moe", {"moe_latent_size": 32}, None),
    # GLM-4.5-Air's: no query and key norms; and two shared experts, a second dense layer, the whole of
    # each head rotated.
    "glm4_moe_air": ("glm4_moe", {"use_qk_norm": False, "n_shared_experts": 2, "first_k_dense_replace": 2}, None),
    "glm4_moe_full_rotary": ("glm4_moe", {"partial_rotary_factor": 1.0, "num_experts_per_tok": 3}, None),
    # GLM-4.7-Flash's latent attention with its halves rotated (rope_interleave off), queries projected
    # directly, values wider than the queries; DeepSeek V3's with the low-rank queries, biases, and
    # YaRN as published (its mscale scaling the scores).
    "glm4_moe_lite_variants": ("glm4_moe_lite", {"rope_interleave": False, "q_lora_rank": None, "v_head_dim": 64},
                               None),
    "deepseek_v3_lora_biases": ("deepseek_v3", {"q_lora_rank": 24, "attention_bias": True, "v_head_dim": 16}, None),
    "deepseek_v3_yarn": ("deepseek_v3", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}}, None),
    # DeepSeek-V2-Lite's YaRN (factor 40, mscale 0.707 on both sides), with low-rank queries.
    "deepseek_v2_yarn": ("deepseek_v2", {"q_lora_rank": 24, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}}, None),
    "deepseek_v2_grouped": ("deepseek_v2", {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2},
                            r"best 2 of 4 groups by their best score"),
    # DeepSeek V3's and R1's group-limited choice (8 groups, the best 4: here 4 groups of 2, the best
    # 2), and the same in the families routed as theirs (a group of one expert could not be ranked).
    "deepseek_v3_grouped": ("deepseek_v3", {"n_group": 4, "topk_group": 2}, None),
    "glm4_moe_grouped": ("glm4_moe", {"n_group": 4, "topk_group": 1}, None),
    "glm4_moe_lite_grouped": ("glm4_moe_lite", {"n_group": 2, "topk_group": 1}, None),
    "dots1_grouped": ("dots1", {"n_group": 4, "topk_group": 3}, None),
    "exaone_moe_grouped": ("exaone_moe", {"n_group": 2, "topk_group": 1}, None),
    "solar_open_grouped": ("solar_open", {"n_group": 4, "topk_group": 2}, None),
    "nemotron_h_moe_grouped": ("nemotron_h_moe", {"n_group": 4, "topk_group": 2}, None),
    # Ling 2.0 with biased queries, keys and values (use_qkv_bias: one fused bias, split), among all experts.
    "ling2_qkv_bias": ("ling2", {"attention_bias": True, "n_group": 1, "topk_group": 1}, None),
    # Llama 4 Scout's experts in every layer and its Llama 3 RoPE scaling; Maverick's without query
    # and key norms.
    "llama4_scout": ("llama4", {"interleave_moe_layer_step": 1, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
        "high_freq_factor": 1.0, "original_max_position_embeddings": 64}}, None),
    "llama4_maverick": ("llama4", {"use_qk_norm": False}, None),
    "llama4_eight": ("llama4", {"num_local_experts": 8}, None),
    # ERNIE 4.5's experts every other layer without a shared expert, and biased projections.
    "ernie4_5_moe_sparse": ("ernie4_5_moe", {"moe_num_shared_experts": 0, "use_bias": True, "moe_layer_interval": 2,
                                             "num_hidden_layers": 4}, None),
    # Youtu-LLM's latent attention with queries projected directly, halves rotated, wider values.
    "youtu_direct_queries": ("youtu", {"q_lora_rank": None, "rope_interleave": False, "v_head_dim": 48}, None),
    # Solar Open with biased projections and two shared experts.
    "solar_open_biases": ("solar_open", {"attention_bias": True, "n_shared_experts": 2}, None),
    # dots.llm1 with its later layers sliding (max_window_layers) and two shared experts.
    "dots1_window": ("dots1", {"sliding_window": 16, "max_window_layers": 1, "n_shared_experts": 2}, None),
    # K-EXAONE's layers alternating (its global layers unrotated), two shared experts' width.
    "exaone_moe_alternating": ("exaone_moe", {"layer_types": ["sliding_attention", "full_attention"] * 2,
                                              "num_shared_experts": 2}, None),
    # Hunyuan-A13B's fixed NTK alpha, one expert a token.
    "hunyuan_moe_alpha": ("hunyuan_moe", {"moe_topk": [1, 1], "rope_parameters": {
        "rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0}}, None),
    # MiniMax-M2 wholly rotated, three experts a token.
    "minimax_m2_full_rotary": ("minimax_m2", {"rotary_dim": 32, "num_experts_per_tok": 3, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}, None),
    "cwm_global": ("cwm", {"layer_types": ["full_attention"] * 4}, None),
    # MiniCPM3 with its queries projected directly and no logit scale (dim_model_base the hidden size).
    "minicpm3_direct_queries": ("minicpm3", {"q_lora_rank": None, "dim_model_base": 64, "scale_emb": 1.0}, None),
    # MiniCPM3-4B's LongRoPE inside its original context (the short factors).
    "minicpm3_longrope": ("minicpm3", {"rope_parameters": {
        "rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 2048,
        "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8], "long_factor": [1.0] * 8}}, None),
    # Hy3 with two shared experts' width and experts in every layer.
    "hy_v3_sparse": ("hy_v3", {"num_shared_experts": 2, "mlp_layer_types": ["sparse"] * 3}, None),
    # Mellum with every layer sparse and global at one base.
    "mellum_sparse": ("mellum", {"mlp_layer_types": ["sparse"] * 4, "layer_types": ["full_attention"] * 4,
                                 "num_experts_per_tok": 1}, None),
    # Arcee's Trinity without µP's scale, two shared experts, one global layer in four.
    "afmoe_plain": ("afmoe", {"mup_enabled": False, "num_shared_experts": 2, "global_attn_every_n_layers": 4}, None),
    "lfm2_three_layers": ("lfm2", {"layer_types": ["conv", "full_attention", "conv"], "full_attn_idxs": [1],
                                   "num_hidden_layers": 3}, None),
    "lfm2_tied": ("lfm2", {"tie_word_embeddings": True}, None),
    "lfm2_conv_bias": ("lfm2", {"conv_bias": True}, r"conv_bias \(.*\) is not exported for LFM2"),
    "falcon_h1_biases": ("falcon_h1", {"mamba_proj_bias": True, "mamba_conv_bias": False, "attention_bias": True,
                                       "mlp_bias": True}, None),
    "jamba_biases": ("jamba", {"mamba_proj_bias": True, "mamba_conv_bias": False}, None),
    "granite4_h_rotated": ("granite4_h", {"position_embedding_type": "rope", "attention_bias": True}, None),
    "cohere_attention_bias": ("cohere", {"attention_bias": True}, None),
    "helium_biases": ("helium", {"attention_bias": True, "mlp_bias": True, "num_key_value_heads": 1}, None),
    "internlm3_biases": ("internlm3", {"qkv_bias": True, "bias": True}, None),
    "nanochat_gqa": ("nanochat", {"num_key_value_heads": 2}, None),
    "starcoder2_plain": ("starcoder2", {"use_bias": False, "tie_word_embeddings": False, "sliding_window": None}, None),
    "glm_mqa": ("glm", {"num_key_value_heads": 1, "attention_bias": False}, None),
    "vaultgemma_global": ("vaultgemma", {"layer_types": ["full_attention"] * 4, "attn_logit_softcapping": None},
                          None),
    "granitemoe_swa_one_base": ("granitemoe_swa", {"shared_intermediate_size": 0, "layer_rope_theta": None}, None),
    "granitemoeshared_unshared": ("granitemoeshared", {"shared_intermediate_size": 0}, None),
    # GPT-2's scores unscaled, or scaled by the layer's index too (both a factor on the queries).
    "gpt2_unscaled": ("gpt2", {"scale_attn_weights": False, "n_inner": 96}, None),
    "gpt2_by_layer": ("gpt2", {"scale_attn_by_inverse_layer_idx": True, "activation_function": "gelu"}, None),
    "gpt_bigcode_mha": ("gpt_bigcode", {"multi_query": False, "activation_function": "relu"}, None),
    # OPT's projections between a narrower embedding and the layers (folded), its biases off; its
    # norms after each sublayer (opt-350m's) and no final norm are refused.
    "opt_projected": ("opt", {"word_embed_proj_dim": 32, "enable_bias": False, "tie_word_embeddings": False}, None),
    "opt_post_norm": ("opt", {"do_layer_norm_before": False}, "do_layer_norm_before"),
    "opt_no_final_norm": ("opt", {"_remove_final_layer_norm": True}, "_remove_final_layer_norm"),
    # GPT-NeoX's layers one after the other (no parallel residual), without attention biases; half
    # of each head rotated at another base.
    "gpt_neox_sequential": ("gpt_neox", {"use_parallel_residual": False, "attention_bias": False,
                                         "tie_word_embeddings": True}, None),
    # Heads of 80 with a quarter rotated (Pythia 2.8B's, Dolly 2 3B's): 20 dimensions, which the
    # attention operator does not rotate (builder_shim's padded rotation).
    "gpt_neox_rotated_20": ("gpt_neox", {"hidden_size": 160}, None),
    "gpt_neox_half_rotated": ("gpt_neox", {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                                                               "partial_rotary_factor": 0.5}}, None),
    # GPT-J with the whole of each head rotated, ReLU; CodeGen with a head in each of its 4 devices'
    # parts of the fused projection, its MLP 4 times as wide as the layer (n_inner unset).
    "gptj_whole_head": ("gptj", {"rotary_dim": 64, "activation_function": "relu"}, None),
    "codegen_four_heads": ("codegen", {"num_attention_heads": 4, "rotary_dim": 16, "n_inner": None}, None),
    # Gemma 3n running its layers on another AltUp stream than the first, with three streams, its
    # per-layer inputs not rescaled by the corrected stream's scale.
    "gemma3n_text_other_stream": ("gemma3n_text", {"altup_active_idx": 1, "altup_num_inputs": 3,
                                                   "altup_correct_scale": False}, None),
    # Falcon's layers one after the other, per-head fused projections with biases (as many key-value
    # heads as query heads: transformers runs nothing else without multi-query); its new
    # architecture with one norm before both the attention and the MLP.
    "falcon_sequential": ("falcon", {"parallel_attn": False, "multi_query": False, "bias": True, "num_kv_heads": 4},
                          None),
    "falcon_new_one_norm": ("falcon_new", {"num_ln_in_parallel_attn": 1}, None),
    # BLOOM with 6 heads: ALiBi's slopes for a head count not a power of two (interleaved from the
    # next power's), untied.
    "bloom_six_heads": ("bloom", {"hidden_size": 96, "n_head": 6, "tie_word_embeddings": False}, None),
    # MPT with its scores scaled otherwise, untied; its options that transformers runs otherwise
    # than the model (ALiBi's slopes spread wider: it takes 8 for alibi_bias_max whatever the config
    # says) or cannot run are refused.
    "mpt_scaled": ("mpt", {"attn_config": {"softmax_scale": 0.3}, "tie_word_embeddings": False}, None),
    "mpt_wider_slopes": ("mpt", {"attn_config": {"alibi_bias_max": 16}}, "alibi_bias_max"),
    "mpt_clipped": ("mpt", {"attn_config": {"clip_qkv": 6.0}}, "clip_qkv"),
    "mpt_logit_scale": ("mpt", {"logit_scale": 0.5}, "logit_scale"),
    # MiniCPM5 with biased projections (the query-and-gate one's bias split too), two shared expert
    # widths, experts in every layer; its experts chosen within groups are refused.
    "minicpm5_moe_biased": ("minicpm5_moe", {"attention_bias": True, "n_shared_experts": 2,
                                             "mlp_layer_types": ["sparse", "sparse"]}, None),
    "minicpm5_moe_grouped": ("minicpm5_moe", {"n_group": 2, "topk_group": 1}, None),
    # GLM-4V and GLM-4.5V whose RoPE names no partial_rotary_factor: GLM-4V rotates whole heads (GLM-4's
    # class, half), GLM-4.5V half (as GLM-4.5's).
    "glm4v_whole_heads": ("glm4v", {"text_config": {**tiny.ARCHITECTURES["glm4v"][2]["text_config"],
                                                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                        "mrope_section": [8, 4, 4]}}}, None),
    "glm4v_moe_default_rotation": ("glm4v_moe", {"text_config": {**tiny.ARCHITECTURES["glm4v_moe"][2]["text_config"],
                                                            "rope_parameters": {"rope_type": "default",
                                                                                "rope_theta": 10000.0,
                                                                                "mrope_section": [4, 2, 2]}}}, None),
    # LFM3-VL whose head is its language model's embeddings (the outer config ties them).
    "lfm3_vl_tied": ("lfm3_vl", {"tie_word_embeddings": True}, None),
    "hyperclovax_tied": ("hyperclovax", {"tie_word_embeddings": True, "num_key_value_heads": 1}, None),
}  # fmt: skip
# And every other fixture as it is, but for its random biases and norm weights.
VARIANTS.update({f"{name}_as_is": (name, {}, None) for name in tiny.ARCHITECTURES})
RANDOM = ("bias", "norm.weight", "layernorm.weight", "norm_f.weight")


@pytest.mark.config_sweep
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_config_variant_answers_as_transformers_or_is_refused(name: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    import torch
    import transformers

    from firmware.errors import BundleError
    from firmware.toolchain.build import BuildOptions, build
    from firmware.toolchain.devkit import dev_trusted_keys, ensure_dev_key

    base, options, refused = VARIANTS[name]
    config_class, model_class, extra = tiny.ARCHITECTURES[base]
    monkeypatch.setitem(tiny.ARCHITECTURES, name, (config_class, model_class, {**extra, **options}))
    monkeypatch.setitem(tiny.CHAT_STYLES, name, tiny.chat_style(base))
    monkeypatch.setitem(tiny.RANDOMIZED, name, (*tiny.RANDOMIZED.get(base, ()), *RANDOM))
    if base in tiny.LAYOUTS_AS_PUBLISHED:
        monkeypatch.setitem(tiny.LAYOUTS_AS_PUBLISHED, name, tiny.LAYOUTS_AS_PUBLISHED[base])
    tiny.make_tiny_hf(tmp_path / "hf", arch=name)
    out = tmp_path / "bundle"
    if refused is not None:
        with pytest.raises(BundleError, match=refused):
            build(tmp_path / "hf", out, BuildOptions(precision="fp32"), key=ensure_dev_key(), progress=lambda _: None)
        return
    build(tmp_path / "hf", out, BuildOptions(precision="fp32"), key=ensure_dev_key(), progress=lambda _: None)
    bundle = firmware.load(out, dev_trusted_keys())
    tokenizer = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    ids = ChatTemplate(bundle.chat_template, tokenizer).prompt(CONVERSATION).ids
    reference = getattr(transformers, tiny.reference_class(base))
    ref = _hf_logits(reference.from_pretrained(tiny.reference_dir(name, tmp_path / "hf"), dtype=torch.float32).eval(),
                     ids)
    session = ModelSession(bundle)
    cache = session.new_cache(len(ids))
    prefill = session.forward(cache, np.array(ids[:-1], dtype=np.int64))
    step = session.forward(cache, np.array(ids[-1:], dtype=np.int64))
    assert np.abs(prefill - ref[-2]).max() <= 1e-4, name
    assert np.abs(step - ref[-1]).max() <= 1e-4, name
