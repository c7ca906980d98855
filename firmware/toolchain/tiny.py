"""The tiny fixture: a random-weight Llama (hidden 64, 2 layers, 4 heads, 2 KV heads) with a BPE
tokenizer trained on CPython's own pydoc topics. It exports in seconds, so every test can use a
real ONNX Runtime session on a real (if meaningless) model. The same shape is made for the other
architectures the firmware build supports (ARCHITECTURES), each checked against transformers."""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from firmware.manifest import LayerConstants
from firmware.toolchain.build import BuildOptions, build
from firmware.toolchain.devkit import ensure_bundle
from firmware.toolchain.templates import GEMMA3_CHAT_TEMPLATE, QWEN25_CHAT_TEMPLATE

TINY_NAME = "tiny-llama"
# Architecture -> (transformers config class, model class, what differs from the Llama shape).
# Qwen3 adds per-head query/key norms, and its heads are wider than the hidden size shares out (32
# x 4 for 64, as Qwen3 0.6B has 128 x 16 for 1024); Phi-3 here rotates half of each head (partial rotary, as
# Phi-4-mini does with three quarters);
# Mistral slides a window of 16 positions over every layer; Gemma 3 interleaves a sliding layer
# (window 16, its own RoPE base) with a global one, and adds Gemma's norms and scaled embeddings.
# The windows are far narrower than the test conversation, so every check runs past them.
# Gemma 3's tiny language model, shared by its fixtures: a width whose square root (Gemma's embedding
# scale) is not a round number (8.4853), a sliding layer (window 16, RoPE base 10000) and a global one.
GEMMA3_TINY: dict[str, object] = {"hidden_size": 72, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 16,
                                  "layer_types": ["sliding_attention", "full_attention"]}  # fmt: skip
GEMMA3_LOCAL_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
# Qwen2-MoE's tiny checkpoint: top 2 of 4 experts and a shared expert in each layer.
QWEN2_MOE_TINY: dict[str, Any] = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                  "shared_expert_intermediate_size": 64}
# GLM-4V's and GLM-4.5V's tiny checkpoints share their multimodal RoPE (over half of each head of
# 32) and their vision tower, whose tokens lie past the tokenizer's 512.
GLM4V_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "mrope_section": [4, 2, 2]}
GLM4V_TOWER: dict[str, Any] = {
    "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                      "image_size": 28, "patch_size": 14},
    "image_token_id": 512, "video_token_id": 513, "image_start_token_id": 514, "image_end_token_id": 515,
    "video_start_token_id": 516, "video_end_token_id": 517}
# Llama 4's tiny language model (Scout's layers): every fourth layer without RoPE, experts (one of 4
# a token) every other layer.
LLAMA4_TINY: dict[str, Any] = {"num_hidden_layers": 4, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 1,
                               "intermediate_size": 32, "intermediate_size_mlp": 128, "interleave_moe_layer_step": 2}
# Qwen3.5's tiny checkpoint: a gated delta-net layer and a gated full-attention one, a vision tower.
QWEN35_TINY: dict[str, Any] = {
    "text_config": {"head_dim": 32, "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2,
                    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                    "linear_conv_kernel_dim": 4,
                    # RoPE as the published configs give it: multimodal RoPE's sections (of the 4 rotated
                    # pairs: the published models rotate 32 in sections of 11, 11 and 10), interleaved.
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                        "mrope_section": [2, 1, 1], "mrope_interleaved": True}},
    "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                      "num_position_embeddings": 64},
    "image_token_id": 500, "video_token_id": 501, "vision_start_token_id": 502, "vision_end_token_id": 503}
QWEN3_MOE_TINY: dict[str, Any] = {"head_dim": 32, "moe_intermediate_size": 32, "num_experts": 4,
                                  "num_experts_per_tok": 2, "norm_topk_prob": True}  # fmt: skip
VISION_TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
               "image_size": 32, "patch_size": 8}
PIXTRAL_TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                "image_size": 32, "patch_size": 8, "head_dim": 16}  # fmt: skip
GPT_OSS_TINY: dict[str, object] = {
    "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "swiglu_limit": 7.0, "sliding_window": 16,
    "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 4096, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 128}}  # fmt: skip
# Parts two fixtures share (a family's image-and-text checkpoint and its language model saved
# alone; Granite's dense and expert variants), written once so that the two stay the same model.
MINISTRAL3_TEXT: dict[str, object] = {
    "sliding_window": None, "head_dim": 16, "max_position_embeddings": 2048, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0, "original_max_position_embeddings": 1024,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}}
GEMMA4_UNIFIED_TEXT: dict[str, object] = {
    "num_hidden_layers": 6, "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 1,
    "attention_k_eq_v": True, "sliding_window": 16, "final_logit_softcapping": 30.0, "tie_word_embeddings": True}
