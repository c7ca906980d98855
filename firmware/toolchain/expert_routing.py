"""Which families' experts the export routes how: read by the builder's fixes (builder_shim), which
build each family's routing graph, and by the build's refusals (build.expert_choice_refusal), which
turn away what those graphs do not compute, so that the two name the same families."""

from __future__ import annotations

# Families whose attention is multi-head latent attention (DeepSeek V2's), built as plain multi-head
# attention over heads as wide as its queries' or its values' (builder_shim.mla_heads); their experts
# route as GLM-4.5's (sigmoid scores plus a correction bias) but DeepSeek V2's (the softmax's top k as
# they are, as OLMoE's, scaled by routed_scaling_factor).
MLA_FAMILIES = ("glm4_moe_lite", "deepseek_v3", "deepseek_v2", "youtu", "minicpm3")
# Experts chosen by sigmoid scores plus a correction bias, mixed by those scores
# (builder_shim._score_routed_experts; Nemotron 3's too, where its layers have experts): GLM-4.5's,
# GLM-4.7-Flash's, DeepSeek V3's, Solar Open's (GLM-4.5's experts under a Llama's attention),
# dots.llm1's (under Qwen3's), K-EXAONE's, MiniMax-M2's, Arcee's Trinity's, Hy3's and MiniCPM5's.
SIGMOID_ROUTED_FAMILIES = ("glm4_moe", "glm4_moe_lite", "deepseek_v3", "solar_open", "dots1", "exaone_moe",
                           "minimax_m2", "afmoe", "hy_v3", "minicpm5_moe")
# ERNIE 4.5's experts are chosen from the softmax's scores plus a correction bias, and mixed by those
# scores scaled to sum to 1: the same routing graph with a softmax for the sigmoid.
SOFTMAX_BIASED_FAMILIES = ("ernie4_5_moe",)
# The families of DeepSeek's routing, whose configs may choose experts in groups (n_group, topk_group)
# (the dense ones, Youtu-LLM and MiniCPM3, have no such keys).
GROUPED_CHOICE_FAMILIES = tuple(dict.fromkeys((*SIGMOID_ROUTED_FAMILIES, *MLA_FAMILIES)))