GRANITE_MULTIPLIERS: dict[str, object] = {
    "embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.2, "logits_scaling": 2.0}
GRANITE_SWA_LAYERS: dict[str, object] = {
    "num_hidden_layers": 4, "sliding_window": 16, "layer_rope_theta": [0, 10000.0, 10000.0, 500000.0]}

ARCHITECTURES: dict[str, tuple[str, str, dict[str, object]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    # The widths real models' heads have, where the tiny ones are 16-32 wide: 128 (Llama 3.2 3B,
    # Qwen2.5 1.5B and up, Mistral) and 96 (Phi-3 and Phi-3.5 mini). The operator's kernels take
    # other paths at these widths; Ernie 4.5's export answered otherwise only at 128. The Llama's
    # MLP is as wide as its vocabulary (512), which the builder took for the LM head
    # (builder_shim.lm_head_is_the_model_s).
    "llama_wide": ("LlamaConfig", "LlamaForCausalLM", {
        "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 1}),
    "phi3_wide": ("Phi3Config", "Phi3ForCausalLM", {
        "hidden_size": 192, "intermediate_size": 384, "num_attention_heads": 2, "num_key_value_heads": 1}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 16}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {
        # Heads of 32 so the rotated half (16) fills the operator's cos/sin cache rows of 8.
        "num_attention_heads": 2, "num_key_value_heads": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    }),
    # Phi-3.5-mini's LongRoPE: per-dimension factors and a magnitude scale for a context longer
    # than the original one (2048 from 1024 here). The conversation stays inside the original
    # context, where the short factors apply (see builder_shim.longrope_type on crossing it).
    "phi3_longrope": ("Phi3Config", "Phi3ForCausalLM", {
        "num_attention_heads": 2, "num_key_value_heads": 1, "original_max_position_embeddings": 1024,
        "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                            "original_max_position_embeddings": 1024,
                            "short_factor": [1.0 + 0.1 * i for i in range(8)],
                            "long_factor": [2.0 + 0.5 * i for i in range(8)]},
    }),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {**GEMMA3_TINY, "rope_parameters": {
        "sliding_attention": GEMMA3_LOCAL_ROPE, "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}}),
    # Gemma 3 4B, 12B and 27B are published as Gemma3ForConditionalGeneration: a vision tower
    # beside the language model, whose text part the build exports. The tiny shape is the language
    # model's (the Gemma 3 fixture's); its image tokens lie past the tokenizer's 512.
    # Its text config names an attention cap (as Gemma 2's configs do), which Gemma 3's attention never
    # reads: nor must the export (builder_shim.attention_softcap_as_transformers).
    "gemma3_vl": ("Gemma3Config", "Gemma3ForConditionalGeneration", {
        "text_config": {**GEMMA3_TINY, "vocab_size": 515, "attn_logit_softcapping": 5.0},
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
        "mm_tokens_per_image": 4, "boi_token_index": 512, "eoi_token_index": 513, "image_token_index": 514,
    }),
    # Mistral Small 3.1 and 3.2 (Mistral3ForConditionalGeneration: a Pixtral vision tower beside a
    # Mistral), and Ministral 3, whose language model adds YaRN and a query scale by position past
    # its original context (build.exact_positions caps the context there: 1024 here, past every
    # prompt of the matrix).
    "mistral3_vl": ("Mistral3Config", "Mistral3ForConditionalGeneration", {
        "text_config": {"model_type": "mistral", "sliding_window": None, "vocab_size": 513},
        "vision_config": PIXTRAL_TINY, "image_token_index": 512, "spatial_merge_size": 2,
    }),
    "ministral3_vl": ("Mistral3Config", "Mistral3ForConditionalGeneration", {
        "text_config": {"model_type": "ministral3", **MINISTRAL3_TEXT, "vocab_size": 513},
        "vision_config": PIXTRAL_TINY, "image_token_index": 512, "spatial_merge_size": 2,
    }),
    # Ministral 3's language model saved alone (Ministral3ForCausalLM).
    "ministral3": ("Ministral3Config", "Ministral3ForCausalLM", MINISTRAL3_TEXT),
    # Granite scales the embeddings, each residual branch, the attention scores and the logits by
    # constants of its own (none of them the neutral value here, so a dropped one shows).
    "granite": ("GraniteConfig", "GraniteForCausalLM", GRANITE_MULTIPLIERS),
    # OpenBMB's MiniCPM (MiniCPM-2B, MiniCPM4: MiniCPMForCausalLM, as published, LAYOUTS_AS_PUBLISHED): a
    # Llama with µP's scales, Granite's multipliers but the attention's (MiniCPM-2B's: embeddings times
    # 12, residuals times 1.4 / sqrt(layers), the head's input over hidden / dim_model_base, 64 / 16 here),
    # the embeddings its LM head, MiniCPM4's LongRoPE (its short factors inside the original context).
    "minicpm": ("GraniteConfig", "GraniteForCausalLM", {
        "tie_word_embeddings": True, "embedding_multiplier": 12.0, "residual_multiplier": 1.4 / 2**0.5,
        "logits_scaling": 4.0, "attention_multiplier": 0.25, "rope_parameters": {
            "rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 2048,
            "short_factor": [4.0 / (1 + i) for i in range(8)], "long_factor": [8.0 / (1 + i) for i in range(8)]}}),
    # Gemma (the first): Gemma's norms (one plus the weight) and scaled embeddings, GELU, its LM head
    # its embeddings, as published (llama.cpp's converter writes no other).
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16, "tie_word_embeddings": True}),
    # Gemma 2: sliding and global layers, soft-capped attention scores and logits; its LM head is
    # its embeddings, as in Gemma 2's models (llama.cpp writes no other).
    # Gemma 2's caps; its query and key weights random (RANDOMIZED), so its attention's logits reach
    # the cap of 50 as a real model's do, where a tiny one's never would.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {
        "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 16, "tie_word_embeddings": True,
        "layer_types": ["sliding_attention", "full_attention"], "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    }),
    # OLMo normalizes with a LayerNorm of no weights (mean-centred, not RMS; builder_shim.olmo_layer_norm).
    "olmo": ("OlmoConfig", "OlmoForCausalLM", {}),
    # Phi-2: attention and MLP side by side on one LayerNorm (with biases), partial rotary, an LM head
    # with a bias; heads of 32 as for Phi-3. Its norms' epsilon is `layer_norm_eps` (builder_shim.norm_epsilon).
    "phi": ("PhiConfig", "PhiForCausalLM", {
        "num_attention_heads": 2, "num_key_value_heads": 2,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    }),
    # Nemotron: LayerNorm with weights of one plus what is stored, a squared-ReLU MLP without a gate,
    # partial rotary; its epsilon is `norm_eps`.
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", {
        "head_dim": 32, "num_attention_heads": 2, "num_key_value_heads": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    }),
    # HunYuan (dense): query and key norms after the rotation, which its export applies beside the
    # attention from a position_ids input (the engine feeds it).
    "hunyuan": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", {"head_dim": 16}),
    # Tencent's Hunyuan-A13B (HunYuanMoEV1): HunYuan's attention (query and key norms after RoPE), then
    # experts in every layer (the softmax's top k, scaled to sum to 1) beside a shared MLP; how many are
    # chosen given per layer.
    "hunyuan_moe": ("HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM", {"head_dim": 16, "num_experts": 4,
                                                                     "moe_topk": [2, 2], "intermediate_size": 32}),
    # SmolLM3 leaves RoPE out of every fourth layer, as published (builder_shim.smollm3_no_rope_layers;
    # llama.cpp's GGUF files state no pattern: its SmolLM3 takes every fourth).
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {"num_hidden_layers": 4, "no_rope_layers": [1, 1, 1, 0],
                                                       "use_sliding_window": False}),
    # gpt-oss: mixture-of-experts MLPs (top 2 of 4 here) with a clamped SwiGLU (at 7, as published:
    # llama.cpp's GGUF files state no limit), attention sinks, sliding and global layers, and YaRN
    # without truncation, as gpt-oss-20b and -120b set it.
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", GPT_OSS_TINY),
    # One whose layers are all global, where the published models' alternation slides the first: the
    # export follows `layer_types` (builder_shim.gpt_oss_layer_types); its SwiGLU's limit set low
    # enough that random weights reach it.
    "gpt_oss_global": ("GptOssConfig", "GptOssForCausalLM", {**GPT_OSS_TINY, "swiglu_limit": 0.1,
                                                             "layer_types": ["full_attention", "full_attention"]}),
    # RoPE scaling, each as the models that use it set it (builder_shim's rope fixes). Llama 3.1's
    # and 3.2's, with their four query heads to a key head: the original context is 64 here, so the
    # table has dimensions left as they are, blended and scaled down. Linear scaling as the Llama 2
    # long-context fine-tunes had it, a key head per query head. (Each shape also keeps the tiny
    # model's answer long: the lane test needs a stream still decoding when its newcomer arrives.)
    "llama_rope_llama3": ("LlamaConfig", "LlamaForCausalLM", {"num_key_value_heads": 1, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "llama_rope_linear": ("LlamaConfig", "LlamaForCausalLM", {
        "num_key_value_heads": 4, "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}}),
    # YaRN as Qwen2.5 and Qwen3 document it for long contexts: a factor and the original context,
    # the blend's range (beta_fast, beta_slow) left to transformers' defaults.
    "qwen2_yarn": ("Qwen2Config", "Qwen2ForCausalLM", {"max_position_embeddings": 8192, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 2048}}),
    # Gemma 3 4B, 12B and 27B scale their global layers' RoPE linearly (factor 8), not the local ones
    # (a key head per query head here, and HunYuan's alpha 2000 below for its 1000, keep the tiny
    # answers long).
    "gemma3_linear": ("Gemma3TextConfig", "Gemma3ForCausalLM", {**GEMMA3_TINY, "num_key_value_heads": 4,
        "rope_parameters": {"sliding_attention": GEMMA3_LOCAL_ROPE,
                            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}}),
    # Qwen3.5: a hybrid of gated delta-net layers (linear attention, a recurrent state per sequence)
    # and gated full attention with query and key norms and partial rotary; its checkpoints are the
    # multimodal class (the vision tower is left out of the export).
    "qwen3_5": ("Qwen3_5Config", "Qwen3_5ForConditionalGeneration", QWEN35_TINY),
    # Qwen3.5's mixture-of-experts models: the same layers, experts (top 2 of 4) and a shared expert.
    "qwen3_5_moe": ("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration", {**QWEN35_TINY, "text_config": {
        **QWEN35_TINY["text_config"], "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
        "num_experts_per_tok": 2, "num_experts": 4}}),
    # Qwen3-Next (80B-A3B): the layers Qwen3.5's mixture-of-experts models grew from (built as
    # theirs: qwen3_next.py), its linear-attention projections fused per key head.
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", {
        "head_dim": 32, "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4, "partial_rotary_factor": 0.25, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "norm_topk_prob": True}),
    # LFM2 (Liquid's models for devices): short gated convolutions (a state of the last inputs per
    # sequence) between attention layers with query and key norms.
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", {"layer_types": ["conv", "full_attention"], "full_attn_idxs": [1],
                                              "block_multiple_of": 32, "conv_L_cache": 3}),
    # LFM2's mixture-of-experts models: a dense first layer, then experts (top 2 of 4) with biased
    # routing; the LM head is the embedding, as LFM2-8B-A1B's (llama.cpp's lfm2moe has no other).
    "lfm2_moe": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM", {"layer_types": ["conv", "full_attention"],
        "num_dense_layers": 1, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
        "tie_word_embeddings": True}),
    # Granite 4.0-H (the hybrids: H-Micro, H-1B, H-350M): Mamba 2 layers (8 heads of 16, B and C in 2
    # groups of 16 state dimensions, a 4-wide convolution) between attention layers without RoPE.
    "granite4_h": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", {
        "num_hidden_layers": 4, "layer_types": ["mamba", "attention", "mamba", "mamba"], "num_key_value_heads": 1,
        "num_local_experts": 0, "shared_intermediate_size": 128, "position_embedding_type": "nope",
        "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 2, "mamba_d_state": 16, "mamba_d_conv": 4,
        "mamba_expand": 2, "embedding_multiplier": 12.0, "logits_scaling": 4.0, "residual_multiplier": 0.22,
        "attention_multiplier": 0.25}),
    # Granite 4.0-H Tiny's and Small's shape: experts (top 2 of 4, SwiGLU) beside each layer's shared MLP.
    "granite4_moe": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", {
        "num_hidden_layers": 3, "layer_types": ["mamba", "attention", "mamba"], "num_key_value_heads": 1,
        "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32, "shared_intermediate_size": 64,
        "position_embedding_type": "nope", "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 1,
        "mamba_d_state": 16, "embedding_multiplier": 12.0, "logits_scaling": 4.0, "residual_multiplier": 0.22,
        "attention_multiplier": 0.25}),
    # NVIDIA's Nemotron-H (Nemotron Nano 2 9B, Nemotron-H 4B and 8B): blocks of one mixer each, Mamba 2
    # (8 heads of 16, 2 groups), attention without RoPE, or a ReLU-squared MLP.
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM", {
        "layers_block_type": ["linear_attention", "mlp", "full_attention", "mlp", "linear_attention", "mlp"],
        "num_hidden_layers": 6, "head_dim": 16, "mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 2,
        "ssm_state_size": 16, "conv_kernel": 4, "mlp_bias": True}),  # (biases the published models lack: kept)
    # Nemotron 3 Nano's blocks: Mamba 2 and attention between experts' blocks (here 8 experts, 2 chosen by
    # sigmoid scores plus a correction bias, scaled by 2.5 as published, and a shared expert).
    "nemotron_h_moe": ("NemotronHConfig", "NemotronHForCausalLM", {
        "layers_block_type": ["linear_attention", "moe", "full_attention", "moe", "linear_attention", "moe"],
        "num_hidden_layers": 6, "head_dim": 16, "mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 2,
        "ssm_state_size": 16, "conv_kernel": 4, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "moe_shared_expert_intermediate_size": 48, "routed_scaling_factor": 2.5}),
    # TII's Falcon-H1: attention and a Mamba 2 mixer side by side in every layer (8 heads of 16, B and C
    # in 2 groups, a gate then a norm per group: as Falcon-H1-Tiny's), µP multipliers everywhere, and
    # attention heads wider than the hidden size over the heads, as the published configs' head_dim.
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM", {"head_dim": 32,
        "mamba_d_ssm": 128, "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 2, "mamba_d_state": 16,
        "mamba_rms_norm": True, "mamba_norm_before_gate": False, "embedding_multiplier": 5.0,
        "lm_head_multiplier": 0.5, "mlp_multipliers": [0.8, 1.3], "key_multiplier": 0.7,
        "attention_in_multiplier": 1.2, "attention_out_multiplier": 0.9, "ssm_multipliers": [0.5, 1.5, 0.8, 1.2, 2.0],
        "ssm_in_multiplier": 1.1, "ssm_out_multiplier": 0.6}),
    # AI21's Jamba (Jamba Reasoning 3B, Jamba Mini): Mamba (1) layers (B, C and the time step RMS-normed)
    # and attention without RoPE; every other layer's MLP experts (top 2 of 4).
    "jamba": ("JambaConfig", "JambaForCausalLM", {
        "num_hidden_layers": 4, "attn_layer_period": 2, "attn_layer_offset": 1, "num_experts": 4,
        "num_experts_per_tok": 2, "expert_layer_period": 2, "expert_layer_offset": 0, "mamba_d_state": 8,
        "mamba_dt_rank": 8, "mamba_expand": 2}),
    # Granite 4.0's dense models (Micro, 1B, 350M): the hybrid class with attention layers only, and
    # RoPE; no experts, nor any chosen (as published: llama.cpp's converter writes a file of experts
    # otherwise).
    "granite4": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", {
        "layer_types": ["attention", "attention"], "num_key_value_heads": 1, "num_local_experts": 0,
        "num_experts_per_tok": 0,
        "shared_intermediate_size": 128, "position_embedding_type": "rope", "embedding_multiplier": 12.0,
        "logits_scaling": 4.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0078125}),
    # IBM's Granite 3.x mixture-of-experts models (granite-3.1-1b-a400m, 3b-a800m): Granite's multipliers
    # and attention with RoPE; each layer's MLP SwiGLU experts (top 2 of 4), no shared one.
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", {
        "num_key_value_heads": 1, "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32,
        "embedding_multiplier": 12.0, "logits_scaling": 4.0, "residual_multiplier": 0.22, "attention_multiplier": 0.1}),
    # And with a shared SwiGLU MLP beside the experts (GraniteMoeShared).
    "granitemoeshared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM", {
        "num_key_value_heads": 1, "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32,
        "shared_intermediate_size": 48, "embedding_multiplier": 12.0, "logits_scaling": 4.0,
        "residual_multiplier": 0.22, "attention_multiplier": 0.1}),
    # And Granite SWA's (granite-swash-3b-a600m): its attention (a sink per head, three sliding layers
    # in four, RoPE at each layer's own base, none where it is 0) with the shared MLP and experts.
    "granitemoe_swa": ("GraniteMoeSWAConfig", "GraniteMoeSWAForCausalLM", {
        **GRANITE_SWA_LAYERS, "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32,
        "shared_intermediate_size": 48, **GRANITE_MULTIPLIERS}),
    # Image-and-text checkpoints of a family the build exports, their language model exported alone
    # (builder_shim.language_model_alone): LLaVA's (1.5, NeXT and OneVision keep it alike), SmolVLM's
    # and Idefics3's (a Llama as `text_model`), Qwen2-VL's (multimodal RoPE) and InternVL's (a Qwen2,
    # its head tied to the embeddings). Their image tokens lie past the tokenizer's 512.
    "llava": ("LlavaConfig", "LlavaForConditionalGeneration", {
        "text_config": {"model_type": "llama", "vocab_size": 513}, "image_token_index": 512,
        "vision_config": {"model_type": "clip_vision_model", **VISION_TINY, "projection_dim": 32}}),
    "smolvlm": ("SmolVLMConfig", "SmolVLMForConditionalGeneration", {
        "text_config": {"model_type": "llama", "vocab_size": 513}, "image_token_id": 512, "scale_factor": 2,
        "vision_config": VISION_TINY}),
    "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", {
        "text_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
        "vision_config": {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2},
        "image_token_id": 500, "video_token_id": 501, "vision_start_token_id": 502, "vision_end_token_id": 503}),
    "internvl": ("InternVLConfig", "InternVLForConditionalGeneration", {
        "text_config": {"model_type": "qwen2", "vocab_size": 513}, "image_token_id": 512,
        "tie_word_embeddings": True, "vision_config": {**VISION_TINY, "image_size": [32, 32], "patch_size": [8, 8]}}),
    # Qwen2.5-VL's and Qwen3-VL's image-and-text checkpoints (the vision tower left out of the export):
    # multimodal RoPE over three position planes (Qwen3-VL's interleaved, with query and key norms).
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", {
        "text_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
        "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                          "fullatt_block_indexes": [0]},
        "image_token_id": 500, "video_token_id": 501, "vision_start_token_id": 502, "vision_end_token_id": 503}),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration", {
        "text_config": {"head_dim": 32, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                            "mrope_section": [4, 6, 6], "mrope_interleaved": True}},
        "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                          "num_position_embeddings": 64, "deepstack_visual_indexes": [0]},
        "image_token_id": 500, "video_token_id": 501, "vision_start_token_id": 502, "vision_end_token_id": 503}),
    # Qwen3-VL's mixtures of experts (Qwen3-VL-30B-A3B, 235B-A22B): Qwen3's experts under Qwen3-VL's
    # language model, its experts saved as published, fused and each transposed, always scaled to sum
    # to 1 (its config has no norm_topk_prob).
    "qwen3_vl_moe": ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration", {
        "text_config": {"head_dim": 32, "moe_intermediate_size": 24, "num_experts": 4, "num_experts_per_tok": 2,
                        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6],
                                            "mrope_interleaved": True}},
        "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                          "num_position_embeddings": 64, "deepstack_visual_indexes": [0]},
        "image_token_id": 500, "video_token_id": 501, "vision_start_token_id": 502, "vision_end_token_id": 503}),
    # Qwen3's mixture-of-experts models (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): Qwen3's attention, then
    # experts (top 2 of 4, their weights scaled to sum to 1) in every layer, as published; and a
    # config that keeps its first layer dense (mlp_only_layers), which no GGUF can state.
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", QWEN3_MOE_TINY),
    "qwen3_moe_dense": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {**QWEN3_MOE_TINY, "mlp_only_layers": [0]}),
    # LFM2-VL (Liquid's image-and-text models for devices): a SigLIP2 tower and a projector beside an
    # LFM2, whose text part the build exports; its image token lies past the tokenizer's 512.
    "lfm2_vl": ("Lfm2VlConfig", "Lfm2VlForConditionalGeneration", {
        "text_config": {"model_type": "lfm2", "layer_types": ["conv", "full_attention"], "full_attn_idxs": [1],
                        "block_multiple_of": 32, "conv_L_cache": 3, "vocab_size": 513},
        "vision_config": {"model_type": "siglip2_vision_model", "hidden_size": 32, "intermediate_size": 64,
                          "num_hidden_layers": 1, "num_attention_heads": 2, "num_patches": 16, "patch_size": 8},
        "image_token_id": 512, "projector_hidden_size": 64, "tie_word_embeddings": False}),
    # OLMo 2: its norms after the attention and the MLP instead of before, and the queries' and keys'
    # norms over the whole projection.
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    # OLMo 3: OLMo 2's layers, three sliding ones (here one, window 16) to a global one, whose RoPE
    # alone is scaled (YaRN, as published).
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", {"sliding_window": 16, "max_position_embeddings": 2048,
              "layer_types": ["sliding_attention", "full_attention"], "rope_parameters": {
                  "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0,
                                     "original_max_position_embeddings": 256, "attention_factor": 1.2079,
                                     "beta_fast": 32.0, "beta_slow": 1.0},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}}}),
    # EXAONE 3.0 and 3.5 (and EXAONE Deep): a Llama under other names (transformers renames its
    # checkpoint's), Llama 3's RoPE scaling and a tied head as EXAONE 3.5 2.4B's.
    "exaone": ("ExaoneConfig", "LlamaForCausalLM", {"num_key_value_heads": 2, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 1000000.0, "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    # EXAONE 4: OLMo 2's post-norm layers with per-head query and key norms; the 32B's hybrid of
    # three sliding layers (window 4096; here one, window 16) to a global one without RoPE, and
    # Llama 3's RoPE scaling, as published; the 1.2B's global layers only, all rotated.
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", {"head_dim": 32, "sliding_window": 16,
                "layer_types": ["sliding_attention", "full_attention"], "rope_parameters": {
                    "rope_type": "llama3", "rope_theta": 1000000.0, "factor": 16.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "exaone4_global": ("Exaone4Config", "Exaone4ForCausalLM", {"sliding_window": None, "sliding_window_pattern": None,
                       "layer_types": ["full_attention", "full_attention"]}),
    # GLM-4 (the 0414 models): a norm before and after the attention and the MLP, biased query, key
    # and value projections, and half of each head rotated by pairs of neighbouring dimensions.
    "glm4": ("Glm4Config", "Glm4ForCausalLM", {"head_dim": 32}),
    # GLM-4 9B (glm-4-9b-chat-hf) and GLM-Edge: GLM-4-0414's layers without its post norms. Heads as
    # wide as the hidden size shares out, as the published ones' (llama.cpp's converter takes that
    # width for theirs), a hidden size of 256 (the converter writes it as the context of a config
    # without ChatGLM's seq_length, as the published ones, and the GGUF matrix's chat runs to 147) and
    # the norms' epsilon the converter writes whatever the config's (it reads ChatGLM's key, or 1e-5).
    "glm": ("GlmConfig", "GlmForCausalLM", {"hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2,
                                            "head_dim": 32, "rms_norm_eps": 1e-5}),
    # Gemma 4 (31B's shape; 26B A4B's without its experts): five sliding layers to one global, whose
    # heads are fewer (its keys serve as its values) and twice as wide, rotated over a quarter of
    # their width (proportional RoPE); query, key and value norms, a scale on each layer's output,
    # soft-capped logits, the LM head its embeddings. The engine's slots hold each layer's shape.
    "gemma4": ("Gemma4Config", "Gemma4ForConditionalGeneration", {"tie_word_embeddings": True, "text_config": {
        "num_hidden_layers": 6, "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 1,
        "attention_k_eq_v": True, "sliding_window": 16, "hidden_size_per_layer_input": 0,
        "final_logit_softcapping": 30.0, "tie_word_embeddings": True}}),
    # Gemma 4 E2B's and E4B's shape: each token's embedding for every layer (per-layer inputs, a
    # table of their own beside the main one), the last layers' attention over the keys and values
    # of the last earlier layer of their type (KV sharing), their MLPs twice as wide.
    "gemma4_e": ("Gemma4Config", "Gemma4ForConditionalGeneration", {"tie_word_embeddings": True, "text_config": {
        "num_hidden_layers": 6, "head_dim": 16, "global_head_dim": 32, "sliding_window": 16,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                        "sliding_attention", "full_attention"],
        "hidden_size_per_layer_input": 8, "num_kv_shared_layers": 3, "use_double_wide_mlp": True,
        "final_logit_softcapping": 30.0, "tie_word_embeddings": True}}),
    # Gemma 3n E2B's and E4B's language model (Gemma3nForCausalLM): Gemma 4 E's attention, per-layer
    # inputs and shared keys and values, and AltUp's four residual streams, a LAuReL branch beside
    # each attention, sparse MLP gates in the first layers, MLPs of their own widths; its per-layer
    # table stops short of the vocabulary, as the published one does (its last tokens read row 0).
    "gemma3n_text": ("Gemma3nTextConfig", "Gemma3nForCausalLM", {"vocab_size_per_layer_input": 480,
        "num_hidden_layers": 6, "head_dim": 16, "sliding_window": 16, "intermediate_size": [128, 96, 128, 64, 128, 96],
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                        "sliding_attention", "full_attention"],
        "hidden_size_per_layer_input": 8, "num_kv_shared_layers": 2, "laurel_rank": 8,
        "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0, 0.0, 0.0], "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True}),
    # Gemma 4's language model saved alone (Gemma4ForCausalLM: a fine-tune loaded as a causal LM).
    "gemma4_text": ("Gemma4TextConfig", "Gemma4ForCausalLM", {
        "num_hidden_layers": 6, "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 1,
        "attention_k_eq_v": True, "sliding_window": 16, "hidden_size_per_layer_input": 0,
        "final_logit_softcapping": 30.0, "tie_word_embeddings": True}),
    # Gemma 4 12B (Gemma4UnifiedForConditionalGeneration: images and audio projected straight into
    # the language model, which is Gemma 4's dense one).
    "gemma4_unified": ("Gemma4UnifiedConfig", "Gemma4UnifiedForConditionalGeneration", {
        "tie_word_embeddings": True, "text_config": GEMMA4_UNIFIED_TEXT}),
    # And its language model saved alone (Gemma4UnifiedForCausalLM: a text fine-tune of Gemma 4 12B).
    "gemma4_unified_text": ("Gemma4UnifiedTextConfig", "Gemma4UnifiedForCausalLM", GEMMA4_UNIFIED_TEXT),
    # Arcee's AFM models: a Llama whose MLP is ungated (up, ReLU squared, down), with YaRN as published.
    "arcee": ("ArceeConfig", "ArceeForCausalLM", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 512}}),
    # IBM's Granite SWA: Granite with sliding layers (three in four), a learnable sink per head, and
    # RoPE of each layer's own base, none in some (here the global layer's).
    "granite_swa": ("GraniteSWAConfig", "GraniteSWAForCausalLM", {**GRANITE_SWA_LAYERS, **GRANITE_MULTIPLIERS}),
    # Liquid's LFM3: LFM2's convolutions between attention layers, sliding ones among them, norms
    # after each operator and feed-forward too, a sigmoid gate per head on the attention's output,
    # and RoPE per layer type (proportional over half of each head on the full layers).
    "lfm3": ("Lfm3Config", "Lfm3ForCausalLM", {"num_hidden_layers": 6, "head_dim": 16, "sliding_window": 16}),
    # GLM-4.1V and GLM-4.6V-Flash (Zhipu's 9B image-and-text models): a vision tower beside GLM-4's
    # layers (norms after each sublayer too, biased queries, keys and values), multimodal RoPE over
    # neighbouring pairs of half of each head; its image tokens lie past the tokenizer's 512.
    "glm4v": ("Glm4vConfig", "Glm4vForConditionalGeneration", {
        "text_config": {"vocab_size": 518, "num_attention_heads": 2, "num_key_value_heads": 1,  # (heads of 32)
                        "rope_parameters": GLM4V_ROPE},
        **GLM4V_TOWER}),
    # GLM-4.5V and GLM-4.6V (Zhipu's 106B image-and-text mixtures of experts): GLM-4.5's layers (a
    # dense first, then sigmoid-routed experts beside a shared one) under a vision tower, multimodal
    # RoPE over the halves of half of each head.
    "glm4v_moe": ("Glm4vMoeConfig", "Glm4vMoeForConditionalGeneration", {
        "text_config": {"vocab_size": 518, "head_dim": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
                        "moe_intermediate_size": 32, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5,
                        "rope_parameters": GLM4V_ROPE},
        **GLM4V_TOWER}),
    # LG's EXAONE 4.5 (33B): Qwen2.5-VL's vision tower beside an EXAONE 4, its image tokens past the
    # tokenizer's 512.
    "exaone4_5": ("Exaone4_5_Config", "Exaone4_5_ForConditionalGeneration", {
        "text_config": {"model_type": "exaone4", "vocab_size": 514, "head_dim": 32, "sliding_window": 16,
                        "layer_types": ["sliding_attention", "full_attention"]},
        "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                          "fullatt_block_indexes": [0]},
        "image_token_id": 512, "video_token_id": 513}),
    # LFM3-VL (Liquid's image-and-text models for devices): a vision tower and a projector beside an
    # LFM3, whose text part the build exports; its image tokens lie past the tokenizer's 512.
    "lfm3_vl": ("Lfm3VlConfig", "Lfm3VlForConditionalGeneration", {
        "text_config": {"model_type": "lfm3", "num_hidden_layers": 6, "head_dim": 16, "sliding_window": 16,
                        "vocab_size": 516},
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                          "num_key_value_heads": 1, "patch_size": 8},
        "image_token_id": 512, "video_token_id": 513, "vision_start_token_id": 514, "vision_end_token_id": 515,
        "projector_hidden_size": 64, "tie_word_embeddings": False}),
    # ByteDance's Seed-OSS: a Llama whose query, key and value projections (and here its output
    # projection and MLP too) have biases; it thinks between <seed:think> tags.
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", {"head_dim": 16, "attention_out_bias": True,
                                                           "mlp_bias": True}),
    # Stability's StableLM 2: LayerNorms (mean-centred, with biases), a quarter of each head rotated,
    # biased query, key and value projections (as StableLM 2 1.6B). Heads of 64: the rotated part
    # fills the operator's cos/sin rows.
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {"hidden_size": 128, "num_attention_heads": 2,
                                                             "num_key_value_heads": 2, "use_qkv_bias": True}),
    # StableLM 3B 4E1T's heads (and StableLM Zephyr 3B's): 80 wide, 20 of them rotated, which the
    # attention operator does not rotate (not a multiple of 16): rotated as whole heads instead.
    "stablelm_3b": ("StableLmConfig", "StableLmForCausalLM", {"hidden_size": 160, "num_attention_heads": 2,
                                                                "num_key_value_heads": 2}),
    # Baidu's ERNIE 4.5 (its 0.3B's form): a Llama rotated by pairs of neighbouring dimensions, heads of
    # 128 (here 4 of them: a query projection as wide as the vocabulary, once taken for the LM head),
    # biases where a config has use_bias.
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", {"head_dim": 128, "use_bias": True}),
    # Mistral's Ministral 8B (2410): a Mistral whose layers slide but for every fourth.
    "ministral": ("MinistralConfig", "MinistralForCausalLM", {
        "num_hidden_layers": 4, "sliding_window": 16, "head_dim": 16,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]}),
    # G42's Jais 2: a Llama with LayerNorms (biases), biased projections and an ungated ReLU-squared MLP.
    "jais2": ("Jais2Config", "Jais2ForCausalLM", {"head_dim": 16}),
    # Swiss AI's Apertus: a Llama with per-head query and key norms, its norms renamed, an ungated MLP
    # whose activation (xIELU) has learnt parameters per layer, Llama 3's RoPE scaling.
    "apertus": ("ApertusConfig", "ApertusForCausalLM", {"head_dim": 16}),
    # Kyutai's Helium (Helium 1 2B): a Llama whose RoPE turns neighbouring pairs.
    "helium": ("HeliumConfig", "HeliumForCausalLM", {"head_dim": 16, "rms_norm_eps": 1e-8}),
    # Shanghai AI Lab's InternLM3: a Llama, which transformers runs it as (PUBLISHED_AS: its own
    # class's name), with dynamic NTK RoPE (plain RoPE inside max_position_embeddings, where the
    # build caps the context: build.exact_positions).
    "internlm3": ("InternLM3Config", "LlamaForCausalLM", {"head_dim": 16, "rope_parameters": {
        "rope_type": "dynamic", "factor": 6.0, "rope_theta": 50000000.0}}),
    # Meta's Code World Model (CWM): a Llama whose layers slide but every fourth, Llama 3's RoPE.
    "cwm": ("CwmConfig", "CwmForCausalLM", {"num_hidden_layers": 4, "head_dim": 16, "sliding_window": 16,
                                            "rope_parameters": {"rope_type": "llama3", "rope_theta": 1000000.0,
                                                                "factor": 16.0, "low_freq_factor": 1.0,
                                                                "high_freq_factor": 4.0,
                                                                "original_max_position_embeddings": 64}}),
    # IQuest-Coder-V1: a Llama, which transformers runs it as (PUBLISHED_AS), under its own names.
    "iquestcoder": ("IQuestCoderConfig", "LlamaForCausalLM", {"head_dim": 16}),
    # Karpathy's nanochat: norms without weights (one more before the first layer), per-head query
    # and key norms after RoPE, which turns each head's halves the other way, an ungated ReLU-squared
    # MLP (fc1, fc2) and capped logits.
    "nanochat": ("NanoChatConfig", "NanoChatForCausalLM", {}),
    # BigCode's StarCoder2: a Mistral with LayerNorms (biases), biased projections and an ungated GELU
    # MLP (c_fc, c_proj), every layer sliding, the embeddings tied to the LM head (a large epsilon, so
    # that the norms show it: `norm_epsilon`, which builder_shim.norm_epsilon reads).
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {"sliding_window": 16, "tie_word_embeddings": True,
                                                                 "norm_epsilon": 0.05}),
    # OpenAI's GPT-2 (and DistilGPT2, DialoGPT, ...): LayerNorms, biases everywhere, a learned row per
    # position added to each token's embedding (no RoPE), GELU (tanh), the embeddings tied to the LM
    # head; its projections are Conv1D (input-major) and its queries, keys and values one projection.
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {"tie_word_embeddings": True, "n_ctx": 2048}),
    # BigCode's GPT-BigCode (SantaCoder, StarCoder 1, WizardCoder): GPT-2's layers with one key and
    # value head for all query heads (multi-query), Linear projections.
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", {"n_inner": 96, "tie_word_embeddings": True}),
    # Meta's OPT (125M, 1.3B, ... and Galactica): learned positions (their table two rows in), ReLU,
    # separate biased projections.
    "opt": ("OPTConfig", "OPTForCausalLM", {"ffn_dim": 96, "word_embed_proj_dim": 64, "tie_word_embeddings": True}),
    # EleutherAI's GPT-NeoX (Pythia, and Dolly 2, RedPajama-INCITE): LayerNorms, biases, a quarter
    # of each head rotated (heads of 64, as Pythia's: the attention operator rotates widths of 16s),
    # queries, keys and values one projection laid out per head, and the attention and the MLP side
    # by side, each after its own norm.
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"hidden_size": 128, "num_attention_heads": 2,
                                                          "rope_parameters": {"rope_type": "default",
                                                                              "rope_theta": 10000.0,
                                                                              "partial_rotary_factor": 0.25}}),
    # EleutherAI's GPT-J (6B, GPT4All-J): neighbouring pairs of a quarter of each head rotated, the
    # attention and an ungated MLP side by side after one LayerNorm, biases on the MLP and the LM head.
    "gptj": ("GPTJConfig", "GPTJForCausalLM", {"hidden_size": 128, "num_attention_heads": 2, "rotary_dim": 16,
                                               "n_inner": 256}),
    # Salesforce's CodeGen: GPT-J's layers, its queries, values and keys one projection laid out for
    # 4 devices (here each head spread over two of them), half of each head rotated (as 350M's).
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM", {"hidden_size": 128, "num_attention_heads": 2,
                                                        "rotary_dim": 32, "n_inner": 256}),
    # TII's Falcon 7B: multi-query attention beside the MLP after one LayerNorm, no biases; and
    # Falcon 40B's and 180B's "new decoder architecture": key-value groups, a norm each for the two.
    "falcon": ("FalconConfig", "FalconForCausalLM", {"multi_query": True, "num_kv_heads": 1, "parallel_attn": True,
                                                      "bias": False}),
    "falcon_new": ("FalconConfig", "FalconForCausalLM", {"new_decoder_architecture": True, "num_kv_heads": 2}),
    # BigScience's BLOOM (and BLOOMZ): GPT-2's layers with a norm of the embeddings before the first,
    # ALiBi for positions (a slope per head times the key's position, added to each score).
    "bloom": ("BloomConfig", "BloomForCausalLM", {"n_head": 4, "tie_word_embeddings": True}),
    # MosaicML's MPT (7B, 30B): LayerNorms without biases, no biases at all, ALiBi (here for 6 heads,
    # not a power of two: slopes taken from the next power's), an ungated GELU MLP.
    "mpt": ("MptConfig", "MptForCausalLM", {"hidden_size": 96, "num_attention_heads": 6, "tie_word_embeddings": True}),
    # Naver's HyperCLOVA X (SEED Think): Granite's multipliers (the logits' a factor, not a divisor)
    # and a norm after each sublayer, before its scaled output joins the residual stream; and without them.
    "hyperclovax": ("HyperCLOVAXConfig", "HyperCLOVAXForCausalLM", {
        "embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.2, "logits_scaling": 2.0}),
    "hyperclovax_plain": ("HyperCLOVAXConfig", "HyperCLOVAXForCausalLM", {
        "use_post_norm": False, "attention_bias": True, "embedding_multiplier": 3.0, "residual_multiplier": 0.5,
        "attention_multiplier": 0.2, "logits_scaling": 2.0}),
    # Google's VaultGemma: Gemma 2's layers without the norms after the attention and the MLP.
    "vaultgemma": ("VaultGemmaConfig", "VaultGemmaForCausalLM", {
        "num_hidden_layers": 4, "sliding_window": 16, "head_dim": 16, "query_pre_attn_scalar": 24,
        "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0, "tie_word_embeddings": True}),
    # Cohere's Aya Expanse and Command R: attention and the MLP side by side after one LayerNorm (no
    # bias), neighbouring pairs rotated, logits scaled.
    "cohere": ("CohereConfig", "CohereForCausalLM", {"logit_scale": 0.5, "tie_word_embeddings": True}),
    # Command R7B's: three sliding layers in four, the fourth global without RoPE.
    # (Its published config has rotary_pct, which llama.cpp's converter reads.)
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", {"num_hidden_layers": 4, "sliding_window": 16,
                                                         "logit_scale": 0.5, "tie_word_embeddings": True,
                                                         "rotary_pct": 1.0}),
    # Mixtral's: Mistral's layers with experts in place of the MLP (top 2 of 4, their weights scaled to sum to 1).
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # OLMoE's (OLMoE-1B-7B): a Llama's layers with OLMo 2's query and key norms over the whole
    # projection, and experts in place of the MLP (the softmax's top 2 of 4 as they are).
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2}),
    # Qwen2-MoE's (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention, experts (the softmax's top 2
    # of 4 as they are) beside a shared expert gated by a sigmoid, in every layer as published; and a
    # config whose first layer is kept dense (mlp_only_layers, which a GGUF file cannot state).
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", QWEN2_MOE_TINY),
    "qwen2_moe_dense": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {**QWEN2_MOE_TINY, "mlp_only_layers": [0],
                                                                  "num_hidden_layers": 3}),
    # GLM-4.5's, 4.6's and 4.7's: GLM's biased query, key and value projections, per-head query and key
    # norms, half of each head rotated (by halves, not GLM-4's neighbouring pairs), a dense first layer,
    # then experts (2 of 8) chosen by sigmoid scores plus a correction bias, mixed by those scores
    # scaled to sum to 1 and by 2.5, beside a shared expert. (Config as published: transformers 4's keys.)
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", {
        "num_hidden_layers": 3, "head_dim": 32, "attention_bias": True, "use_qk_norm": True,
        "first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "routed_scaling_factor": 2.5}),
    # inclusionAI's Ling 2.0 (Ling-mini-2.0: BailingMoeV2ForCausalLM, as published, LAYOUTS_AS_PUBLISHED):
    # GLM-4.5's layers, the same per-head norms and half rotation, its experts chosen within the best 2
    # of 4 groups (Ling-mini-2.0's: 4 of 8), beside a shared expert, under its own names.
    "ling2": ("Glm4MoeConfig", "Glm4MoeForCausalLM", {
        "num_hidden_layers": 3, "head_dim": 32, "use_qk_norm": True, "first_k_dense_replace": 1,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "routed_scaling_factor": 2.5,
        "n_group": 4, "topk_group": 2, "rope_parameters": {"rope_type": "default", "rope_theta": 600000.0,
                                                           "partial_rotary_factor": 0.5}}),
    # Upstage's Solar Open (100B): GLM-4.5's experts (sigmoid scores plus a correction bias, beside a
    # shared expert) in every layer, under a Llama's attention, its heads wholly rotated (as its config
    # says: llama.cpp's converter takes GLM-4.5's half where it does not).
    "solar_open": ("SolarOpenConfig", "SolarOpenForCausalLM", {
        "num_hidden_layers": 2, "head_dim": 16, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "routed_scaling_factor": 2.5, "rope_parameters": {
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}),
    # rednote's dots.llm1: Qwen3's attention (per-head query and key norms), a dense first layer, then
    # DeepSeek V3's experts (sigmoid scores plus a correction bias, beside a shared expert).
    "dots1": ("Dots1Config", "Dots1ForCausalLM", {
        "num_hidden_layers": 3, "head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1, "norm_topk_prob": True,
        "routed_scaling_factor": 2.5}),
    # LG's K-EXAONE (ExaoneMoe): EXAONE 4's attention (per-head query and key norms, three sliding layers
    # to a global one without RoPE) in a Llama's pre-norm layers, a dense first layer, then DeepSeek
    # V3's experts beside a shared expert.
    "exaone_moe": ("ExaoneMoeConfig", "ExaoneMoeForCausalLM", {
        "num_hidden_layers": 4, "head_dim": 16, "sliding_window": 16, "sliding_window_pattern": 4,
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5}),
    # MiniMax-M2: queries and keys normed over their whole projections (OLMo 2's), half of each head
    # rotated, and experts in every layer chosen by sigmoid scores plus a correction bias (the block's),
    # mixed by those scores scaled to sum to 1.
    "minimax_m2": ("MiniMaxM2Config", "MiniMaxM2ForCausalLM", {
        "head_dim": 32, "rotary_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}),
    # Arcee's Trinity (AFMoE): norms before and after the attention and the MLP, per-head query and key
    # norms, the attention's output gated by a sigmoid, RoPE in the sliding layers alone (every fourth
    # global, as Trinity's and as llama.cpp assumes), µP's scaled embeddings, a dense first layer, then
    # experts chosen by sigmoid scores plus a bias (the block's), mixed by those scores scaled to sum to
    # 1 times route_scale, beside a shared expert.
    "afmoe": ("AfmoeConfig", "AfmoeForCausalLM", {
        "num_hidden_layers": 4, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "num_shared_experts": 1, "num_dense_layers": 1, "route_scale": 2.0,
        "sliding_window": 16, "global_attn_every_n_layers": 4, "mup_enabled": True}),
    # Tencent's Hy3 (HYV3): per-head query and key norms, a dense first layer, then experts chosen by
    # sigmoid scores plus the block's bias, mixed by those scores scaled to sum to 1 times
    # router_scaling_factor, beside a shared expert (its init widened: the published 0.006 leaves a
    # tiny model's logits near zero).
    "hy_v3": ("HYV3Config", "HYV3ForCausalLM", {
        "num_hidden_layers": 3, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2, "num_shared_experts": 1,
        "moe_intermediate_size": 32, "router_scaling_factor": 2.5, "initializer_range": 0.03}),
    # OpenBMB's MiniCPM3 (4B): DeepSeek V2's latent attention rotated by halves, in a Llama's layers with
    # µP's scales: the embeddings by scale_emb, each sublayer's output by scale_depth / sqrt(layers),
    # the LM head's input by dim_model_base / hidden_size.
    "minicpm3": ("MiniCPM3Config", "MiniCPM3ForCausalLM", {
        "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 32,
        "num_key_value_heads": 4, "scale_emb": 3.0, "scale_depth": 1.4, "dim_model_base": 16}),
    # AllenAI's FlexOlmo: OLMo 2's layers (norms after the attention and the MLP, queries and keys normed
    # over their whole projections) with OLMoE's experts in place of the MLP.
    "flex_olmo": ("FlexOlmoConfig", "FlexOlmoForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2}),
    # JetBrains' Mellum: Qwen3's attention, layers sliding and global at bases of their own, a dense first
    # layer, then Qwen3's experts (the softmax's top k, scaled to sum to 1).
    "mellum": ("MellumConfig", "MellumForCausalLM", {
        "num_hidden_layers": 4, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"] * 2,
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
    # GLM-4.7-Flash's: DeepSeek's multi-head latent attention (queries through a low-rank projection and
    # its norm, keys and values from a normed latent and one rotated key shared by the heads, whose
    # neighbouring pairs turn), values narrower than the queries; GLM-4.5's experts.
    "glm4_moe_lite": ("Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM", {
        "num_hidden_layers": 3, "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32, "routed_scaling_factor": 1.8}),
    # DeepSeek V3's (Moonlight's and Kimi K2's shape: experts in one group), its queries projected
    # directly (DeepSeek-V2-Lite's), values wider than the queries, the first layer dense.
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {
        "num_hidden_layers": 3, "num_key_value_heads": 4, "q_lora_rank": None, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 48, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32, "routed_scaling_factor": 2.5, "n_group": 1,
        "topk_group": 1, "first_k_dense_replace": 1, "rope_parameters": {"rope_type": "default",
                                                                          "rope_theta": 10000.0}}),
    # DeepSeek V2's (DeepSeek-V2-Lite): the same latent attention, its queries projected directly, and
    # experts chosen by a softmax, their weights as it gives them, scaled by routed_scaling_factor,
    # beside two shared experts; V2-Lite's YaRN (mscale 0.707; factor 32, past an original context of 64).
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", {
        "num_hidden_layers": 3, "num_key_value_heads": 4, "q_lora_rank": None, "kv_lora_rank": 32,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 2, "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.0, "topk_method": "greedy", "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0, "original_max_position_embeddings": 64,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}}),
    # Tencent's Youtu-LLM (2B): DeepSeek V3's latent attention, low-rank queries, neighbouring pairs
    # rotated, in a Llama's dense layers; its embeddings its LM head.
    "youtu": ("YoutuConfig", "YoutuForCausalLM", {
        "num_hidden_layers": 2, "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32}),
    # Llama 4's (Scout's layers, text alone): every fourth layer without RoPE, weightless per-head query
    # and key norms in the others, which rotate neighbouring pairs and attend within chunks; experts
    # (one of 4 a token, its input scaled by the sigmoid of its logit, beside a shared expert) in
    # every other layer, wider dense layers between.
    "llama4": ("Llama4TextConfig", "Llama4ForCausalLM", LLAMA4_TINY),
    # Llama 4 Scout as published: the same language model under an image-and-text checkpoint
    # (Llama4ForConditionalGeneration), a tiny vision tower beside it.
    "llama4_vl": ("Llama4Config", "Llama4ForConditionalGeneration", {
        "text_config": LLAMA4_TINY,
        "vision_config": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                          "intermediate_size": 64, "vision_output_dim": 64, "image_size": 56, "patch_size": 14,
                          "projector_input_dim": 64, "projector_output_dim": 64},
        "image_token_index": 511, "boi_token_index": 509, "eoi_token_index": 510}),
    # ERNIE 4.5's mixtures of experts (ERNIE-4.5-21B-A3B): ERNIE's neighbouring pairs rotated, a dense
    # first layer, then experts (2 of 8) chosen by softmax scores plus a correction bias and mixed by
    # those scores scaled to sum to 1, beside a shared expert; its embeddings its LM head.
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", {
        "num_hidden_layers": 3, "moe_num_experts": 8, "moe_k": 2, "moe_intermediate_size": 32,
        "moe_num_shared_experts": 1, "moe_layer_start_index": 1, "tie_word_embeddings": True}),
    # OpenBMB's MiniCPM5 MoE (15B-A2.5B): a Llama's attention whose output a sigmoid gates (the gate's
    # rows fused with each head's queries), a dense first layer, then GLM-4.5's experts (sigmoid
    # scores plus a bias for choosing, scaled to sum to 1, then by routed_scaling_factor) beside a
    # shared expert.
    "minicpm5_moe": ("MiniCPM5MoeConfig", "MiniCPM5MoeForCausalLM", {
        "head_dim": 16, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "mlp_layer_types": ["dense", "sparse"], "routed_scaling_factor": 2.5}),
    # HunYuan's NTK scaling with a fixed alpha (its checkpoints call it "dynamic"): a static base.
    "hunyuan_alpha": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", {"head_dim": 16, "rope_parameters": {
        "rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 2000.0, "factor": 1.0}}),
}  # fmt: skip
# Checked from their Hugging Face folder only: transformers' GGUF loader reads none of these families,
# and the GGUF matrix (tiny_gguf.GGUF_ARCHITECTURES) writes the families
# llama.cpp users bring most, with Llama 3's, Gemma 3's, linear and YaRN RoPE scaling.
FOLDER_ONLY = ("phi3_wide", "gemma3_vl", "ministral3_vl",
               "hunyuan_alpha", "gpt_oss_global",
               "lfm2_vl",
               "qwen3_moe_dense", "gemma4_unified",
               "granite_swa", "lfm3", "lfm3_vl", "glm4v", "glm4v_moe", "exaone4_5",
               "ministral",
               "qwen2_moe_dense",
               "helium", "nanochat", "starcoder2", "granitemoe_swa",
               "vaultgemma", "hyperclovax", "hyperclovax_plain", "gemma4_unified_text",
               "opt", "falcon_new", "glm4_moe_lite", "llama4", "llama4_vl",
               "stablelm_3b", "llava", "smolvlm", "internvl", "qwen3_next", "iquestcoder",
               "exaone_moe", "cwm", "hunyuan_moe",
               "minimax_m2", "mellum", "hy_v3", "flex_olmo", "minicpm3",
               "gptj", "codegen", "minicpm5_moe")  # (llama.cpp's converter writes none of these)


def _granite4_as_published(config: dict[str, Any]) -> dict[str, Any]:
    """Granite 4.0's layers in transformers 4's words, as its published configs name them."""
    words = {"linear_attention": "mamba", "full_attention": "attention"}
    return config | {"layer_types": [words.get(kind, kind) for kind in config["layer_types"]]}


# What transformers 5 writes of a Nemotron-H config that has no experts, and a published one lacks.
NEMOTRON_H_MOE_KEYS = ("moe_intermediate_size", "moe_latent_size", "moe_shared_expert_intermediate_size",
                       "moe_shared_expert_overlap", "mtp_layers_block_type", "n_group", "n_routed_experts",
                       "n_shared_experts", "norm_topk_prob", "num_experts_per_tok", "num_nextn_predict_layers",
                       "routed_scaling_factor", "topk_group")  # fmt: skip


def _nemotron_h_as_published(config: dict[str, Any]) -> dict[str, Any]:
    """Nemotron-H's layers as one pattern (M: Mamba, *: attention, -: MLP, E: experts), as its
    published configs give them, and a model without experts without their keys."""
    letters = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}
    kinds = config["layers_block_type"]
    dropped = ("layers_block_type", *(NEMOTRON_H_MOE_KEYS if "moe" not in kinds else ()))
    return {k: v for k, v in config.items() if k not in dropped} | {
        "hybrid_override_pattern": "".join(letters[kind] for kind in kinds), "num_hidden_layers": len(kinds)}


def _exaone_as_published(config: dict[str, Any]) -> dict[str, Any]:
    """EXAONE 3.5's config in its published keys (EXAONE's own names, RoPE as transformers 4's)."""
    names = {"hidden_act": "activation_function", "num_hidden_layers": "num_layers",
             "rms_norm_eps": "layer_norm_epsilon"}  # fmt: skip
    rope = dict(config["rope_parameters"])
    return {names.get(k, k): v for k, v in config.items() if k != "rope_parameters"} | {
        "rope_theta": rope.pop("rope_theta"), "rope_scaling": rope}


def _gpt_neox_as_published(config: dict[str, Any]) -> dict[str, Any]:
    """GPT-NeoX's rotation in its published configs' keys (rotary_pct, rotary_emb_base)."""
    rope = config["rope_parameters"]
    return {k: v for k, v in config.items() if k != "rope_parameters"} | {
        "rotary_pct": rope["partial_rotary_factor"], "rotary_emb_base": rope["rope_theta"]}


def _afmoe_as_published(config: dict[str, Any]) -> dict[str, Any]:
    """Trinity's experts' choice and mix as its published configs name them (score_func, route_norm),
    which llama.cpp's converter reads (transformers' class always routes so, and saves neither)."""
    return config | {"score_func": "sigmoid", "route_norm": True}


def _deepseek_v3_as_published(config: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek V3's experts' choice as its published configs name it (scoring_func, topk_method),
    which llama.cpp's converter reads (transformers 5 drops them: its class has no other)."""
    return config | {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}


def _glm4_moe_as_published(config: dict[str, Any]) -> dict[str, Any]:
    """GLM-4.5's RoPE in its published configs' keys (transformers 4's: rope_theta, partial_rotary_factor,
    rope_scaling null)."""
    rope = dict(config["rope_parameters"])
    theta, rotated = rope.pop("rope_theta"), rope.pop("partial_rotary_factor", 1.0)
    return {k: v for k, v in config.items() if k != "rope_parameters"} | {
        "rope_theta": theta, "partial_rotary_factor": rotated,
        "rope_scaling": None if rope.get("rope_type", "default") == "default" else rope}


# The config.json of these classes as their published checkpoints have it, where transformers 5
# saves another: llama.cpp's converter reads the published one (it would take every layer of a
# Granite 4.0 saved in transformers 5's words for a Mamba layer, and a Nemotron-H with the keys of
# experts for a mixture of experts, and fails on a GPT-NeoX without rotary_pct).
AS_PUBLISHED = {"GraniteMoeHybridConfig": _granite4_as_published, "NemotronHConfig": _nemotron_h_as_published,
                "GPTNeoXConfig": _gpt_neox_as_published, "ExaoneConfig": _exaone_as_published,
                "Glm4MoeConfig": _glm4_moe_as_published, "DeepseekV3Config": _deepseek_v3_as_published,
                "AfmoeConfig": _afmoe_as_published}


def _experts_transposed(name: str, weight: Any) -> Any:
    """Qwen3-VL's fused experts as its published checkpoints hold them: each expert's matrix
    transposed (inputs by outputs), which transformers transposes back where the shape says so."""
    return weight.transpose(1, 2).contiguous() if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")) \
        else weight


# The weights of these fixtures as their published checkpoints lay them out, where transformers 5
# saves another layout (name, tensor -> tensor).
WEIGHTS_AS_PUBLISHED = {"qwen3_vl_moe": _experts_transposed}


def _kept_as_saved(out_dir: Path) -> Path:
    """The folder transformers saved in `out_dir`, copied into its REFERENCE_FOLDER (its config moved:
    the published layout writes its own): the reference model and tokenizer, as transformers reads
    them, of a fixture laid out as its published checkpoints are."""
    import shutil

    reference = out_dir / REFERENCE_FOLDER
    reference.mkdir()
    for item in [i for i in out_dir.iterdir() if i.is_file()]:
        if item.name == "config.json":
            item.rename(reference / item.name)
        else:
            shutil.copy2(item, reference / item.name)
    return reference


def _ling2_as_published(out_dir: Path, config: Any) -> None:
    """The GLM-4.5 saved in `out_dir` laid out as Ling 2.0's published checkpoints are (their config's
    keys, the queries, keys and values one projection, the names of their remote code), the GLM-4.5
    itself kept in REFERENCE_FOLDER (transformers has no class for Ling 2.0's layout)."""
    import torch
    from safetensors.torch import load_file, save_file

    reference = _kept_as_saved(out_dir)
    renamed = {"model.embed_tokens.": "model.word_embeddings.", ".self_attn.o_proj.": ".attention.dense.",
               ".self_attn.q_norm.": ".attention.query_layernorm.", ".self_attn.k_norm.": ".attention.key_layernorm.",
               ".mlp.gate.e_score_correction_bias": ".mlp.gate.expert_bias"}  # fmt: skip
    tensors, fused = load_file(str(reference / "model.safetensors")), {}
    for name in list(tensors):
        if ".self_attn.q_proj." in name:
            parts = [tensors.pop(name.replace("q_proj", proj)) for proj in ("q_proj", "k_proj", "v_proj")]
            fused[name.replace("self_attn.q_proj", "attention.query_key_value")] = torch.cat(parts, dim=0)
    for name in [n for n in tensors if ".self_attn." in n or any(old in n for old in renamed)]:
        new = name
        for old, replacement in renamed.items():
            new = new.replace(old, replacement)
        tensors[new] = tensors.pop(name)
    save_file({**tensors, **fused}, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    rope = config.rope_parameters
    published = {
        "architectures": ["BailingMoeV2ForCausalLM"], "model_type": "bailing_moe_v2", "torch_dtype": "float32",
        **{k: getattr(config, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                                           "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                                           "bos_token_id", "eos_token_id", "pad_token_id", "moe_intermediate_size",
                                           "first_k_dense_replace", "routed_scaling_factor", "n_group", "topk_group",
                                           "num_experts_per_tok", "use_qk_norm", "norm_topk_prob")},
        "num_experts": config.n_routed_experts, "num_shared_experts": config.n_shared_experts,
        "use_qkv_bias": config.attention_bias, "use_bias": False, "rope_theta": rope["rope_theta"],
        "partial_rotary_factor": rope["partial_rotary_factor"], "rope_scaling": None, "score_function": "sigmoid",
        "moe_router_enable_expert_bias": True, "num_nextn_predict_layers": 0}  # fmt: skip
    (out_dir / "config.json").write_text(json.dumps(published, indent=2, sort_keys=True) + "\n")


def _minicpm_as_published(out_dir: Path, config: Any) -> None:
    """The Granite saved in `out_dir` as MiniCPM's published checkpoints are: the same weights under
    MiniCPM's config keys (µP's scale_emb, scale_depth, dim_model_base; its scores at 1/sqrt(head
    width), which the fixture's attention_multiplier must be), the Granite itself kept in
    REFERENCE_FOLDER (transformers has no class for MiniCPM)."""
    import math

    head = config.hidden_size // config.num_attention_heads
    assert math.isclose(config.attention_multiplier, head**-0.5), "MiniCPM's scores are at 1/sqrt(head width)"
    _kept_as_saved(out_dir)
    rope = dict(config.rope_parameters)
    theta = rope.pop("rope_theta")
    published = {
        "architectures": ["MiniCPMForCausalLM"], "model_type": "minicpm", "torch_dtype": "float32",
        **{k: getattr(config, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads", "num_key_value_heads", "hidden_act",
                                           "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                                           "bos_token_id", "eos_token_id", "pad_token_id")},
        "scale_emb": config.embedding_multiplier,
        "scale_depth": round(config.residual_multiplier * math.sqrt(config.num_hidden_layers), 6),
        "dim_model_base": round(config.hidden_size / config.logits_scaling), "rope_theta": theta,
        "rope_scaling": None if rope.get("rope_type", "default") == "default" else rope}  # fmt: skip
    (out_dir / "config.json").write_text(json.dumps(published, indent=2, sort_keys=True) + "\n")


# Fixtures whose published checkpoints have a layout transformers does not read (a class of their
# remote code): the fixture's folder is laid out so, its transformers model (the reference) kept in
# REFERENCE_FOLDER; (the class its config names, what writes the layout from the saved folder).
LAYOUTS_AS_PUBLISHED: dict[str, tuple[str, Callable[[Path, Any], None]]] = {
    "ling2": ("BailingMoeV2ForCausalLM", _ling2_as_published),
    "minicpm": ("MiniCPMForCausalLM", _minicpm_as_published)}
REFERENCE_FOLDER = "transformers"


def reference_dir(arch: str, folder: Path | None = None) -> Path:
    """Where the fixture's (or `folder`'s, a fixture of `arch`) reference model is: the folder, or
    for a layout transformers does not read (LAYOUTS_AS_PUBLISHED) the model it was written from."""
    folder = tiny_hf_dir(arch) if folder is None else folder
    return folder / REFERENCE_FOLDER if arch in LAYOUTS_AS_PUBLISHED else folder


def _rewrite_weights(path: Path, rewrite: Callable[[str, Any], Any]) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    save_file({name: rewrite(name, weight) for name, weight in tensors.items()}, str(path), metadata={"format": "pt"})


# The class a family's published checkpoints name in config.json where transformers runs them as
# another (ARCHITECTURES' model class): the fixture names it too, as the build will be given it.
PUBLISHED_AS = {"internlm3": "InternLM3ForCausalLM", "exaone": "ExaoneForCausalLM",
                "iquestcoder": "IQuestCoderForCausalLM", "mpt": "MPTForCausalLM"}  # (MPT's: its remote code's class)


def reference_class(arch: str) -> str:
    """The transformers class the fixture's folder loads as the reference: the spec's, or for a class
    transformers lacks (PUBLISHED_AS) its auto class, which reads the config by its model type, as
    the build does (the class it stands for would read the config as its own: EXAONE's num_layers
    unread, a Llama of 32 layers)."""
    return "AutoModelForCausalLM" if arch in PUBLISHED_AS else ARCHITECTURES[arch][1]


# ChatML, as SmolLM2 and Qwen use: rendered by Jinja exactly as Hugging Face renders it.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Mistral's instruct style: no system role; a system prompt is folded into the first user turn. As
# Mistral 7B v0.3's template (abridged), one that takes `tools` lists them before the last user
# message, the model calls them after its [TOOL_CALLS] token, and a result comes back in a
# [TOOL_RESULTS] block; an earlier call and its result must carry the same 9-character id.
MISTRAL_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- set user_messages = loop_messages | selectattr('role', 'equalto', 'user') | list %}"
    "{%- set ns = namespace(index=0) %}{%- for message in loop_messages %}"
    "{%- if not (message['role'] == 'tool' or (message.tool_calls is defined and message.tool_calls)) %}"
    "{%- if (message['role'] == 'user') != (ns.index % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
    "{%- set ns.index = ns.index + 1 %}{%- endif %}{%- endfor %}"
    "{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if tools is defined and tools and message == user_messages[-1] %}"
    "{{- '[AVAILABLE_TOOLS] ' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{%- if loop.first and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\n\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message.tool_calls is defined and message.tool_calls %}{{- '[TOOL_CALLS] [' }}"
    "{%- for call in message.tool_calls %}{%- if call.id is not defined or call.id | length != 9 %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}"
    "{{- (call.function | tojson)[:-1] + ', \"id\": \"' + call.id + '\"}' }}"
    "{%- if not loop.last %}{{- ', ' }}{%- endif %}"
    "{%- endfor %}{{- ']' + eos_token }}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if message.tool_call_id is not defined or message.tool_call_id | length != 9 %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}"
    "{{- '[TOOL_RESULTS] {\"content\": ' + message['content'] | string + ', \"call_id\": \"' + message.tool_call_id"
    " + '\"}[/TOOL_RESULTS]' }}"
    "{%- endif %}{%- endfor %}"
)
# Mistral Small 3.1's and 3.2's template, abridged (no default system prompt, no images): a system
# role of its own, the tools listed after it, and each call after its own [TOOL_CALLS] token with
# [ARGS] between its name and its arguments; a tool's result in a [TOOL_RESULTS] block.
MISTRAL_SMALL_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '[SYSTEM_PROMPT]' + messages[0]['content'] + '[/SYSTEM_PROMPT]' }}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- if tools is defined and tools is not none and tools | length > 0 %}"
    "{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- message['content'] }}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] is not none %}"
    "{%- for tool in message['tool_calls'] %}{%- set arguments = tool['function']['arguments'] %}"
    "{%- if arguments is not string %}{%- set arguments = arguments | tojson %}{%- endif %}"
    "{{- '[TOOL_CALLS]' + tool['function']['name'] + '[ARGS]' + arguments }}{%- endfor %}{%- endif %}"
    "{{- eos_token }}"
    "{%- elif message['role'] == 'tool' %}{{- '[TOOL_RESULTS]' + message['content'] + '[/TOOL_RESULTS]' }}"
    "{%- endif %}{%- endfor %}"
)
# Qwen3.5's template, abridged (no images, no earlier thoughts): the tools listed as JSON with the
# call format shown; each call's arguments as parameters, a string's as it is, anything else as
# JSON or Python's str(), as published; results as <tool_response> blocks in a user turn; and the
# answer opening with an empty thought unless thinking is asked for.
QWEN35_CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}"
    "{{- '# Tools\n\nYou have access to the following functions:\n\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "</function>\n</tool_call><|im_end|>\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}{%- set content = message.content if message.content is string else '' %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\n' + content }}"
    "{%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if loop.first %}{%- if content|trim %}{{- '\n\n<tool_call>\n<function=' + tool_call.name + '>\n' }}"
    "{%- else %}{{- '<tool_call>\n<function=' + tool_call.name + '>\n' }}{%- endif %}"
    "{%- else %}{{- '\n<tool_call>\n<function=' + tool_call.name + '>\n' }}{%- endif %}"
    "{%- if tool_call.arguments is defined %}{%- for args_name, args_value in tool_call.arguments|items %}"
    "{{- '<parameter=' + args_name + '>\n' }}"
    "{%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and "
    "args_value is not string) else args_value | string %}"
    "{{- args_value }}{{- '\n</parameter>\n' }}{%- endfor %}{%- endif %}"
    "{{- '</function>\n</tool_call>' }}{%- endfor %}{%- endif %}{{- '<|im_end|>\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.previtem and loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\n<tool_response>\n' }}{{- content }}{{- '\n</tool_response>' }}"
    "{%- if not loop.last and loop.nextitem.role != 'tool' %}{{- '<|im_end|>\n' }}"
    "{%- elif loop.last %}{{- '<|im_end|>\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is true %}{{- '<think>\n' }}"
    "{%- else %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}"
)
# LFM2's template, as published: the tools as a JSON list in the system turn between special tokens;
# a call is the assistant's text (Python calls between <|tool_call_start|> and <|tool_call_end|>),
# a result a tool turn between <|tool_response_start|> and <|tool_response_end|>.
LFM2_CHAT_TEMPLATE = (
    '{{- bos_token -}}{%- set system_prompt = "" -%}{%- set ns = namespace(system_prompt="") -%}'
    '{%- if messages[0]["role"] == "system" -%}{%- set ns.system_prompt = messages[0]["content"] -%}'
    '{%- set messages = messages[1:] -%}{%- endif -%}'
    '{%- if tools -%}{%- set ns.system_prompt = ns.system_prompt + ("\n" if ns.system_prompt else "") + '
    '"List of tools: <|tool_list_start|>[" -%}{%- for tool in tools -%}'
    '{%- if tool is not string -%}{%- set tool = tool | tojson -%}{%- endif -%}'
    '{%- set ns.system_prompt = ns.system_prompt + tool -%}'
    '{%- if not loop.last -%}{%- set ns.system_prompt = ns.system_prompt + ", " -%}{%- endif -%}{%- endfor -%}'
    '{%- set ns.system_prompt = ns.system_prompt + "]<|tool_list_end|>" -%}{%- endif -%}'
    '{%- if ns.system_prompt -%}{{- "<|im_start|>system\n" + ns.system_prompt + "<|im_end|>\n" -}}{%- endif -%}'
    '{%- for message in messages -%}{{- "<|im_start|>" + message["role"] + "\n" -}}'
    '{%- set content = message["content"] -%}{%- if content is not string -%}{%- set content = content | tojson -%}'
    '{%- endif -%}{%- if message["role"] == "tool" -%}'
    '{%- set content = "<|tool_response_start|>" + content + "<|tool_response_end|>" -%}{%- endif -%}'
    '{{- content + "<|im_end|>\n" -}}{%- endfor -%}'
    '{%- if add_generation_prompt -%}{{- "<|im_start|>assistant\n" -}}{%- endif -%}'
)
# Apertus' template (abridged: its tools as JSON, not TypeScript): a developer turn declares the
# tools; an assistant turn writes its calls between two special tokens, each call an object keyed by
# the tool's name, and their results follow them in the same turn as a list.
APERTUS_CHAT_TEMPLATE = (
    "{{- bos_token -}}{%- if messages and messages[0].role == 'system' -%}"
    "{{ '<|system_start|>' + messages[0].content + '<|system_end|>' }}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{{ '<|system_start|>You are Apertus, a helpful assistant.<|system_end|>' }}"
    "{%- set loop_messages = messages -%}{%- endif -%}{{ '<|developer_start|>Deliberation: disabled\n' }}"
    "{%- if tools -%}{{ 'Tool Capabilities:\n' }}{%- for tool in tools -%}{{ tool.function | tojson + '\n' }}"
    "{%- endfor -%}{%- else -%}{{ 'Tool Capabilities: disabled' }}{%- endif -%}{{ '<|developer_end|>' }}"
    "{%- set ns = namespace(in_assistant=false, in_tool=false) -%}{%- for message in loop_messages -%}"
    "{%- if message.role == 'user' -%}{%- if ns.in_tool -%}{{ ']' }}{%- set ns.in_tool = false -%}{%- endif -%}"
    "{%- if ns.in_assistant -%}{{ '<|assistant_end|>' }}{%- set ns.in_assistant = false -%}{%- endif -%}"
    "{{ '<|user_start|>' + message.content + '<|user_end|>' }}{%- elif message.role == 'assistant' -%}"
    "{%- if not ns.in_assistant -%}{{ '<|assistant_start|>' }}{%- set ns.in_assistant = true -%}{%- endif -%}"
    "{%- if ns.in_tool -%}{{ ']' }}{%- set ns.in_tool = false -%}{%- endif -%}{{ message.content }}"
    "{%- if message.tool_calls -%}{{ '<|tools_prefix|>[' }}{%- for call in message.tool_calls -%}"
    "{{ '{\"' + call.function.name + '\": ' + call.function.arguments | tojson + '}' }}"
    "{%- if not loop.last -%}{{ ', ' }}{%- endif -%}{%- endfor -%}{{ ']<|tools_suffix|>' }}{%- endif -%}"
    "{%- elif message.role == 'tool' -%}{%- if not ns.in_assistant -%}"
    "{{ raise_exception('Tool message outside of assistant') }}{%- endif -%}{%- if not ns.in_tool -%}{{ '[' }}"
    "{%- set ns.in_tool = true -%}{%- else -%}{{ ', ' }}{%- endif -%}{{ message.content }}{%- endif -%}"
    "{%- endfor -%}{%- if ns.in_tool -%}{{ ']' }}{%- endif -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant_start|>' }}{%- endif -%}"
)
# Phi-3.5-mini-instruct's template, as published.
PHI3_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
# A reasoning model's ChatML, as SmolLM3's and Qwen3's templates write it (abridged to the parts the
# engine meets: no tools, no metadata block): `enable_thinking` false writes an empty thought in the
# generation prompt, and an earlier answer is shown without its thought.
THINKING_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}"
    "{%- endif %}"
)


# Llama 3.1's and 3.2's template, abridged (no dates, no built-in tools): a template that takes
# `tools` writes them into the first user turn and asks for calls in Llama's own JSON; a tool's
# result is an ipython turn.
LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}"
    "{%- if tools is not none and tools is defined %}{{- 'Environment: ipython\n' }}{%- endif %}"
    "{{- system_message + '<|eot_id|>' }}"
    "{%- if tools is not none and tools is defined and messages | length > 0 %}"
    "{%- set first_user_message = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\n\n' }}"
    "{{- 'Given the following functions, please respond with a JSON for a function call with its proper '"
    " 'arguments that best answers the given prompt.\n\n' }}"
    "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its "
    "value}.Do not use variables.\n\n' }}"
    "{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\n\n' }}{%- endfor %}"
    "{{- first_user_message + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] in ['tool', 'ipython'] %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)


# gpt-oss's harmony format, as its template writes it (abridged: no developer message, the tools'
# parameters as JSON rather than TypeScript): a system message with the reasoning effort, the
# tools in a developer message's `functions` namespace, each message with its header, an earlier
# answer in the final channel, an earlier call as a message to its function on the commentary
# channel (the thought before it in the analysis channel) and its result as the function's
# message back; the generation prompt leaves the channel to the model.
HARMONY_CHAT_TEMPLATE = (
    "{{- '<|start|>system<|message|>Reasoning: ' + (reasoning_effort | default('medium')) }}"
    "{{- '\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.' }}"
    "{%- if tools %}{{- \"\nCalls to these tools must go to the commentary channel: 'functions'.\" }}{%- endif %}"
    "{{- '<|end|>' }}"
    "{%- if tools %}{{- '<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n' }}"
    "{%- for tool in tools %}{{- '\n// ' + tool.function.description + '\ntype ' + tool.function.name + ' = (_: '"
    " + (tool.function.parameters | tojson) + ') => any;\n' }}{%- endfor %}"
    "{{- '\n} // namespace functions<|end|>' }}{%- endif %}"
    "{%- set last_call = namespace(name=none) %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' and message.tool_calls %}"
    "{%- if message.content and message.thinking %}"
    "{{- raise_exception('Cannot pass both content and thinking in an assistant message with tool calls!') }}"
    "{%- elif message.content or message.thinking %}"
    "{{- '<|start|>assistant<|channel|>analysis<|message|>' + (message.content or message.thinking) + '<|end|>' }}"
    "{%- endif %}"
    "{%- set call = message.tool_calls[0].function %}"
    "{{- '<|start|>assistant to=functions.' + call.name + '<|channel|>commentary json<|message|>'"
    " + (call.arguments | tojson) + '<|call|>' }}"
    "{%- set last_call.name = call.name %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if last_call.name is none %}{{- raise_exception('A tool message needs an earlier call.') }}{%- endif %}"
    "{{- '<|start|>functions.' + last_call.name + ' to=assistant<|channel|>commentary<|message|>'"
    " + (message['content'] | tojson) + '<|end|>' }}"
    "{%- else %}{{- '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)


@dataclass(frozen=True)
class ChatStyle:
    template: str
    specials: tuple[str, ...]  # the first is the unknown and padding token
    bos: str
    eos: str  # the end of an assistant turn: generation stops on it
    added: tuple[str, ...] = ()  # tokens of their own that decode as text (not special), as `<think>` is


CHATML = ChatStyle(TINY_CHAT_TEMPLATE, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), "<|im_start|>", "<|im_end|>")
GEMMA_TURNS = ChatStyle(GEMMA3_CHAT_TEMPLATE, ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"),
                        "<bos>", "<end_of_turn>")
# Gemma 4's turns: <|turn>role ... <turn|>, a system role of its own, the assistant's role "model";
# it thinks in a channel, <|channel>thought\n...<channel|>: asked for (<|think|>), or closed empty;
# tools are declared in the system turn, calls written <|tool_call>call:name{key:value}<tool_call|>
# (strings between <|"|> tokens, keys bare and sorted), their results after them in the same turn
# (`tool_responses`), which the model goes on answering.
GEMMA4_CHAT_TEMPLATE = """{%- macro arg(v) -%}
{%- if v is string -%}<|"|>{{ v }}<|"|>
{%- elif v is boolean -%}{{ 'true' if v else 'false' }}
{%- elif v is mapping -%}{ {%- for k, x in v | dictsort -%}{{ k }}:{{ arg(x) }}{{ ',' if not loop.last }}
{%- endfor -%} }
{%- elif v is sequence -%}[ {%- for x in v -%}{{ arg(x) }}{{ ',' if not loop.last }}{%- endfor -%} ]
{%- else -%}{{ v }}{%- endif -%}
{%- endmacro -%}
{{ bos_token }}
{%- set rest = messages -%}
{%- if enable_thinking or tools or messages[0]['role'] == 'system' -%}
<|turn>system
{% if enable_thinking %}<|think|>{% endif %}
{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] | trim }}{% set rest = messages[1:] %}{% endif %}
{%- for tool in tools or [] -%}
<|tool>declaration:{{ tool['function']['name'] }}{{ tool['function']['parameters'] | tojson }}<tool|>
{%- endfor -%}
<turn|>
{% endif -%}
{%- set ns = namespace(open=false) -%}
{%- for message in rest -%}
<|turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}
{% for call in message['tool_calls'] or [] -%}
<|tool_call>call:{{ call['function']['name'] }}{{ arg(call['function']['arguments']) }}<tool_call|>
{%- endfor -%}
{%- for r in message['tool_responses'] or [] -%}
<|tool_response>response:{{ r['name'] }}
{{- arg(r['response']) if r['response'] is mapping else '{value:' ~ arg(r['response']) ~ '}' }}<tool_response|>
{%- endfor -%}
{%- set ns.open = message['tool_responses'] and not message['content'] -%}
{%- if not ns.open %}{{ (message['content'] or '') | trim }}<turn|>
{% endif -%}
{% endfor -%}
{%- if add_generation_prompt -%}
{%- if not ns.open %}<|turn>model
{% endif -%}
{% if not enable_thinking | default(false) %}<|channel>thought
<channel|>{% endif -%}
{%- endif -%}"""
GEMMA4_TURNS = ChatStyle(GEMMA4_CHAT_TEMPLATE, ("<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|think|>",
                                                "<|channel>", "<channel|>", "<|tool>", "<tool|>", "<|tool_call>",
                                                "<tool_call|>", '<|"|>', "<|tool_response>", "<tool_response|>"),
                         "<bos>", "<turn|>")  # fmt: skip
# Seed-OSS's turns: <seed:bos>role ... <seed:eos>; tools listed in the system turn with its call
# format, calls written <seed:tool_call>\n<function=name>\n<parameter=k>v</parameter>\n</function>\n
# </seed:tool_call>, results in a turn of the tool's.
SEED_CHAT_TEMPLATE = (
    "{%- set sys = messages | selectattr('role', 'equalto', 'system') | map(attribute='content') | join('\n') -%}"
    "{%- if sys or tools -%}{{ '<seed:bos>system\n' + sys }}{%- for tool in tools or [] -%}{{ '\n' + tool | tojson }}"
    "{%- endfor -%}{%- if tools -%}{{ '\nCall a function as: <seed:tool_call>\n<function=name>\n'"
    " + '<parameter=p>value</parameter>\n</function>\n</seed:tool_call>' }}{%- endif -%}{{ '<seed:eos>' }}{%- endif -%}"
    "{%- for message in messages if message['role'] != 'system' -%}{{ '<seed:bos>' + message['role'] }}"
    "{%- if message['content'] -%}{{ '\n' + message['content'] }}{%- endif -%}"
    "{%- for call in message['tool_calls'] or [] -%}"
    "{{ '\n<seed:tool_call>\n<function=' + call['function']['name'] + '>\n' }}"
    "{%- for k, v in call['function']['arguments'] | items -%}"
    "{{ '<parameter=' + k + '>' + (v if v is string else v | string) + '</parameter>\n' }}{%- endfor -%}"
    "{{ '</function>\n</seed:tool_call>' }}{%- endfor -%}{{ '<seed:eos>' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<seed:bos>assistant\n' }}{%- endif -%}"
)
# Zhipu's GLM-4.5 and 4.6 (abridged): turns after special tokens of their own, the tools listed in a
# system turn; each assistant turn an empty thought unless it has one, then its text, then each call
# after a newline: the name after <tool_call>, each argument a key and a value between tags (a
# value that is not a string as JSON); results after <|observation|> between <tool_response> tags.
GLM45_CHAT_TEMPLATE = (
    "[gMASK]<sop>{%- if tools -%}{{ '<|system|>\n# Tools\n\nYou may call one or more functions to assist with "
    "the user query.\n\n<tools>\n' }}{%- for tool in tools -%}{{ tool | tojson + '\n' }}{%- endfor -%}"
    "{{ '</tools>\n\nFor each function call, output the function name and arguments within the following XML "
    "format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>"
    "\n...\n</tool_call>' }}{%- endif -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{{ '<|user|>\n' + m.content }}"
    "{%- elif m.role == 'assistant' -%}{{ '<|assistant|>\n<think></think>' }}"
    "{%- if m.content and m.content.strip() -%}{{ '\n' + m.content.strip() }}{%- endif -%}"
    "{%- for tc in m.tool_calls or [] -%}{{ '\n<tool_call>' + tc.function.name + '\n' }}"
    "{%- for k, v in tc.function.arguments | items -%}"
    "{{ '<arg_key>' + k + '</arg_key>\n<arg_value>' + (v if v is string else v | tojson) + '</arg_value>\n' }}"
    "{%- endfor -%}{{ '</tool_call>' }}{%- endfor -%}"
    "{%- elif m.role == 'tool' -%}{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}"
    "{{ '<|observation|>' }}{%- endif -%}{{ '\n<tool_response>\n' + m.content + '\n</tool_response>' }}"
    "{%- elif m.role == 'system' -%}{{ '<|system|>\n' + m.content }}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)
# ServiceNow's Apriel 1.6 Thinker (abridged): a system turn of its own with the tools; each turn after
# a special token; the generation prompt opens a thought written as text, which ends at a marker
# ("[BEGIN FINAL RESPONSE]"), written after an earlier thought (the last turn's alone); a turn's calls
# listed between <tool_calls> tags, text to this vocabulary, after a line break.
APRIEL_CHAT_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}"
    "{%- for m in messages if m.role == 'system' -%}{%- set ns.system = m.content + '\n' -%}{%- endfor -%}"
    "{{ bos_token + '<|begin_system|>\nYou are a thoughtful, systematic AI assistant. Analyze each question "
    "carefully, present your reasoning step-by-step, then provide the final response after the marker "
    "[BEGIN FINAL RESPONSE].\n' + ns.system }}"
    "{%- if tools -%}{{ 'You are provided with function signatures within <available_tools></available_tools> "
    "XML tags.\nHere are the available tools:\n<available_tools>\n' }}{%- for tool in tools -%}"
    "{{ tool | tojson }}{%- endfor -%}{{ '\n</available_tools>.\n\nReturn all function calls as a list of JSON "
    "objects within <tool_calls></tool_calls> XML tags.\n<tool_calls>[{\"name\": <function-name-1>, "
    "\"arguments\": <args-dict-1>}, ...]</tool_calls>\n' }}{%- endif -%}"
    "{%- for m in messages if m.role != 'system' -%}"
    "{%- if m.role == 'user' -%}{{ '<|begin_user|>\n' + m.content }}"
    "{%- elif m.role == 'tool' -%}{{ '<|begin_tool_result|>\n' + m.content + '\n' }}"
    "{%- elif m.role == 'assistant' -%}{%- set last = loop.last -%}{{ '\n<|begin_assistant|>\n' }}"
    "{%- if m.reasoning_content and last -%}{{ m.reasoning_content + '\n[BEGIN FINAL RESPONSE]\n' }}{%- endif -%}"
    "{{ (m.content or '') if last else (m.content or '').split('[BEGIN FINAL RESPONSE]')[-1] | trim }}"
    "{%- if m.tool_calls -%}{{ '\n<tool_calls>[' }}{%- for c in m.tool_calls -%}"
    "{{ '{\"name\": \"' + c.function.name + '\", \"arguments\": ' + c.function.arguments | tojson }}"
    "{{ (', \"id\": \"' + c.id + '\"') if not last else '' }}{{ '}' + ('' if loop.last else ', ') }}"
    "{%- endfor -%}{{ ']</tool_calls>' }}{%- endif -%}{{ '' if last else '\n<|end|>\n' }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt and messages[-1].role != 'assistant' -%}"
    "{{ '\n<|begin_assistant|>\nHere are my reasoning steps:\n' }}{%- endif -%}"
)
APRIEL_TURNS = ChatStyle(APRIEL_CHAT_TEMPLATE, ("<unk>", "<s>", "<|end|>", "<|begin_system|>", "<|begin_user|>",
                                               "<|begin_assistant|>", "<|begin_tool_result|>"), "<s>", "<|end|>")
# Tencent's Hy3 (abridged): every token of its own built by `.format` of one suffix; the tools listed
# as JSON; a turn's calls GLM-4.5's keys and values between tags of their own; results in a block of
# tool turns; a closed thought before each answer, and in the generation prompt unless asked to think.
HY3_TURN_TOKENS = ("hy_begin_of_sentence", "hy_eos", "hy_User", "hy_Assistant")
HY3_TAGS = ("think", "tool_calls", "tool_call", "arg_key", "arg_value", "tool_responses", "tool_response")
HY3_CHAT_TEMPLATE = (
    "{%- set HYTK = ':opensource' -%}"
    "{%- set bos_token = '<｜hy_begin_of_sentence{}｜>'.format(HYTK) -%}"
    "{%- set eos_token = '<｜hy_eos{}｜>'.format(HYTK) -%}"
    "{%- set user_token = '<｜hy_User{}｜>'.format(HYTK) -%}"
    "{%- set assistant_token = '<｜hy_Assistant{}｜>'.format(HYTK) -%}"
    + "".join(f"{{%- set {tag}_begin = '<{tag}{{}}>'.format(HYTK) -%}}"
              f"{{%- set {tag}_end = '</{tag}{{}}>'.format(HYTK) -%}}" for tag in HY3_TAGS)
    + "{%- set tool_sep = '<tool_sep{}>'.format(HYTK) -%}"
    "{%- set ns = namespace(system='', tool=false) -%}"
    "{%- for m in messages if m.role == 'system' -%}{%- set ns.system = ns.system + m.content -%}{%- endfor -%}"
    "{{ bos_token + ns.system }}{%- if tools -%}{{ '\n\n' if ns.system else '' }}"
    "{{ '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>\n' }}"
    "{%- for tool in tools -%}{{ '\n' if not loop.first else '' }}{{ tool | tojson }}{%- endfor -%}"
    "{{ '\n</tools>\n\nFor function call returns, you should first print ' + tool_calls_begin + '\nFor each "
    "function call, you should return object like:\n' + tool_call_begin + '{function-name}' + tool_sep + '\n' + "
    "arg_key_begin + '{arg-key-1}' + arg_key_end + '\n' + arg_value_begin + '{arg-value-1}' + arg_value_end + "
    "'\n...\n' + tool_call_end + '\nAt the end of function call returns, you should print ' + tool_calls_end }}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role in ('user', 'assistant') and ns.tool -%}{{ tool_responses_end }}{%- set ns.tool = false -%}"
    "{%- endif -%}"
    "{%- if m.role == 'user' -%}{{ user_token + m.content }}"
    "{%- elif m.role == 'assistant' -%}{{ assistant_token + think_begin + think_end + (m.content or '') }}"
    "{%- if m.tool_calls -%}{{ tool_calls_begin + '\n' }}{%- for c in m.tool_calls -%}"
    "{{ tool_call_begin + c.function.name + tool_sep + '\n' }}{%- for k, v in c.function.arguments.items() -%}"
    "{{ arg_key_begin + k + arg_key_end + '\n' + arg_value_begin + (v if v is string else v | tojson) + "
    "arg_value_end + '\n' }}{%- endfor -%}{{ tool_call_end + '\n' }}{%- endfor -%}{{ tool_calls_end }}"
    "{%- endif -%}{{ eos_token }}"
    "{%- elif m.role == 'tool' -%}{{ '' if ns.tool else tool_responses_begin + '\n' }}"
    "{{ tool_response_begin + '\n' + m.content + '\n' + tool_response_end + '\n' }}{%- set ns.tool = true -%}"
    "{%- endif -%}{%- endfor -%}{{ tool_responses_end if ns.tool else '' }}"
    "{%- if add_generation_prompt -%}{{ assistant_token + think_begin }}"
    "{{ '' if reasoning_effort is defined and reasoning_effort in ('low', 'high') else think_end }}{%- endif -%}"
)
HY3_SPECIALS = ("<｜hy_pad:opensource｜>", *(f"<｜{t}:opensource｜>" for t in HY3_TURN_TOKENS), "<tool_sep:opensource>",
                *(f"<{end}{tag}:opensource>" for tag in HY3_TAGS for end in ("", "/")))  # fmt: skip
HY3_TURNS = ChatStyle(HY3_CHAT_TEMPLATE, HY3_SPECIALS, HY3_SPECIALS[1], HY3_SPECIALS[2])
# MiniMax-M2's (abridged): turns between tokens of its own, the tools listed as JSON, each call an
# <invoke> element, its arguments <parameter> elements (a value that is not a string as JSON), all
# of a turn's between two special tokens after a newline; results in a tool turn.
MINIMAX_M2_CHAT_TEMPLATE = (
    "{{ ']~!b[]~b]system\n' }}{%- if messages[0].role == 'system' -%}{{ messages[0].content }}"
    "{%- else -%}{{ 'You are a helpful assistant.' }}{%- endif -%}"
    "{%- if tools -%}{{ '\n\n# Tools\nYou may call one or more tools to assist with the user query.\nHere are the "
    "tools available in JSONSchema format:\n\n<tools>\n' }}{%- for tool in tools -%}"
    "{{ '<tool>' + tool.function | tojson + '</tool>\n' }}{%- endfor -%}{{ '</tools>\n\nWhen making tool calls, use "
    "XML format to invoke tools and pass parameters:\n\n<minimax:tool_call>\n<invoke name=\"tool-name-1\">\n"
    "<parameter name=\"param-key-1\">param-value-1</parameter>\n...\n</invoke>\n</minimax:tool_call>' }}"
    "{%- endif -%}{{ '[e~[\n' }}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{{ ']~b]user\n' + m.content + '[e~[\n' }}"
    "{%- elif m.role == 'assistant' -%}{{ ']~b]ai\n' + (m.content or '') }}"
    "{%- if m.tool_calls -%}{{ '\n<minimax:tool_call>\n' }}{%- for tc in m.tool_calls -%}"
    "{{ '<invoke name=\"' + tc.function.name + '\">\n' }}{%- for k, v in tc.function.arguments | items -%}"
    "{{ '<parameter name=\"' + k + '\">' + (v if v is string else v | tojson) + '</parameter>\n' }}"
    "{%- endfor -%}{{ '</invoke>\n' }}{%- endfor -%}{{ '</minimax:tool_call>' }}{%- endif -%}{{ '[e~[\n' }}"
    "{%- elif m.role == 'tool' -%}{{ ']~b]tool\n<response>' + m.content + '</response>[e~[\n' }}"
    "{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{ ']~b]ai\n' }}{%- endif -%}"
)
MINIMAX_M2_TURNS = ChatStyle(MINIMAX_M2_CHAT_TEMPLATE, ("<pad>", "]~!b[", "]~b]", "[e~[", "<minimax:tool_call>",
                                                       "</minimax:tool_call>"), "]~!b[", "[e~[")  # fmt: skip
# OpenBMB's MiniCPM5 (abridged): ChatML turns, the tools listed in the system turn, each call a
# <function> element of <param> elements (a string holding <, & or a line break inside CDATA), the
# results in a user turn, each in a <tool_response> element.
MINICPM5_CHAT_TEMPLATE = (
    "{{- bos_token }}{%- if tools %}{{- '<|im_start|>system\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}"
    "{{- '# Tools\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' + tool | tojson }}{%- endfor %}"
    "{{- '\n</tools>\n\nWhen calling a function, return an XML object within <function ... </function> using:\n"
    "<function name=\"function-name\"><param name=\"param-name\">param-value</param></function>\n"
    "- If param-value contains <, & or newline characters, wrap it in a CDATA block: "
    "<param name=\"param-name\"><![CDATA[...]]></param><|im_end|>\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}"
    "{%- endif %}{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{- '<|im_start|>user\n' + message.content + '<|im_end|>\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\n' + (message.content or '') }}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if (loop.first and message.content) or not loop.first %}{{- '\n' }}{%- endif %}"
    "{%- set call = tool_call.function or tool_call %}{{- '<function name=\"' ~ call.name ~ '\">' }}"
    "{%- for name, value in (call.arguments or {}) | items %}{{- '<param name=\"' ~ name ~ '\">' }}"
    "{%- if value is string and ('<' in value or '&' in value or '\n' in value) %}"
    "{{- '<![CDATA[' + value + ']]>' }}{%- else %}{{- value }}{%- endif %}{{- '</param>' }}{%- endfor %}"
    "{{- '</function>' }}{%- endfor %}{{- '<|im_end|>\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
MINICPM5_TURNS = ChatStyle(MINICPM5_CHAT_TEMPLATE, ("<unk>", "<s>", "<|im_end|>", "<|im_start|>"), "<s>", "<|im_end|>",
                           ("<function", "<param", "</param>", "</function>"))  # fmt: skip
# Upstage's Solar Open (abridged): each message between <|begin|>role<|content|> and <|end|>.
SOLAR_OPEN_CHAT_TEMPLATE = (
    "{%- for m in messages -%}{{ '<|begin|>' + m.role + '<|content|>' + m.content + '<|end|>' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|begin|>assistant<|content|>' }}{%- endif -%}"
)
SOLAR_OPEN_TURNS = ChatStyle(SOLAR_OPEN_CHAT_TEMPLATE, ("<unk>", "<|startoftext|>", "<|endoftext|>", "<|begin|>",
                                                       "<|end|>", "<|content|>"), "<|startoftext|>", "<|end|>")
# GLM-4.7's (abridged: as 4.5's, but a call's parts without newlines between them).
GLM47_CHAT_TEMPLATE = GLM45_CHAT_TEMPLATE.replace("'\n<tool_call>' + tc.function.name + '\n'",
                                                  "'<tool_call>' + tc.function.name").replace(
    "{function-name}\n", "{function-name}").replace("</arg_key>\n<arg_value>", "</arg_key><arg_value>").replace(
    "</arg_value>\n", "</arg_value>")
GLM45_TURNS = ChatStyle(GLM45_CHAT_TEMPLATE, ("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>",
                                              "<|assistant|>", "<|observation|>", "<think>", "</think>",
                                              "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                                              "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
                        "[gMASK]", "<|user|>")  # fmt: skip
SEED_TURNS = ChatStyle(SEED_CHAT_TEMPLATE, ("<seed:pad>", "<seed:bos>", "<seed:eos>", "<seed:tool_call>",
                                            "</seed:tool_call>", "<seed:think>", "</seed:think>"),
                       "<seed:bos>", "<seed:eos>")  # fmt: skip
# NVIDIA's Nemotron Nano 2 (abridged): turns after special tokens of its own, the tools listed in the
# system turn, a turn's calls between <TOOLCALL> tags (text in this vocabulary), their results in a
# user turn between <TOOL_RESPONSE> tags; the generation prompt closes an empty thought.
NEMOTRON_H_CHAT_TEMPLATE = (
    "{%- set sys = messages | selectattr('role', 'equalto', 'system') | map(attribute='content') | join('\n') -%}"
    "{{ '<SPECIAL_10>System\n' + sys }}{%- if tools -%}"
    "{{ '\nYou can use the following tools to assist the user if required:\n<AVAILABLE_TOOLS>[' }}"
    "{%- for tool in tools -%}{{ (tool.function if tool.function is defined else tool) | tojson }}"
    "{{ ', ' if not loop.last else '' }}{%- endfor -%}{{ ']</AVAILABLE_TOOLS>\n\nIf you decide to call any "
    "tool(s), use the following format:\n<TOOLCALL>[{\"name\": \"tool_name1\", \"arguments\": "
    "\"tool_args1\"}]</TOOLCALL>' }}{%- endif -%}{{ '\n\n' }}"
    "{%- for message in messages if message['role'] != 'system' -%}"
    "{%- if message['role'] == 'user' -%}{{ '<SPECIAL_11>User\n' + message['content'] + '\n' }}"
    "{%- elif message['role'] == 'tool' -%}{{ '<SPECIAL_11>User\n<TOOL_RESPONSE>[' + message['content']"
    " + ']</TOOL_RESPONSE>\n\n' }}"
    "{%- else -%}{{ '<SPECIAL_11>Assistant\n' + (message['content'] or '') }}{%- if message['tool_calls'] -%}"
    "{{ '<TOOLCALL>[' }}{%- for call in message['tool_calls'] -%}{{ '{\"name\": \"' + call['function']['name']"
    " + '\", \"arguments\": ' }}{%- if call['function']['arguments'] is string -%}"
    "{{ call['function']['arguments'] }}{%- else -%}{{ call['function']['arguments'] | tojson }}{%- endif -%}"
    "{{ '}' + (', ' if not loop.last else '') }}{%- endfor -%}{{ ']</TOOLCALL>' }}{%- endif -%}"
    "{{ '\n<SPECIAL_12>\n\n' }}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<SPECIAL_11>Assistant\n<think></think>' }}{%- endif -%}"
)
NEMOTRON_H_TURNS = ChatStyle(NEMOTRON_H_CHAT_TEMPLATE, ("<unk>", "<s>", "<SPECIAL_10>", "<SPECIAL_11>",
                                                        "<SPECIAL_12>"), "<s>", "<SPECIAL_12>",
                             ("<think>", "</think>", "<TOOLCALL>", "</TOOLCALL>"))  # fmt: skip
LFM2_TURNS = ChatStyle(LFM2_CHAT_TEMPLATE, ("<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                            "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>",
                                            "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>"),
                       "<|startoftext|>", "<|im_end|>")  # fmt: skip
APERTUS_TURNS = ChatStyle(APERTUS_CHAT_TEMPLATE, ("<pad>", "<s>", "<|system_start|>", "<|system_end|>",
                                                 "<|developer_start|>", "<|developer_end|>", "<|user_start|>",
                                                 "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
                                                 "<|tools_prefix|>", "<|tools_suffix|>"), "<s>", "<|assistant_end|>")
# Cohere's Command R7B (abridged): turns between tokens of its own, the tools listed in the system
# turn; the model writes a turn's calls as a numbered list between <|START_ACTION|> and <|END_ACTION|>
# and its text between <|START_RESPONSE|> and <|END_RESPONSE|>; the results come back in a system
# turn. Its generation prompt closes an empty plan unless thinking is asked for, and is written
# whether asked for or not.
COMMAND_R7B_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- set ns = namespace(calls=0, results=0) -%}"
    "{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|># System Preamble\nYou are Command.' }}{%- if tools -%}"
    "{{ '\n## Available Tools\n```json\n[\n' }}{%- for tool in tools -%}"
    "{{ '    {\"name\": \"' + tool.function.name + '\", \"description\": \"' + tool.function.description"
    " + '\", \"parameters\": ' + tool.function.parameters | tojson + ', \"responses\": null}' }}"
    "{{ ',\n' if not loop.last else '\n' }}{%- endfor -%}{{ ']\n```' }}{%- endif -%}"
    "{%- if messages and messages[0].role == 'system' -%}{{ '\n# Developer Preamble\n' + messages[0].content }}"
    "{%- endif -%}{{ '<|END_OF_TURN_TOKEN|>' }}{%- for message in messages -%}"
    "{%- if message.role == 'system' and not loop.first -%}"
    "{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + message.content + '<|END_OF_TURN_TOKEN|>' }}"
    "{%- elif message.role == 'user' -%}"
    "{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + message.content + '<|END_OF_TURN_TOKEN|>' }}"
    "{%- elif message.role == 'assistant' -%}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}"
    "{%- if message.tool_calls -%}{{ '<|START_THINKING|>' + (message.reasoning_content or '') + '<|END_THINKING|>'"
    " + '<|START_ACTION|>[\n    ' }}{%- for call in message.tool_calls -%}"
    "{{ '{\"tool_call_id\": \"' + ns.calls | string + '\", \"tool_name\": \"' + call.function.name"
    " + '\", \"parameters\": ' + call.function.arguments | tojson + '}' }}{{ ',\n    ' if not loop.last }}"
    "{%- set ns.calls = ns.calls + 1 -%}{%- endfor -%}{{ '\n]<|END_ACTION|><|END_OF_TURN_TOKEN|>' }}"
    "{%- else -%}{{ '<|START_RESPONSE|>' + message.content + '<|END_RESPONSE|><|END_OF_TURN_TOKEN|>' }}{%- endif -%}"
    "{%- elif message.role == 'tool' -%}{%- if loop.previtem is not defined or loop.previtem.role != 'tool' -%}"
    "{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[' }}{%- else -%}{{ ',' }}{%- endif -%}"
    "{{ '\n    {\"tool_call_id\": \"' + ns.results | string + '\", \"results\": {\"0\": ' + message.content"
    " | tojson + '}, \"is_error\": null}' }}{%- set ns.results = ns.results + 1 -%}"
    "{%- if loop.nextitem is not defined or loop.nextitem.role != 'tool' -%}"
    "{{ '\n]<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>' }}{%- endif -%}{%- endif -%}{%- endfor -%}"
    "{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}"
    "{%- if not enable_thinking -%}{{ '<|START_THINKING|><|END_THINKING|>' }}{%- endif -%}"
)
COMMAND_R7B_TURNS = ChatStyle(COMMAND_R7B_CHAT_TEMPLATE, ("<PAD>", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>",
                                                         "<|START_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>",
                                                         "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|START_THINKING|>",
                                                         "<|END_THINKING|>", "<|START_ACTION|>", "<|END_ACTION|>",
                                                         "<|START_RESPONSE|>", "<|END_RESPONSE|>",
                                                         "<|START_TOOL_RESULT|>", "<|END_TOOL_RESULT|>"),
                              "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>")  # fmt: skip
# Moonshot's Kimi K2 (abridged): turns between special tokens of its own, the tools declared as JSON
# in a system turn of their own; each call between tokens, named and numbered (the conversation's
# calls counted), within a section of the turn; each result after "## Return of" the call's id.
KIMI_K2_CHAT_TEMPLATE = (
    "{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{%- endif -%}"
    "{%- set ns = namespace(calls=0, ids=[]) -%}{%- for message in messages -%}"
    "{%- if loop.first and message.role != 'system' -%}"
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>{%- endif -%}"
    "{%- if message.role == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- elif message.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- else -%}<|im_system|>{{ message.role }}<|im_middle|>{%- endif -%}"
    "{%- if message.role == 'assistant' and message.tool_calls -%}"
    "{{ message.content or '' }}<|tool_calls_section_begin|>{%- for call in message.tool_calls -%}"
    "{%- set id = 'functions.' + call.function.name + ':' + ns.calls | string -%}"
    "{%- set ns.calls = ns.calls + 1 -%}{%- set ns.ids = ns.ids + [id] -%}"
    "<|tool_call_begin|>{{ id }}<|tool_call_argument_begin|>{{ call.function.arguments"
    " if call.function.arguments is string else call.function.arguments | tojson }}<|tool_call_end|>"
    "{%- endfor -%}<|tool_calls_section_end|>"
    "{%- elif message.role == 'tool' -%}## Return of {{ ns.ids[0] if ns.ids else 'functions.unknown' }}\n"
    "{{ message.content }}{%- set ns.ids = ns.ids[1:] -%}"
    "{%- else -%}{{ message.content }}{%- endif -%}<|im_end|>{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)
KIMI_K2_TURNS = ChatStyle(KIMI_K2_CHAT_TEMPLATE, ("[PAD]", "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>",
                                                 "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
                                                 "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                                 "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                                                 "<|tool_call_end|>"), "[BOS]", "<|im_end|>")  # fmt: skip
# DeepSeek V3.1's (abridged): the system messages first, joined; turns after <｜User｜> and
# <｜Assistant｜>, an empty thought opening the answer; no tools listed; earlier calls between its tool
# tokens, each named and its arguments right after <｜tool▁sep｜>; results between tokens too, which
# the model then goes on answering. Its tokenizer's tool and role tokens are not special tokens
# (decoding keeps them), to check that path (R1's fixture has them special).
DEEPSEEK_V31_CHAT_TEMPLATE = (
    "{%- set thinking = enable_thinking if enable_thinking is defined else false -%}"
    "{%- set ns = namespace(system='', last_user=false, tool=false) -%}"
    "{%- for m in messages if m.role == 'system' -%}"
    "{%- set ns.system = ns.system + ('\n\n' if ns.system else '') + m.content -%}{%- endfor -%}"
    "{{ bos_token }}{{ ns.system }}{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<｜User｜>{{ m.content }}{%- set ns.last_user, ns.tool = true, false -%}"
    "{%- elif m.role == 'assistant' -%}{%- if ns.last_user -%}<｜Assistant｜><think></think>{%- endif -%}"
    "{%- if m.tool_calls -%}{{ m.content or '' }}<｜tool▁calls▁begin｜>{%- for c in m.tool_calls -%}"
    "<｜tool▁call▁begin｜>{{ c.function.name }}<｜tool▁sep｜>{{ c.function.arguments | tojson }}<｜tool▁call▁end｜>"
    "{%- endfor -%}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    "{%- else -%}{{ m.content.split('</think>', 1)[-1] }}<｜end▁of▁sentence｜>{%- endif -%}"
    "{%- set ns.last_user, ns.tool = false, false -%}"
    "{%- elif m.role == 'tool' -%}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>"
    "{%- set ns.last_user, ns.tool = false, true -%}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt and ns.last_user -%}<｜Assistant｜>{{ '<think>' if thinking else '<think></think>' }}"
    "{%- endif -%}"
)
DEEPSEEK_TOOL_TOKENS = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                        "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
                        "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>")  # fmt: skip
DEEPSEEK_V31_TURNS = ChatStyle(DEEPSEEK_V31_CHAT_TEMPLATE, ("<｜▁pad▁｜>", "<｜begin▁of▁sentence｜>",
                                                           "<｜end▁of▁sentence｜>"),
                               "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                               ("<｜User｜>", "<｜Assistant｜>", *DEEPSEEK_TOOL_TOKENS, "<think>",
                                "</think>"))  # fmt: skip
# DeepSeek-R1's distills' (abridged): the last system message first, no tools listed; each earlier
# call named after its type, its arguments a fenced JSON block; the results between tokens, the
# answer after them; the answer opens a thought, closed unless thinking is asked for (as llama.cpp
# keeps the template of DeepSeek-R1-Distill-Qwen). As published, the first call of the conversation
# alone opens the calls' section, and an assistant message whose content is not None is written
# as an answer of its own, after its calls. Here the tool tokens are special tokens (decoding drops
# them), to check that path too.
DEEPSEEK_R1_CHAT_TEMPLATE = (
    "{%- set ns = namespace(first=true, tool=false, output_first=true, system='') -%}"
    "{%- for m in messages if m.role == 'system' -%}{%- set ns.system = m.content -%}{%- endfor -%}"
    "{{ bos_token }}{{ ns.system }}{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}{%- set ns.tool = false -%}<｜User｜>{{ m.content }}{%- endif -%}"
    "{%- if m.role == 'assistant' and m.tool_calls -%}{%- set ns.tool = false -%}{%- for c in m.tool_calls -%}"
    "{%- if ns.first -%}<｜Assistant｜><｜tool▁calls▁begin｜>{%- set ns.first = false -%}{%- else -%}{{ '\n' }}"
    "{%- endif -%}"
    "<｜tool▁call▁begin｜>{{ c.type }}<｜tool▁sep｜>{{ c.function.name }}\n```json\n{{ c.function.arguments | tojson }}"
    "\n```<｜tool▁call▁end｜>{%- endfor -%}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>{%- endif -%}"
    "{%- if m.role == 'assistant' and m.content is not none -%}"
    "{%- if ns.tool -%}<｜tool▁outputs▁end｜>{{ m.content }}<｜end▁of▁sentence｜>{%- set ns.tool = false -%}"
    "{%- else -%}<｜Assistant｜>{{ m.content.split('</think>')[-1] }}<｜end▁of▁sentence｜>{%- endif -%}{%- endif -%}"
    "{%- if m.role == 'tool' -%}{%- set ns.tool = true -%}"
    "{%- if ns.output_first -%}<｜tool▁outputs▁begin｜>{%- set ns.output_first = false -%}{%- else -%}{{ '\n' }}"
    "{%- endif -%}"
    "<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>{%- endif -%}{%- endfor -%}"
    "{%- if ns.tool -%}<｜tool▁outputs▁end｜>{%- endif -%}"
    "{%- if add_generation_prompt and not ns.tool -%}{{ '<｜Assistant｜><think>\n' }}"
    "{{ '' if enable_thinking else '</think>' }}{%- endif -%}"
)
DEEPSEEK_R1_TURNS = ChatStyle(DEEPSEEK_R1_CHAT_TEMPLATE, ("<｜▁pad▁｜>", "<｜begin▁of▁sentence｜>",
                                                         "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                                                         *DEEPSEEK_TOOL_TOKENS),
                              "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", ("<think>", "</think>"))  # fmt: skip
# DeepSeek V3.2's (abridged): the tools listed as JSON after its instructions in the system prompt;
# each earlier call an <invoke> element of <parameter> elements under its "DSML" prefix, each saying
# whether its value is a string, after a blank line; the results between tags, after which the
# answer goes on, its empty thought written again.
DEEPSEEK_V32_CHAT_TEMPLATE = (
    "{%- set dsml = '｜DSML｜' -%}{%- set ns = namespace(system='', after_results=false) -%}"
    "{%- for m in messages if m.role == 'system' -%}"
    "{%- set ns.system = ns.system + ('\n\n' if ns.system else '') + m.content -%}{%- endfor -%}"
    "{%- if tools -%}{%- set ns.system = ns.system + ('\n\n' if ns.system else '') + '## Tools\n\nYou can invoke "
    "functions by writing a \"<' + dsml + 'function_calls>\" block. The \"string\" attribute should be set to "
    "\"true\" for string type parameters and \"false\" for other types.\n\n<functions>\n' -%}"
    "{%- for t in tools -%}{%- set ns.system = ns.system + (t.function | tojson) + '\n' -%}{%- endfor -%}"
    "{%- set ns.system = ns.system + '</functions>\n' -%}{%- endif -%}"
    "{{ bos_token }}{{ ns.system }}{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<｜User｜>{{ m.content }}<｜Assistant｜></think>{%- set ns.after_results = false -%}"
    "{%- elif m.role == 'assistant' -%}{{ '\n\n</think>' if ns.after_results else '' }}{{ m.content or '' }}"
    "{%- if m.tool_calls -%}{{ '\n\n<' + dsml + 'function_calls>\n' }}{%- for c in m.tool_calls -%}"
    "{{ '<' + dsml + 'invoke name=\"' + c.function.name + '\">\n' }}{%- for k, v in c.function.arguments.items() -%}"
    "{%- if v is string -%}{{ '<' + dsml + 'parameter name=\"' + k + '\" string=\"true\">' + v }}"
    "{%- else -%}{{ '<' + dsml + 'parameter name=\"' + k + '\" string=\"false\">' + v | tojson }}{%- endif -%}"
    "{{ '</' + dsml + 'parameter>\n' }}{%- endfor -%}"
    "{{ '</' + dsml + 'invoke>\n' }}{%- endfor -%}{{ '</' + dsml + 'function_calls>' }}{%- endif -%}"
    "<｜end▁of▁sentence｜>{%- set ns.after_results = false -%}"
    "{%- elif m.role == 'tool' -%}{{ '' if ns.after_results else '\n\n<function_results>' }}"
    "{{ '\n<result>' + m.content + '</result>' }}{%- if loop.last or loop.nextitem.role != 'tool' -%}"
    "{{ '\n</function_results>' }}{%- set ns.after_results = true -%}{%- endif -%}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt and ns.after_results -%}{{ '\n\n</think>' }}{%- endif -%}"
)
DEEPSEEK_V32_TURNS = ChatStyle(DEEPSEEK_V32_CHAT_TEMPLATE, DEEPSEEK_V31_TURNS.specials, DEEPSEEK_V31_TURNS.bos,
                               DEEPSEEK_V31_TURNS.eos, ("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"))
QWEN35_TURNS = ChatStyle(QWEN35_CHAT_TEMPLATE, CHATML.specials, CHATML.bos, CHATML.eos, ("<think>", "</think>"))
MISTRAL_TURNS = ChatStyle(MISTRAL_CHAT_TEMPLATE, ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]",
                                                 "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                                                 "[/TOOL_RESULTS]"), "<s>", "</s>")  # fmt: skip
# Hermes 2 Pro's (abridged): ChatML, and for a conversation with tools a template of its own (named
# "tool_use"), which lists them in the system turn and writes calls and results in the Hermes format.
HERMES2_PRO_TOOL_USE_TEMPLATE = (
    "{{ '<|im_start|>system\nYou are a function calling AI model. You are provided with function signatures "
    "within <tools></tools> XML tags.<tools> ' }}{%- for tool in tools -%}{{ tool | tojson }}{%- endfor -%}"
    "{{ ' </tools> For each function call return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-dict>}\n</tool_call><|im_end|>\n' }}"
    "{%- for m in messages -%}{%- if m.role != 'tool' and not m.tool_calls -%}"
    "{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}"
    "{%- elif m.tool_calls -%}{{ '<|im_start|>assistant' }}{%- for c in m.tool_calls -%}"
    "{{ '\n<tool_call>\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + c.function.arguments | tojson "
    "+ '}\n</tool_call>' }}{%- endfor -%}{{ '<|im_end|>\n' }}"
    "{%- else -%}{{ '<|im_start|>tool\n' if loop.previtem and loop.previtem.role != 'tool' else '' }}"
    "{{ '<tool_response>\n' + m.content + '\n</tool_response>' }}"
    "{{ '<|im_end|>\n' if loop.last or loop.nextitem.role != 'tool' else '\n' }}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)
# The templates a model names "tool_use" beside its chat template: any ChatML fixture carries Hermes
# 2 Pro's (its Llama's and Mistral's are these fixtures' own).
TOOL_USE_TEMPLATES = {"helium": HERMES2_PRO_TOOL_USE_TEMPLATE}
# Each family's template, with its special tokens, where it is not plain ChatML (Qwen2.5's and
# Gemma 3's as published; the Gemma 3 270M firmware ships the latter too).
CHAT_STYLES: dict[str, ChatStyle] = {
    "qwen2": ChatStyle(QWEN25_CHAT_TEMPLATE, CHATML.specials, CHATML.bos, CHATML.eos),  # takes tools
    "mistral": MISTRAL_TURNS,
    "mixtral": MISTRAL_TURNS,  # Mixtral 8x22B's instruct template is Mistral 7B v0.3's
    # Mistral Small 3.x (the mistral3_vl fixture): its own call format (appliance/engine/tools.py).
    "mistral3": ChatStyle(MISTRAL_SMALL_CHAT_TEMPLATE, ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]",
                                                        "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                                                        "[TOOL_CALLS]", "[ARGS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
                          "<s>", "</s>"),
    "phi3": ChatStyle(PHI3_CHAT_TEMPLATE, ("<unk>", "<s>", "<|endoftext|>", "<|system|>", "<|user|>",
                                           "<|assistant|>", "<|end|>"), "<s>", "<|end|>"),
    "gemma4": GEMMA4_TURNS,
    "gemma3": GEMMA_TURNS,  # and Gemma 3's other fixtures (chat_style reads the family before "_")
    # Gemma and Gemma 2 take turns as Gemma 3 does.
    "gemma": GEMMA_TURNS,
    "gemma2": GEMMA_TURNS,
    "gemma3n": GEMMA_TURNS,  # Gemma 3n's are Gemma 3's
    # SmolLM3 thinks aloud between tags of its vocabulary, as Qwen3 does (appliance/engine/reasoning.py).
    "smollm3": ChatStyle(THINKING_CHAT_TEMPLATE, CHATML.specials, CHATML.bos, CHATML.eos, ("<think>", "</think>")),
    # Llama 3's headers, and its own JSON for tool calls (appliance/engine/tools.py).
    "llama_rope_llama3": ChatStyle(LLAMA3_CHAT_TEMPLATE, ("<|finetune_right_pad_id|>", "<|begin_of_text|>",
                                                          "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                                   "<|begin_of_text|>", "<|eot_id|>"),
    # gpt-oss writes harmony's messages; `<|end|>` ends one, `<|return|>` the answer.
    # Qwen3.5 writes each argument of a call as an element of its own (appliance/engine/tools.py).
    "qwen3_5": QWEN35_TURNS,
    "qwen3_5_moe": QWEN35_TURNS,
    # LFM2 (and its mixture-of-experts fixture) and LFM3: ChatML within their own special tokens.
    "lfm2": LFM2_TURNS,
    "lfm3": LFM2_TURNS,
    "seed_oss": SEED_TURNS,
    "glm4_moe": GLM45_TURNS,
    "glm4_moe_lite": replace(GLM45_TURNS, template=GLM47_CHAT_TEMPLATE),
    # Apertus lists a turn's calls between its own tokens, each keyed by its tool's name.
    "apertus": APERTUS_TURNS,
    # Command R7B lists a turn's calls, numbered, between its own tokens (the cohere2 fixture).
    "cohere2": COMMAND_R7B_TURNS,
    "minimax_m2": MINIMAX_M2_TURNS,
    "solar_open": SOLAR_OPEN_TURNS,
    "minicpm5_moe": MINICPM5_TURNS,
    # Kimi K2 (DeepSeek V3's architecture) calls tools in its own format, numbered.
    "deepseek_v3": KIMI_K2_TURNS,
    # DeepSeek's own: V3.1's on its architecture's smallest fixture, and R1's distills' on a Llama as
    # wide as DeepSeek-R1-Distill-Llama-8B's heads.
    "deepseek_v2": DEEPSEEK_V31_TURNS,
    "llama_wide": DEEPSEEK_R1_TURNS,
    "minicpm3": DEEPSEEK_V32_TURNS,  # (its latent attention is DeepSeek's)
    "hy_v3": HY3_TURNS,
    "llava": APRIEL_TURNS,  # (Apriel 1.5's and 1.6's are LLaVA's, a Pixtral beside a Mistral)
    "nemotron_h": NEMOTRON_H_TURNS,
    "nemotron_h_moe": NEMOTRON_H_TURNS,
    "gpt_oss": ChatStyle(HARMONY_CHAT_TEMPLATE, ("<|endoftext|>", "<|startoftext|>", "<|start|>", "<|channel|>",
                                                 "<|message|>", "<|end|>", "<|return|>", "<|constrain|>", "<|call|>"),
                         "<|startoftext|>", "<|return|>"),
}  # fmt: skip


# Parameters transformers initializes to zeros, made random in these fixtures so the export's
# handling of them shows (a Granite SWA's sinks; Seed-OSS's biases, all of its projections').
FALCON_RANDOMIZED = (".bias", "layernorm.weight", "ln_attn.weight", "ln_mlp.weight", "ln_f.weight")
# Llama 4's experts (transformers makes them 0), queries and keys (where its norms show) and shared expert.
LLAMA4_RANDOMIZED = ("experts.gate_up_proj", "experts.down_proj", "q_proj.weight", "k_proj.weight",
                     "shared_expert.gate_proj.weight", "shared_expert.up_proj.weight")
GPT2_RANDOMIZED = (".bias", "ln_1.weight", "ln_2.weight", "ln_f.weight", "wpe.weight", "c_attn.weight")
RANDOMIZED: dict[str, tuple[str, ...]] = {"granite_swa": ("self_attn.sinks",), "seed_oss": ("_proj.bias",),
                                          # (drawn wide: at the usual init its rotation hardly shows)
                                          "minicpm": ("q_proj.weight", "k_proj.weight"),
                                          "gemma2": ("q_proj.weight", "k_proj.weight"),
                                          "hyperclovax": ("post_norm1.weight", "post_norm2.weight"),
                                          "hyperclovax_plain": ("_proj.bias",),
                                          "vaultgemma": ("q_proj.weight", "k_proj.weight", "layernorm.weight",
                                                         "norm.weight"),
                                          "ernie4_5": ("_proj.bias",),
                                          "stablelm": ("_proj.bias", "layernorm.bias", "norm.bias"),
                                          "stablelm_3b": ("layernorm.bias", "norm.bias"),
                                          "granite4_h": ("mamba.D", "mamba.dt_bias", "mamba.norm.weight",
                                                         "conv1d.bias", "q_proj.weight", "k_proj.weight"),
                                          "granite4_moe": ("experts.gate_up_proj", "experts.down_proj"),
                                          "lfm2_moe": ("expert_bias",),
                                          "granitemoe": ("experts.gate_up_proj", "experts.down_proj"),
                                          "granitemoeshared": ("experts.gate_up_proj", "experts.down_proj"),
                                          "granitemoe_swa": ("experts.gate_up_proj", "experts.down_proj",
                                                             "self_attn.sinks"),
                                          "jais2": ("_proj.bias", "layernorm.bias", "norm.bias"),
                                          "starcoder2": ("_proj.bias", "c_fc.bias", "layernorm.bias", "norm.bias"),
                                          "apertus": ("act_fn.alpha_p", "act_fn.alpha_n"),
                                          # Biases, LayerNorms' and the position table (initialized
                                          # near 0, where a misplaced row would hardly show).
                                          "gpt2": GPT2_RANDOMIZED, "gpt_bigcode": GPT2_RANDOMIZED,
                                          "opt": (".bias", "embed_positions.weight"),
                                          "gpt_neox": (".bias", "layernorm.weight", "layer_norm.weight"),
                                          # (and the queries and keys, whose scores
                                          # would hardly show how their heads are turned)
                                          "gptj": (".bias", "ln_1.weight", "ln_f.weight", "q_proj.weight",
                                                   "k_proj.weight"),
                                          "codegen": (".bias", "ln_1.weight", "ln_f.weight", "qkv_proj.weight"),
                                          "falcon": FALCON_RANDOMIZED, "falcon_new": FALCON_RANDOMIZED,
                                          "bloom": (".bias", "layernorm.weight", "ln_f.weight"),
                                          "mpt": ("norm_1.weight", "norm_2.weight", "norm_f.weight"),
                                          "glm4v": ("_proj.bias", "layernorm.weight"),
                                          "glm4v_moe": ("_proj.bias", "gate.weight", "e_score_correction_bias"),
                                          # Each layer's output scale (published models' are not 1).
                                          "gemma4": ("layer_scalar",), "gemma4_e": ("layer_scalar",),
                                          "gemma4_text": ("layer_scalar",), "gemma4_unified": ("layer_scalar",),
                                          "gemma4_unified_text": ("layer_scalar",),
                                          # AltUp's output scale (transformers makes it 0) and its
                                          # coefficients (near 0: the streams would hardly mix).
                                          "gemma3n_text": ("correct_output_scale", "correction_coefs.weight",
                                                           "prediction_coefs.weight"),
                                          "cohere": ("q_proj.weight", "k_proj.weight"),
                                          "cohere2": ("q_proj.weight", "k_proj.weight"),
                                          "jamba": ("mamba.D", "dt_proj.bias", "layernorm.weight", "conv1d.bias",
                                                    "q_proj.weight", "k_proj.weight", "experts.gate_up_proj",
                                                    "experts.down_proj"),
                                          "falcon_h1": ("mamba.D", "mamba.dt_bias", "mamba.norm.weight",
                                                        "conv1d.bias", "q_proj.weight", "k_proj.weight"),
                                          "nemotron_h": ("mixer.D", "mixer.dt_bias", "mixer.norm.weight",
                                                         "conv1d.bias", "q_proj.weight", "k_proj.weight",
                                                         "up_proj.bias", "down_proj.bias"),
                                          # (the router's bias a buffer: drawn from 0.5 to 1.5, as much as
                                          # the scores it is added to, so it changes which experts are chosen)
                                          "glm4_moe": ("_proj.bias", "gate.weight", "e_score_correction_bias"),
                                          "solar_open": ("gate.weight", "e_score_correction_bias"),
                                          "ling2": ("gate.weight", "e_score_correction_bias", "norm.weight"),
                                          "minicpm5_moe": ("gate.weight", "e_score_correction_bias"),
                                          "dots1": ("gate.weight", "e_score_correction_bias", "norm.weight"),
                                          "hunyuan_moe": ("layernorm.weight",),
                                          "minimax_m2": ("gate.weight", "e_score_correction_bias", "norm.weight"),
                                          "afmoe": ("expert_bias", "norm.weight", "layernorm.weight"),
                                          "hy_v3": ("e_score_correction_bias", "norm.weight"),
                                          "flex_olmo": ("norm.weight", "layernorm.weight"),
                                          "exaone_moe": ("gate.weight", "e_score_correction_bias", "norm.weight"),
                                          "glm4_moe_lite": ("a_layernorm.weight", "gate.weight",
                                                            "e_score_correction_bias"),
                                          "deepseek_v3": ("a_layernorm.weight", "gate.weight",
                                                          "e_score_correction_bias"),
                                          "deepseek_v2": ("a_layernorm.weight", "gate.weight"),
                                          "ernie4_5_moe": ("gate.weight", "e_score_correction_bias"),
                                          "llama4": LLAMA4_RANDOMIZED, "llama4_vl": LLAMA4_RANDOMIZED,
                                          "nemotron_h_moe": ("mixer.D", "mixer.dt_bias", "mixer.norm.weight",
                                                             "conv1d.bias", "q_proj.weight", "k_proj.weight",
                                                             "gate.weight", "e_score_correction_bias")}


def chat_style(arch: str) -> ChatStyle:
    return CHAT_STYLES.get(arch, CHAT_STYLES.get(arch.partition("_")[0], CHATML))


def make_tiny_hf(out_dir: Path, seed: int = 0, arch: str = "llama") -> None:
    import pydoc_data.topics

    import torch
    import transformers
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    config_class, model_class, extra = ARCHITECTURES[arch]
    style = chat_style(arch)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=list(style.specials), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(sorted(pydoc_data.topics.topics.values()), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in style.added])
    unk = style.specials[0]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=style.bos, eos_token=style.eos, unk_token=unk, pad_token=unk,
    )  # fmt: skip
    fast.chat_template = ({"default": style.template, "tool_use": TOOL_USE_TEMPLATES[arch]}
                          if arch in TOOL_USE_TEMPLATES else style.template)  # fmt: skip
    fast.save_pretrained(out_dir)
    torch.manual_seed(seed)
    shape: dict[str, object] = dict(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=tok.token_to_id(style.bos), eos_token_id=tok.token_to_id(style.eos),
        pad_token_id=tok.token_to_id(unk), tie_word_embeddings=False,
    )  # fmt: skip
    text = extra.get("text_config")
    # Gemma 4 E's and Gemma 3n's per-layer inputs: a row per token of the vocabulary.
    if (text if isinstance(text, dict) else extra).get("hidden_size_per_layer_input"):
        shape["vocab_size_per_layer_input"] = shape["vocab_size"]
    if isinstance(text, dict):  # a multimodal checkpoint: the tiny shape is its language model's
        config = getattr(transformers, config_class)(**{**extra, "text_config": {**shape, **text}})
    else:
        config = getattr(transformers, config_class)(**{**shape, **extra})
    model = getattr(transformers, model_class)(config)
    # Random init leaves tiny logits; scale the head so greedy decoding is not a sea of near-ties.
    # Rows past the tokenizer (a multimodal model's image tokens, which a prompt never holds) are
    # zeroed, so greedy decoding never picks them either: one of 512 random logits is above zero.
    with torch.no_grad():
        # What transformers initializes to zeros or ones, where it is checked; a buffer is a scale
        # (Gemma 4's layer scalars), kept near one (six small ones in a row leave logits whose
        # rounding alone is 1e-4 apart).
        for name, weight in model.named_parameters():
            if name.endswith(RANDOMIZED.get(arch, ())):
                weight.normal_()
        for name, weight in model.named_buffers():  # (GPT-BigCode's causal mask, a "bias" too, is not a scale)
            if name.endswith(RANDOMIZED.get(arch, ())) and weight.is_floating_point():
                weight.uniform_(0.5, 1.5)
        head = model.get_output_embeddings().weight  # (Llama 4's image-and-text model keeps it in its language model)
        head.mul_(8.0)
        head[tok.get_vocab_size() :] = 0.0
    model.save_pretrained(out_dir)
    if arch in WEIGHTS_AS_PUBLISHED:
        _rewrite_weights(out_dir / "model.safetensors", WEIGHTS_AS_PUBLISHED[arch])
    if config_class in AS_PUBLISHED or arch in PUBLISHED_AS:
        saved = json.loads((out_dir / "config.json").read_text())
        saved = AS_PUBLISHED[config_class](saved) if config_class in AS_PUBLISHED else saved
        if arch in PUBLISHED_AS:  # (save_pretrained names the class it saved)
            saved["architectures"] = [PUBLISHED_AS[arch]]
        (out_dir / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    if arch in LAYOUTS_AS_PUBLISHED:
        LAYOUTS_AS_PUBLISHED[arch][1](out_dir, config)


def _fingerprint(arch: str) -> str:
    """What the tiny model of `arch` is made from: a cached one made from something else is stale.
    (The Llama fixture keeps its plain names: it has not changed since they were chosen.)"""
    if arch == "llama":
        return ""
    spec = repr((ARCHITECTURES[arch], chat_style(arch), *((RANDOMIZED[arch],) if arch in RANDOMIZED else ()),
                 *((TOOL_USE_TEMPLATES[arch],) if arch in TOOL_USE_TEMPLATES else ()),
                 *((("architectures", PUBLISHED_AS[arch]),) if arch in PUBLISHED_AS else ()),
                 *((inspect.getsource(AS_PUBLISHED[ARCHITECTURES[arch][0]]),)
                   if ARCHITECTURES[arch][0] in AS_PUBLISHED else ()),
                 *((inspect.getsource(WEIGHTS_AS_PUBLISHED[arch]),)
                   if arch in WEIGHTS_AS_PUBLISHED else ()),
                 *((inspect.getsource(LAYOUTS_AS_PUBLISHED[arch][1]), inspect.getsource(_kept_as_saved))
                   if arch in LAYOUTS_AS_PUBLISHED else ())))  # fmt: skip
    return "-" + hashlib.sha256(spec.encode()).hexdigest()[:8]


def tiny_hf_dir(arch: str = "llama") -> Path:
    """The Hugging Face folder of the fixture (the reference for correctness tests)."""
    import shutil

    from firmware.toolchain.paths import cache_dir

    d = cache_dir() / ("tiny-hf" if arch == "llama" else f"tiny-hf-{arch}{_fingerprint(arch)}")
    if not (d / "model.safetensors").is_file():
        tmp = d.with_name(f".{d.name}-tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        make_tiny_hf(tmp, arch=arch)
        tmp.rename(d)
    return d


def tiny_bundle(arch: str = "llama") -> Path:
    name = TINY_NAME if arch == "llama" else f"tiny-{arch}"

    def make(out: Path) -> None:
        build(tiny_hf_dir(arch), out, BuildOptions(
            precision="fp32", target="cpu", name=name, version="0.1.0",
            layer=LayerConstants(max_tokens_per_shard=64),
        ))  # fmt: skip

    return ensure_bundle(name + _fingerprint(arch), make)
