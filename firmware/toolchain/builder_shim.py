"""Runs onnxruntime-genai's model builder with the fixes transformers 5 made necessary.

onnxruntime-genai 0.18's builder reads transformers 4's config fields; transformers 5 moved or
reshaped several of them. Each fix below is named, says what breaks without it, and has a test
that fails without it (tests/engine/test_architectures.py builds every architecture through here;
tests/firmware/test_builder_shim.py checks each fix on a config).

- `rope_theta`: transformers 5 keeps RoPE settings only in `config.rope_parameters`; the builder
  reads `config.rope_theta` and, finding none, silently uses 10000. For SmolLM2 (theta 100000)
  that gives a model that loads and answers nonsense. A property answers `rope_theta` from
  `rope_parameters` when the config has no value of its own.

The others are fix-ups of the config object the builder loads (`_fix_config`); the builder loads
the PyTorch weights with a config of their own, which stays as transformers made it:

- `phi3_default_rope`: a Phi-3 config whose `max_position_embeddings` differs from
  `original_max_position_embeddings` sends the builder to its LongRoPE class, which then fails
  with KeyError 'multi_cache' unless the RoPE type is "longrope". transformers ignores
  `original_max_position_embeddings` for any other RoPE type, so it is set equal to the context
  (the plain Phi-3 class, which is what transformers computes).
- `longrope_type`: transformers 5 names the RoPE type `rope_type` only; the builder reads the
  LongRoPE type (Phi-3.5-mini, Phi-3-*-128k) from transformers 4's `type` (KeyError 'type'). It
  is copied. (LongRoPE switches from the short to the long factors once a run's sequence passes
  the original context: a prefill split there (shards, a reused prefix) keeps the earlier keys
  rotated by the short factors, as transformers' cached generation does, where one pass would
  rotate them all by the long ones.)
- `gemma3_rope_per_layer_type`: transformers 5 stores Gemma 3's RoPE as one entry per layer type
  (`{"full_attention": {...}, "sliding_attention": {...}}`); the builder expects one flat entry
  (KeyError 'rope_type') and the local layers' base in `rope_local_base_freq` (transformers 4's
  name). The global entry becomes the flat one and the sliding entry's theta the local base.
- `norm_epsilon`: the builder reads the norms' epsilon from `rms_norm_eps` only, and takes 1e-6
  where a config names it otherwise: Phi-2's `layer_norm_eps` and Nemotron's `norm_eps` (1e-5
  both). A tiny Phi-2 was 0.05 off transformers' logits and a Nemotron 0.2, from the first
  position; with the config's own epsilon, 2e-6 and 3e-6.
- `attention_softcap_as_transformers`: the builder caps any family's attention logits where its
  config names `attn_logit_softcapping`; transformers caps Gemma 2's only (Gemma 3's config takes
  the field, and its attention never reads it). A tiny Gemma 3 naming a cap of 5 was 0.56 off
  transformers; the cap is dropped for every family but Gemma 2.
- `sliding_window_layers`: the builder applies `sliding_window` only to layers that
  `config.layer_types` marks "sliding_attention", and gives a config without `layer_types`
  (Mistral's) full attention everywhere: a Mistral with a window of 16 was off by 1.8 in the
  logits at 57 tokens. Every layer is marked sliding, as transformers runs it.

Four fixes are to the builder's layers:

- `gemma_embedding_scale`: Gemma multiplies its embeddings by sqrt(hidden_size); the builder
  rounds that to two decimals (25.3 for Gemma 3 270M's 25.2982, 7e-5 off), which moved the
  270M model's fp32 logits by up to 2.4e-3 from transformers'. The exact value is used.
- `gpt_oss_layer_types`: the builder's gpt-oss class slides every even layer whatever the config's
  `layer_types` say (the published models' alternation, sliding first); a tiny gpt-oss whose
  layers are all global was 2.6 off transformers. The builder's own reading of `layer_types`, which
  its other classes use, applies.
- `olmo_layer_norm`: OLMo normalizes with a LayerNorm of no weights (mean-centred, epsilon 1e-5);
  the builder's OLMo class exports it as an RMS norm with the default epsilon 1e-6, and a tiny
  OLMo's logits were up to 1.0 off transformers' from the first position. Its norms are now
  LayerNorm with OLMo's epsilon.
- `smollm3_no_rope_layers`: SmolLM3 leaves RoPE out of every fourth layer; the builder's SmolLM3
  class turns the attention's own rotation off there but then asks for a rotation beside it,
  from a `position_ids` input the graph does not have (KeyError 'position_ids': no SmolLM3 could
  be built). Those layers now have no rotation at all, as in transformers.

Three more make RoPE scaling rotate as transformers does (a tiny model of each is in the
architecture matrix):

- `rope_types_past_llama3`: the builder's Llama class (Llama, Nemotron, SmolLM3) reads Llama 3's
  scaling and drops any other: a Llama with linear scaling (factor 4) was 0.03 off transformers'
  logits from the second position. Other types go to the builder's shared reader, as for the
  other families.
- `yarn_as_transformers`: the builder's YaRN divided by zero where a config leaves `beta_fast` and
  `beta_slow` to their defaults (Qwen2.5's and Qwen3's documented YaRN settings do), and it
  neither rounds the blend's range out to whole dimensions (transformers' `truncate`, on by
  default) nor takes a config's `attention_factor`. The frequencies and the magnitude scale are
  now transformers' own (`ROPE_INIT_FUNCTIONS["yarn"]`).
- `gemma3_plain_local_rope`: Gemma 3 scales only its global layers' RoPE (linear, factor 8, in
  Gemma 3 4B, 12B and 27B); the builder made the local layers' table with the same scaling, and
  a tiny Gemma 3 with linear scaling was up to 4.9 off. The local table is plain RoPE at the
  local base.

And one to how the builder finds the LM head:

- `lm_head_is_the_model_s`: the builder takes any linear layer with as many outputs as the
  vocabulary for the LM head, also one inside a decoder layer: a Llama whose MLP is as wide as its
  vocabulary (512 both) had its logits computed from a layer's MLP input, 3.1 off transformers
  from the first position. Only the model's own `lm_head` is taken.

And four to Qwen3.5:

- `qwen35_text_positions`: the builder gives Qwen3.5 a position input of three rows (multimodal
  RoPE: time, height and width), then hands it to RoPE operators that take one: no Qwen3.5 export
  could run a single token. Text has the same position on all three, which is plain RoPE, so the
  input is the usual one row per sequence.
- `qwen35_rope_as_text`: its published configs name multimodal RoPE's sections (`mrope_section`:
  11, 11 and 10 of the 32 rotated pairs, interleaved), from which the builder writes an operator
  that takes positions of three rows, which qwen35_text_positions gave it one of: the export was
  refused at its load check ("position_ids is expected to have shape (3, ...)"). Text has the same
  position on all three rows, plain RoPE over the same frequencies, so the sections are left out.
  The tiny fixtures name them as the published configs do (1.9e-6 from transformers).
- `qwen3_5_text_as_conditional`: its language model saved alone (Qwen3_5ForCausalLM, as a GGUF
  file of it dequantizes) goes to the same classes, which the builder names only by the
  image-and-text checkpoints' architectures.
- `qwen35_l2norm_epsilon`: its linear-attention layers normalize queries and keys as
  x / sqrt(sum(x^2) + 1e-6); the builder's LpNormalization has no epsilon, and a tiny Qwen3.5 was
  4e-3 off transformers' logits from the first position (1.4e-6 with transformers' epsilon set to
  0). The norm is spelt out with the epsilon.

Qwen3's mixture-of-experts checkpoints (Qwen3MoeForCausalLM: Qwen3-30B-A3B, the Qwen3-Coder ones)
have no class of their own in the builder ("model is not currently supported"):

- `qwen3_moe_as_qwen3`, `qwen3_moe_layers`: the config is sent to the builder's Qwen3 class,
  which gains their layers where a config has experts: the router (softmax, the top k, scaled to
  sum to 1 where `norm_topk_prob`: the MoE operator's own routing) and the fused SwiGLU experts,
  as the builder's Qwen3.5 MoE class writes them without its shared expert; a layer that
  `mlp_only_layers` leaves dense keeps its MLP. A tiny one matches transformers to 1.1e-6.

Tencent's HunYuan mixtures of experts (HunYuanMoEV1ForCausalLM: Hunyuan-A13B) have none either:

- `hunyuan_moe_as_dense`, `hunyuan_moe_layers`: the config is sent to the builder's dense HunYuan
  class (query and key norms after RoPE), which gains their layers: the router (its weight
  `gate.wg`; softmax, the top k scaled to sum to 1) and fused SwiGLU experts beside a shared MLP
  added ungated (_layer_moe). A tiny one matches transformers to 1.9e-6.

OLMo 2 and 3, EXAONE 4 and GLM-4 (Olmo2ForCausalLM, Olmo3ForCausalLM, Exaone4ForCausalLM,
Glm4ForCausalLM) have no class in the builder either:

- `post_norm_as_llama`, `post_norm_layers`: the config is sent to the builder's Llama class,
  which gains their layers: no norm before the attention or the MLP, an RMS norm of each one's
  output before it joins the residual stream, and RMS norms of the queries and keys, over the
  whole projection in OLMo's (Qwen3's and EXAONE's are per head). OLMo 3's sliding layers rotate
  by plain RoPE where its global layers' is scaled (YaRN, as published): two tables, as for
  Gemma 3 (a tiny OLMo 3 was 0.67 off with one); EXAONE 4's hybrids rotate their sliding layers
  only (global NoPE). GLM-4 norms before each sublayer as well, and rotates half of each head by
  pairs of neighbouring dimensions (interleaved; 0.078 off rotated by halves). Tiny ones match
  transformers to 1.2e-6 (OLMo 2), 1.5e-6 (OLMo 3), 1.9e-6 (EXAONE 4) and 2.9e-6 (GLM-4).
  Arcee's (ArceeForCausalLM, AFM) are sent there too: a Llama whose MLP has no gate (up, ReLU
  squared, down), which the class now builds as Nemotron's class does, but with each
  projection's bias where it has one; a tiny one, 1.2e-6. So are ByteDance's Seed-OSS (a Llama
  with biased projections, 9.5e-7), Stability's StableLM 2 (LayerNorms with biases where a Llama
  has RMS norms, a quarter of each head rotated: 2.4e-6; 7 off with RMS norms), Mistral's
  Ministral 8B (a Mistral whose layers slide but every fourth: 1.7e-6) and G42's Jais 2 (LayerNorms,
  biases everywhere, Arcee's MLP: 1.2e-6; 3.5 off with the MLP's biases dropped, as Nemotron's
  class drops them). Swiss AI's Apertus goes through post_norm_layers' class as a Llama with its
  norms renamed, per-head query and key norms (1.2 off without) and Arcee's MLP whose activation,
  xIELU, has learnt parameters per layer, written out of ONNX's elementwise operators (0.5 off
  with them unsoftplus'd): 1.5e-6, int8 0.048. AllenAI's OLMoE (OlmoeForCausalLM) is a Llama with
  OLMo 2's query and key norms over the whole projection and, in place of the MLP, SwiGLU experts
  as Granite's, their routing the softmax's top k, scaled to sum to 1 where `norm_topk_prob`: 1.9e-6
  (0.36 off scaled where it is not), int8 0.26. Qwen2-MoE (Qwen2MoeForCausalLM: Qwen1.5-MoE-A2.7B,
  Qwen2-57B-A14B) is a Llama with Qwen2's biased projections and the same experts beside a shared
  expert, which a sigmoid of its own gates (as the builder's Qwen3.5 MoE class writes it); the layers
  `mlp_only_layers` or `decoder_sparse_step` leave dense keep their MLP: 2.1e-6 (0.43 off without
  the shared expert), int8 0.14. GLM-4.5, 4.6 and 4.7 (Glm4MoeForCausalLM) are a Llama with biased
  query, key and value projections, per-head query and key norms where the config asks, half of each
  head rotated by halves and, after its dense leading layers, experts routed as Nemotron 3's
  (`_score_routed_experts`: the top k of sigmoid scores plus a correction bias, mixed by the
  scores scaled to sum to 1, then by routed_scaling_factor), SwiGLU ones, beside a shared expert
  added ungated: 1.2e-6, int8 0.040. GLM-4.7-Flash (Glm4MoeLiteForCausalLM) and DeepSeek V3
  (DeepseekV3ForCausalLM: Moonlight, Kimi K2, experts in one group) have the same experts and
  DeepSeek's multi-head latent attention, which the class builds as plain multi-head attention
  (`mla_heads`, `_mla_as_heads`, `_mla_input_proj`): the queries with each head's rotated part
  first, the keys and values projected from the rotated key and the normed latent side by side,
  every head as wide as the queries or the values, whichever is wider (zeros padding the other),
  neighbouring pairs rotated, the scores scaled by the queries' width (and YaRN's mscale): 1.7e-6
  and 1.8e-6, int8 0.040 and 0.058. DeepSeek V2 (DeepseekV2ForCausalLM: DeepSeek-V2-Lite) has the
  same attention and OLMoE's experts (the softmax's top k as they are) scaled by its
  routed_scaling_factor, folded into them (`_routed_scale_folded`), beside shared experts: 1.2e-6.
  Llama 4 (Llama4ForCausalLM, and Llama4ForConditionalGeneration's language model alone) rotates
  neighbouring pairs in three layers of four, which norm each query and key head without a weight
  (`_llama4_layers_named`), attend within chunks (`llama4_chunks_as_full`: served inside one,
  build.exact_positions), and whose experts take the stream scaled by the sigmoid of the one
  expert's logit (`_llama4_moe`), a shared expert beside them: 1.9e-6. ERNIE 4.5's mixtures of
  experts (Ernie4_5_MoeForCausalLM: ERNIE-4.5-21B-A3B) rotate neighbouring pairs and route as
  GLM-4.5's but by the softmax's scores (`_softmax_scores`), their sum clamped at moe_norm_min: 4.8e-6.
  The same sigmoid-routed experts serve Solar Open (under a Llama's attention: 9.5e-7), dots.llm1
  (Qwen3's: 1.7e-6), K-EXAONE (ExaoneMoeForCausalLM: EXAONE 4's attention, pre-norm layers: 1.4e-6),
  MiniMax-M2 (OLMo 2's whole-projection norms, half of each head rotated, the bias the block's:
  1.9e-6) and Arcee's Trinity (AfmoeForCausalLM: sandwich norms as GLM-4's, the attention's output
  gated by a sigmoid, RoPE in its sliding layers alone, the bias the block's, µP's embedding scale:
  1.7e-6), Tencent's Hy3 (HYV3ForCausalLM: per-head norms, the block's bias, router_scaling_factor:
  1.4e-6) and OpenBMB's MiniCPM5 MoE (its fused query-and-gate projection split into the query and
  Trinity's output gate, `_query_and_gate_split`: 7.2e-7); Youtu-LLM has DeepSeek's latent attention
  in dense layers (1.3e-5), as does OpenBMB's MiniCPM3, rotated by halves, with µP's scales (the
  embeddings' and the LM head's as the class's attributes, each sublayer's output's folded into its
  last projection: `_sublayer_outputs_scaled`; 2.4e-6), its LongRoPE by the short factors
  (`yarn_as_transformers`), Meta's CWM is a Llama whose layers slide but every fourth (1.2e-6),
  IQuest-Coder-V1 a Llama under its own names, AllenAI's FlexOlmo OLMo 2's post-norm layers with
  OLMoE's experts (post-norm layers take experts: 1.4e-6), JetBrains' Mellum Qwen3's attention and
  experts in sliding and global layers of their own RoPE bases (two tables, as OLMo 3's: 1.4e-6).
  Then, each a Llama to the class but for what is said: Kyutai's
  Helium and GLM-4 9B / GLM-Edge (GlmForCausalLM: GLM-4's layers without its post norms) rotate
  neighbouring pairs (1.9e-6 each); InternLM3 (InternLM3ForCausalLM, which transformers runs as a
  Llama), 1.9e-6, with dynamic NTK RoPE built as plain RoPE (`dynamic_ntk_as_default`); Ministral 3's
  language model saved alone (Ministral3ForCausalLM), 2.4e-6; StarCoder2 (LayerNorms, biases, an
  ungated GELU MLP under other names: `UNGATED_MLP_NAMES`), 1.7e-6; Karpathy's nanochat
  (`_nanochat_as_llama`: weightless norms, a norm before the first layer folded into the embedding
  table, its reversed head turn as the usual one with half of each query and key head negated),
  1.7e-6; Google's VaultGemma (Gemma 2's embedding scale, norms, query scale and attention cap, but
  two norms a layer), 1.2e-6; Naver's HyperCLOVA X (Granite's multipliers, the logits' a factor, a
  norm after each sublayer, the residual multiplier folded into its weight or, without post norms,
  into the projections before the sum: `_residual_multiplier_folded`), 6.3e-6 and 3.3e-6; GPT-2,
  GPT-BigCode and OPT, rebuilt under a Llama's module names (`gpt_families.as_llama`) with no RoPE
  and a learned row per position added to the embeddings (`_learned_positions_added`, gathered by a
  `position_ids` input), 2.7e-5, 1.2e-5 and 2.0e-6; GPT-NeoX, GPT-J, CodeGen and Falcon, rebuilt so
  too, their attention and MLP side by side (the class's `_parallel_layer`, after one norm or two),
  2.9e-6, 1.4e-6, 2.2e-6, 2.4e-6 and 2.9e-6; BLOOM and MPT, rebuilt so too, with ALiBi, a bias
  on the scores given to the attention operator (`_alibi`), and BLOOM's norm of the embeddings
  (`_embeddings_normed`), 1.4e-6 both. A rotated part of each head whose width the attention
  operator refuses (not a multiple of 16: StableLM 3B's 20 of 80) is rotated as the whole head:
  each query and key head's dimensions reordered (`_padded_rotation_order`), the unrotated pairs
  turned by a frequency of 0 (`_padded_rotation_tables`), 5.7e-6.

Gemma 4 (Gemma4ForConditionalGeneration: 31B; Gemma4UnifiedForConditionalGeneration: 12B) has
classes in the builder, written for an older transformers:

- `gemma4_per_layer_shapes`: transformers 5.25 keeps the global layers' head width and KV heads
  only per layer (`per_layer_config`), and reading `num_key_value_heads` or `head_dim` from the
  config raises, as the builder does on its first line (no Gemma 4 could be built); the builder
  also reads `global_head_dim` and `num_global_key_value_heads`, which the config no longer has.
  The config allows the global read (the sliding layers' values, which the builder takes as the
  model's) and gets the global layers' two values back. Its RoPE stays one entry per layer type,
  which the builder's Gemma 4 class reads (gemma3_rope_per_layer_type leaves it).
- `gemma4_dense_mlp`: the builder sends every Gemma4ForConditionalGeneration to its
  mixture-of-experts class, whose MLP assumes experts beside it (AttributeError on the dense 31B's
  first layer). A layer without a router gets the dense class's MLP. Tiny ones (31B's shape, and
  12B's) match transformers to 9.1e-6 over 117 positions. The language model saved alone
  (Gemma4ForCausalLM, which the builder does not know) goes to the same class, its weights
  loaded as they are (the class strips the whole checkpoint's prefix from them): 5.7e-6; so does
  12B's (Gemma4UnifiedForCausalLM, whose config names no experts at all): 1.6e-5.
- `gemma4_per_layer_inputs`: Gemma 4 E2B and E4B give every layer an input of its own per token
  (a second embedding table of layers x 256 per token, plus a projection of the main embedding,
  normed), which gates a small projection added after the layer's MLP, before its scalar. The
  builder exports none of it (and took the second table for the embedding). In an int8 or int4
  build the table is 8-bit blocks (GatherBlockQuantized): as floats it would outweigh the rest.
  Their KV-sharing layers' MLPs are twice as wide (`use_double_wide_mlp`): gemma4_dense_mlp
  declares each MLP's values with its own width.
- `gemma4_shared_kv`: their last layers have no key and value projections: they attend over the
  keys and values of the last earlier layer of their type. Their attention operator takes that
  layer's keys and values and its past input; they have no past inputs of their own, and the
  engine binds their presents to that layer's buffers (session.shared_presents). A tiny E2B-shaped
  model matches transformers to 1.2e-5 (6.7 off without the per-layer inputs, 5.4 without their
  projected part, 3.2 with the first layer of each type shared instead of the last).

IBM's Granite 4.0-H (GraniteMoeHybridForCausalLM with Mamba layers: H-Micro, H-1B, H-350M; with
experts too, H-Tiny and H-Small) has a class in the builder that exports attention layers and the
shared MLP only (a Mamba layer has no `self_attn`):

- `granite4_mamba_as_linear_attention`, `granite4_mamba_layers`: its Mamba 2 layers are built from
  ONNX Runtime's operators for Qwen3.5's linear attention: the causal convolution with its state
  (CausalConvWithState), and the scan as LinearAttention's "gated" rule (the state decays by
  exp(dt * A), gains (dt * x) B^T, and is read with C), each group's B and C repeated for its
  heads, D's skip, then the gate and a norm per group (norm after gate, as Granite's). The config
  gives the builder the state shapes under Qwen3.5's names. Its attention layers rotate nothing
  where `position_embedding_type` is not "rope" (its published "nope"). A tiny one matches
  transformers to 2.4e-7 (0.18 off without D, 0.10 with B and C tiled instead of repeated, 0.11
  with one norm over all groups, 0.028 with RoPE); int8 0.0079, int4 0.14.
- `granite4_mamba_layers` also adds the experts of H-Tiny and H-Small beside each layer's shared
  MLP, which the class left out (a tiny one was 1.4 off without them): the router (softmax of the
  top k, the MoE operator's renormalized routing: 0.016 off without) and SwiGLU experts, as for
  Qwen3's mixture-of-experts models. A tiny one matches transformers to 3.6e-7; int8 0.019.
- `granite_moe_as_granite4`: Granite 3.x's mixture-of-experts models (GraniteMoeForCausalLM,
  GraniteMoeSharedForCausalLM) go to the same class, their layers all attention with RoPE; a layer
  without a shared MLP gets Granite's layer with the experts as its MLP. Tiny ones match
  transformers to 8.6e-7 and, with the shared MLP, 7.5e-7 (0.54 off with the top k's weights not
  renormalized); int8 0.021 and 0.029.

NVIDIA's Nemotron-H (NemotronHForCausalLM: Nemotron Nano 2, Nemotron-H 4B and 8B) has no class in
the builder:

- `nemotron_h_as_nemotron`, `nemotron_h_blocks`: the config goes to the builder's Nemotron class
  (its ReLU-squared MLP), which gains Nemotron-H's blocks: a norm (RMS, its weight as it is: 4.1
  off with Nemotron's offset) and one mixer each, its output added to the stream: a Mamba 2 layer
  (as Granite 4.0-H's), attention without RoPE (0.76 off rotated) or the MLP. A tiny one matches
  transformers to 1.2e-6; int8 0.090. Nemotron 3's experts' blocks route as LFM2-MoE does (the
  builder's LFM2-MoE class writes the routing: the top k of sigmoid scores plus a correction bias,
  mixed by the scores scaled to sum to 1, then by routed_scaling_factor); their ReLU-squared experts
  are the MoE operator's SwiGLU of the up projection with itself (see RELU_SQUARED_ALPHA), on a
  latent projection of the stream where the model has one (Nemotron 3 Super's), the shared expert
  an ungated MLP beside them.

TII's Falcon-H1 (FalconH1ForCausalLM) has no class in the builder either:

- `falcon_h1_as_mistral`, `falcon_h1_layers`: the config goes to the builder's Mistral class, which
  gains its layers: attention and a Mamba 2 mixer side by side on the input norm's output, their
  sum added to the stream, then the MLP; every layer keeps keys and values and Mamba's states. Its
  µP multipliers are folded into the weights they scale (0.49 off without), the embedding's and
  LM head's into the class's scales; the mixer's norm after the gate, before it or none, as its
  config says. A tiny one with every multiplier set matches transformers to 1.4e-6 (6e-7 and
  7.2e-7 with the other two norm options); int8 0.047.

AI21's Jamba (JambaForCausalLM: Jamba Reasoning 3B, Jamba Mini) has no class in the builder either:

- `jamba_as_mistral`, `falcon_h1_layers` (the class serves both): its layers are a norm, a Mamba (1)
  mixer or attention without RoPE, a norm, the MLP or experts. The Mamba mixer (`_make_mamba1`) is
  ONNX Runtime's linear attention with a head per channel and one value each, the state decaying
  per state dimension (exp(dt * A)); its time step, B and C RMS-normed as Jamba's are (4 off
  without); its experts' routing the softmax's top k as they are (0.44 off renormalized). A tiny
  one matches transformers to 1.7e-6; int8 0.26.

Cohere's models (CohereForCausalLM: Aya Expanse, Command R; Cohere2ForCausalLM: Command R7B,
Command A) have no class in the builder either:

- `cohere_as_mistral`, `falcon_h1_layers` (the same class): one LayerNorm (no bias: a zero one
  given) and attention and the MLP side by side on its output, neighbouring pairs rotated (0.68
  off by halves), the logits scaled; Command R7B's global layers unrotated where the others slide
  (0.31 off rotated). Tiny ones match transformers to 7.7e-7 and 1e-6; int8 0.077. Per-head query
  and key norms (Command R+'s) are refused before the export.

Mistral's Mixtral (MixtralForCausalLM: Mixtral 8x7B and 8x22B, and the mixtures of experts made
on its architecture) has no class in the builder either:

- `mixtral_as_mistral`, `falcon_h1_layers` (the same class): Mistral's layers with experts in
  place of the MLP: the router (softmax over the experts, the top k scaled to sum to 1: the MoE
  operator's own routing) and SwiGLU experts, as Granite's.

IBM's Granite SWA (GraniteSWAForCausalLM) has no class in the builder either:

- `granite_swa_as_granite`, `granite_swa_layers`: the config is sent to the builder's Granite
  class, which gains its attention: a learnable sink per head (the operator's head_sink, as
  gpt-oss's; 0.021 off without), and RoPE at each layer's own base (`layer_rope_theta`: a table per
  base, 8.4e-4 off with one; none where it is 0). A tiny one matches transformers to 3.6e-7. Its
  mixture-of-experts models (GraniteMoeSWAForCausalLM, granite-swash-3b-a600m) go to the Granite 4
  class, as Granite 3's do (`granite_moe_as_granite4`), which gains the same attention: 2.9e-6 (1.5
  off without it).

Liquid's LFM3 (Lfm3ForCausalLM) has no class in the builder either:

- `lfm3_as_lfm2`, `lfm3_layers`: the config is sent to the builder's LFM2 class (its RoPE, one
  entry per layer type, kept aside), which gains its layers: attention in the sliding layers too
  (LFM2's class made any layer not of full attention a convolution), RMS norms of each
  operator's and feed-forward's output (5.2 off without), a sigmoid gate per head on the
  attention's output (0.93 off without), and a RoPE table per layer type, the full layers'
  proportional (1.6 off with the sliding layers' on every layer). A tiny one matches
  transformers to 4e-6.
- `language_model_alone`, `load_language_model_alone`: image-and-text checkpoints the builder
  names no class for (LLaVA's, SmolVLM's, Qwen2-VL's, InternVL's, Aya Vision's, Qwen3-VL's
  mixtures of experts, LFM3-VL's, GLM-4V's and GLM-4.5V's, EXAONE 4.5's) go to it as their language
  model's family, whose weights are read alone from under the checkpoint's prefix (the builder
  loaded the whole checkpoint with the class the folder's config names, which fails), in the
  checkpoint's layout (CHECKPOINT_LAYOUT), with the head width and RoPE the text config's own
  class assumes where a family's class assumes others (TEXT_ROPE_DEFAULTS).
- `qwen3_next.as_qwen3_5_moe_config`, the same loading hook: Qwen3-Next goes to the builder's
  Qwen3.5 mixture-of-experts classes, its weights read as Qwen3-Next's and laid out as Qwen3.5's.

The builder is also asked (build.py) for `windowed_kv_cache=false`: the engine binds one buffer of
the whole capacity per layer, so local layers keep full-length caches and the attention operator
masks positions outside the window (`local_window_size`).
"""

from __future__ import annotations

import contextlib
import json
import math
import runpy
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

from firmware.toolchain import gpt_families, qwen3_next
from firmware.toolchain.expert_routing import MLA_FAMILIES, SIGMOID_ROUTED_FAMILIES, SOFTMAX_BIASED_FAMILIES


def _get(self: Any) -> Any:
    if "rope_theta" in self.__dict__:
        return self.__dict__["rope_theta"]
    params = self.__dict__.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        return params["rope_theta"]
    raise AttributeError("rope_theta")


def _set(self: Any, value: Any) -> None:
    self.__dict__["rope_theta"] = value


def phi3_default_rope(config: Any) -> None:
    if config.model_type != "phi3":
        return
    params = getattr(config, "rope_parameters", None) or {}
    original = getattr(config, "original_max_position_embeddings", None)
    if params.get("rope_type", "default") != "longrope" and original != config.max_position_embeddings:
        config.original_max_position_embeddings = config.max_position_embeddings


def longrope_type(config: Any) -> None:
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params.get("rope_type") == "longrope" and "type" not in params:
        params["type"] = "longrope"


def gemma4_per_layer_shapes(config: Any) -> None:
    if not str(getattr(config, "model_type", "")).startswith("gemma4"):
        return
    if list(getattr(config, "architectures", None) or ())[:1] in (["Gemma4ForCausalLM"], ["Gemma4UnifiedForCausalLM"]):
        config.architectures = ["Gemma4ForConditionalGeneration"]  # its language model alone (gemma4_dense_mlp)
        for name in ("num_experts", "top_k_experts", "moe_intermediate_size"):  # (the unified model's has none)
            setattr(config, name, getattr(config, name, None))
    config.allow_global_per_layer_attribute_access = True
    if not config.model_type.endswith("_text"):
        return
    full = [i for i, kind in enumerate(config.layer_types) if kind == "full_attention"]
    layer = config.per_layer_config[full[0]] if full else config
    config.global_head_dim = layer.head_dim
    config.num_global_key_value_heads = layer.num_key_value_heads


# Gemma 3n's checkpoints: the image-audio-and-text one and its language model saved alone.
GEMMA3N = ("Gemma3nForConditionalGeneration", "Gemma3nForCausalLM")


def gemma3n_as_gemma4(config: Any) -> None:
    """Gemma 3n (E2B, E4B) goes to the builder's Gemma 4 class, whose attention it has (query, key
    and value norms, no score scale, RoPE per layer type, the keys and values of the last layers
    shared: gemma4_shared_kv) and whose per-layer inputs it has too (gemma4_per_layer_inputs); its
    layers' AltUp streams, LAuReL block and sparse MLP gates are gemma3n_layers'. The class reads
    the global layers' shape apart, which in 3n is every layer's, and one MLP width (3n's may
    differ per layer: each MLP is built at its own)."""
    if str(getattr(config, "model_type", "")) not in ("gemma3n", "gemma3n_text"):
        return
    if list(getattr(config, "architectures", None) or ())[:1] and config.architectures[0] in GEMMA3N:
        config.architectures = ["Gemma4ForConditionalGeneration"]
    if config.model_type == "gemma3n":
        return
    config.global_head_dim, config.num_global_key_value_heads = config.head_dim, config.num_key_value_heads
    config.attention_k_eq_v = False
    rope = {kind: dict(entry) for kind, entry in config.rope_parameters.items()}
    rope["full_attention"].setdefault("partial_rotary_factor", 1.0)
    config.rope_parameters = rope
    widths = config.intermediate_size
    config.intermediate_size = max(widths) if isinstance(widths, list) else widths
    for name in ("num_experts", "top_k_experts", "moe_intermediate_size"):
        setattr(config, name, None)


def gemma3_rope_per_layer_type(config: Any) -> None:
    if str(getattr(config, "model_type", "")).startswith(("gemma4", "gemma3n")) or config.model_type == "lfm3":
        return  # (Gemma 4's builder class reads them per type; lfm3_as_lfm2 keeps LFM3's aside)
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict) or "full_attention" not in params or "rope_type" in params:
        return
    full: dict[str, Any] = params["full_attention"]
    local: dict[str, Any] = params.get("sliding_attention") or full
    config.rope_parameters = dict(full)
    config.rope_theta = full["rope_theta"]
    if getattr(config, "rope_local_base_freq", None) is None:
        config.rope_local_base_freq = local["rope_theta"]


def sliding_window_layers(config: Any) -> None:
    window = getattr(config, "sliding_window", None)
    if isinstance(window, int) and window > 0 and getattr(config, "layer_types", None) is None:
        config.layer_types = ["sliding_attention"] * config.num_hidden_layers


# The families whose attention transformers caps (tanh) by the config's attn_logit_softcapping.
ATTENTION_SOFTCAP_FAMILIES = ("gemma2", "vaultgemma")


def attention_softcap_as_transformers(config: Any) -> None:
    """The builder caps every family's attention logits where its config names a cap; transformers
    caps Gemma 2's only (Gemma 3's config takes the field and its attention never reads it: the
    gemma3_vl fixture, whose config names a cap of 5, was 0.56 off transformers, 3.5e-6 without)."""
    if getattr(config, "attn_logit_softcapping", None) is not None and \
            getattr(config, "model_type", "") not in ATTENTION_SOFTCAP_FAMILIES:
        config.attn_logit_softcapping = None


def norm_epsilon(config: Any) -> None:
    if "rms_norm_eps" in vars(config):
        return
    for name in ("layer_norm_eps", "norm_eps", "layer_norm_epsilon", "norm_epsilon"):
        if isinstance(vars(config).get(name), float):
            config.rms_norm_eps = vars(config)[name]
            return


# Families whose layers normalize each sublayer's output (post_norm_layers); GLM-4's normalize its input too.
POST_NORM_FAMILIES = {"olmo2": "Olmo2ForCausalLM", "olmo3": "Olmo3ForCausalLM", "exaone4": "Exaone4ForCausalLM",
                      "glm4": "Glm4ForCausalLM", "apertus": "ApertusForCausalLM",
                      "vaultgemma": "VaultGemmaForCausalLM", "hyperclovax": "HyperCLOVAXForCausalLM",
                      "afmoe": "AfmoeForCausalLM", "flex_olmo": "FlexOlmoForCausalLM"}  # fmt: skip
# Each family's norms (Hugging Face module names): before the attention, after it, before the
# MLP, after it; None where the layer has none.
LAYER_NORMS = {"glm4": ("input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm",
                        "post_mlp_layernorm"),
               "apertus": ("attention_layernorm", None, "feedforward_layernorm", None),  # a Llama's, renamed
               "vaultgemma": ("input_layernorm", None, "pre_feedforward_layernorm", None),  # Gemma 2's, less two
               "hyperclovax": ("input_layernorm", "post_norm1", "post_attention_layernorm", "post_norm2"),
               "afmoe": ("input_layernorm", "post_attention_layernorm", "pre_mlp_layernorm", "post_mlp_layernorm")}
POST_NORMS_ONLY = (None, "post_attention_layernorm", None, "post_feedforward_layernorm")
LLAMA_NORMS = ("input_layernorm", None, "post_attention_layernorm", None)  # (HyperCLOVA X's without post norms)
# Families that are a Llama but for their MLP: up, ReLU squared, down (Nemotron's, without its norms).
UNGATED_MLP_FAMILIES = {"arcee": "ArceeForCausalLM"}
# Families that are a Llama as the builder's class builds it (biases where their projections have them).
LLAMA_FAMILIES = {"seed_oss": "SeedOssForCausalLM", "stablelm": "StableLmForCausalLM",
                  "ministral": "MinistralForCausalLM", "jais2": "Jais2ForCausalLM", "olmoe": "OlmoeForCausalLM",
                  "qwen2_moe": "Qwen2MoeForCausalLM", "helium": "HeliumForCausalLM",
                  "internlm3": "InternLM3ForCausalLM", "nanochat": "NanoChatForCausalLM", "glm": "GlmForCausalLM",
                  "starcoder2": "Starcoder2ForCausalLM", "ministral3": "Ministral3ForCausalLM",
                  "exaone": "ExaoneForCausalLM", "glm4_moe": "Glm4MoeForCausalLM",
                  "glm4_moe_lite": "Glm4MoeLiteForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
                  "deepseek_v2": "DeepseekV2ForCausalLM", "llama4_text": "Llama4ForCausalLM",
                  "ernie4_5_moe": "Ernie4_5_MoeForCausalLM", "youtu": "YoutuForCausalLM",
                  "iquestcoder": "IQuestCoderForCausalLM", "solar_open": "SolarOpenForCausalLM",
                  "dots1": "Dots1ForCausalLM", "exaone_moe": "ExaoneMoeForCausalLM",
                  "cwm": "CwmForCausalLM", "minimax_m2": "MiniMaxM2ForCausalLM", "mellum": "MellumForCausalLM",
                  "hy_v3": "HYV3ForCausalLM", "minicpm3": "MiniCPM3ForCausalLM",
                  "minicpm5_moe": "MiniCPM5MoeForCausalLM"}
# Families of the Llama class whose queries and keys are normed (per head, or over the whole
# projection where whole_qk_norm says so).
QK_NORM_FAMILIES = ("olmo2", "olmo3", "olmoe", "exaone4", "apertus", "nanochat", "dots1", "exaone_moe",
                    "minimax_m2", "afmoe", "mellum", "hy_v3", "flex_olmo")
WHOLE_QK_NORM_FAMILIES = ("olmo2", "olmo3", "olmoe", "minimax_m2", "flex_olmo")
# Families whose RoPE turns pairs of neighbouring dimensions (interleaved), not the head's halves
# (DeepSeek's latent attention families as their configs' rope_interleave says).
NEIGHBOURING_PAIR_FAMILIES = ("glm", "glm4", "helium", "ernie4_5_moe", "llama4_text", *gpt_families.ROTATE_EVERY_TWO)
# Ungated MLPs' (up, down, activation) under other names: nanochat's, StarCoder2's.
UNGATED_MLP_NAMES = (("fc1", "fc2", "activation_fn"), ("c_fc", "c_proj", "act"))
# Families whose norms are LayerNorms (mean-centred, with biases) where a Llama has RMS norms.
LAYER_NORM_FAMILIES = ("stablelm", "jais2", "starcoder2", *gpt_families.GPT_FAMILIES)


def post_norm_as_llama(config: Any) -> None:
    """OLMo 2 and 3, EXAONE 4 and GLM-4 go to the builder's Llama class, which post_norm_layers
    gives their layers (the builder has a class for the first OLMo only); so do Arcee's models,
    whose MLP it gives them too, ByteDance's Seed-OSS, a Llama with biased projections,
    Stability's StableLM, one with LayerNorms (post_norm_layers' class sets them), and OLMoE and
    Qwen2-MoE, ones with experts."""
    names = list(getattr(config, "architectures", None) or ())
    if names[:1] and names[0] in (*POST_NORM_FAMILIES.values(), *UNGATED_MLP_FAMILIES.values(),
                                  *LLAMA_FAMILIES.values()):  # fmt: skip
        config.architectures = ["LlamaForCausalLM"]


def mla_heads(config: Any) -> None:
    """A multi-head latent attention's config as the plain multi-head attention the build makes of it
    (_mla_as_heads): a key head per query head, each as wide as a query's (its unrotated and rotated
    parts) or a value's, whichever is wider, the rotated part first."""
    if getattr(config, "model_type", "") not in MLA_FAMILIES or hasattr(config, "zerolayer_query_width"):
        return
    rotated = int(config.qk_rope_head_dim)
    # (Kept first: GLM-4.7-Flash's config maps head_dim to qk_rope_head_dim, which setting it overwrites.)
    config.zerolayer_query_width = int(config.qk_nope_head_dim) + rotated
    config.head_dim = max(config.zerolayer_query_width, int(config.v_head_dim))
    config.num_key_value_heads = config.num_attention_heads
    config.partial_rotary_factor = rotated / config.head_dim
    config.rope_parameters = {**config.rope_parameters, "partial_rotary_factor": rotated / config.head_dim}


def llama4_chunks_as_full(config: Any) -> None:
    """Llama 4's chunked layers (attention within chunks of attention_chunk_size) as full attention:
    the same inside one chunk, the only positions it is served (build.exact_positions); the builder
    keeps keys and values only for full and sliding layers."""
    if getattr(config, "model_type", "") == "llama4_text" and getattr(config, "layer_types", None):
        config.layer_types = ["full_attention" if kind == "chunked_attention" else kind for kind in config.layer_types]


def granite_swa_as_granite(config: Any) -> None:
    """IBM's Granite SWA models go to the builder's Granite class, which granite_swa_layers gives
    their attention (the builder has no class of their own)."""
    if list(getattr(config, "architectures", None) or ())[:1] == ["GraniteSWAForCausalLM"]:
        config.architectures = ["GraniteForCausalLM"]


def lfm3_as_lfm2(config: Any) -> None:
    """Liquid's LFM3 goes to the builder's LFM2 class, which lfm3_layers gives its layers; its RoPE,
    one entry per layer type, is kept aside for them (the class reads one flat entry: the sliding
    layers')."""
    if list(getattr(config, "architectures", None) or ())[:1] != ["Lfm3ForCausalLM"]:
        return
    config.architectures = ["Lfm2ForCausalLM"]
    by_type = dict(config.rope_parameters)
    config.zerolayer_rope_by_type = by_type
    config.rope_parameters = {"rope_type": "default", "rope_theta": by_type["sliding_attention"]["rope_theta"]}


# Image-and-text checkpoints whose language model is one of the families the build exports, and
# which the builder has no class for: the language model alone is exported, as its family's. Text
# families of their own -> the family whose class runs them on text (Qwen2-VL's multimodal RoPE,
# its three position rows all the same for text, is plain RoPE over the same frequencies).
LANGUAGE_MODEL_OF = ("LlavaForConditionalGeneration", "LlavaNextForConditionalGeneration",
                     "LlavaOnevisionForConditionalGeneration", "Idefics3ForConditionalGeneration",
                     "SmolVLMForConditionalGeneration", "Qwen2VLForConditionalGeneration",
                     "InternVLForConditionalGeneration", "AyaVisionForConditionalGeneration",
                     "Llama4ForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
                     "Lfm3VlForConditionalGeneration", "Glm4vForConditionalGeneration",
                     "Exaone4_5_ForConditionalGeneration", "Glm4vMoeForConditionalGeneration")  # fmt: skip
TEXT_FAMILY = {"qwen2_vl_text": "qwen2", "qwen3_vl_moe_text": "qwen3_moe", "glm4v_text": "glm4",
               "glm4v_moe_text": "glm4_moe"}
# Fields a text family's own class reads, which the checkpoint's language model fixes: Qwen3-VL's
# experts always scale their weights to sum to 1 (Qwen3-MoE's only with norm_topk_prob).
TEXT_FIELDS = {"qwen3_vl_moe_text": {"norm_topk_prob": True}}
# RoPE settings a text config's own class assumes where its rope_parameters name none, and its
# family's class assumes otherwise (GLM-4's rotates half of each head unless told; GLM-4V's all, where
# GLM-4.5V's config, as GLM-4.5's, assumes half).
TEXT_ROPE_DEFAULTS = {"glm4v_text": {"partial_rotary_factor": 1.0}}
# Checkpoints whose weights are laid out otherwise than their text family's class reads them: the
# model type whose conversions transformers applies to them (Qwen3-VL's fused experts, each matrix
# transposed).
CHECKPOINT_LAYOUT = {"Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe"}
# Where their checkpoints keep the language model (as published, and as transformers 5 saves them).
LANGUAGE_MODEL_KEYS = {r"^language_model\.model\.": "model.", r"^language_model\.lm_head\.": "lm_head.",
                       r"^model\.language_model\.": "model.", r"^model\.text_model\.": "model."}  # fmt: skip


def language_model_alone(config: Any) -> Any:
    """An image-and-text checkpoint's config -> its language model's, as its family's causal LM
    (a new config: the builder reads the text model's fields at the top), knowing its folder and
    where its weights are (load_language_model_alone). Any other config, as it is."""
    import sys

    names = list(getattr(config, "architectures", None) or ())
    if not names or names[0] not in LANGUAGE_MODEL_OF:
        return config
    transformers = sys.modules["transformers"]
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    fields = config.get_text_config().to_dict()
    family = TEXT_FAMILY.get(fields["model_type"], fields["model_type"])
    fields.update(TEXT_FIELDS.get(fields["model_type"], {}))
    # (a text config without head_dim shares the hidden size out; a family's class may default another)
    fields["head_dim"] = fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"]
    rope = fields.get("rope_parameters")
    if isinstance(rope, dict):  # (text's three position rows are the same: plain RoPE, interleaved or not)
        fields["rope_parameters"] = {**TEXT_ROPE_DEFAULTS.get(fields["model_type"], {}), **{
            k: v for k, v in rope.items() if k not in ("mrope_section", "mrope_interleaved")}}  # fmt: skip
    # The tie is the checkpoint's: transformers ties the head to the text model's embeddings by the
    # outer config's flag.
    fields["tie_word_embeddings"] = bool(getattr(config, "tie_word_embeddings", fields.get("tie_word_embeddings")))
    for name in ("model_type", "architectures", "_name_or_path", "transformers_version"):
        fields.pop(name, None)
    text = transformers.AutoConfig.for_model(family, **fields)
    text.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[family]]
    text._name_or_path = config._name_or_path
    text.zerolayer_language_model_of = (config.architectures[0], text.to_dict())
    return text


def load_language_model_alone() -> None:
    """The builder loads weights with the class the folder's own config names: an image-and-text
    checkpoint's language model (language_model_alone) is read alone instead, with its family's
    class and the weights under the checkpoint's language-model prefix (the vision tower and
    projector are never loaded), and a Qwen3-Next is read as itself, then laid out as Qwen3.5's
    (qwen3_next)."""
    from builders.base import Model

    def make(load_weights: Any) -> Any:
        def language_model_or_whole(self: Any, input_path: str) -> Any:
            import sys

            transformers = sys.modules["transformers"]
            if input_path.endswith(".gguf"):
                return load_weights(self, input_path)
            config = transformers.AutoConfig.from_pretrained(self.model_name_or_path)
            if getattr(config, "zerolayer_qwen3_next", False):  # read as itself, then as Qwen3.5's
                folder = self.model_name_or_path
                return qwen3_next.as_qwen3_5_moe(transformers.Qwen3NextForCausalLM.from_pretrained(folder),
                                                 qwen3_next.as_qwen3_5_moe_config(
                                                     transformers.Qwen3NextConfig.from_pretrained(folder)))  # fmt: skip
            wrapper = getattr(config, "zerolayer_language_model_of", None)
            if wrapper is None:
                return load_weights(self, input_path)
            fields = dict(wrapper[1])
            text = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
            return _language_model(self.model_name_or_path, text, getattr(transformers, text.architectures[0]),
                                   LANGUAGE_MODEL_KEYS, wrapper[0])  # fmt: skip
        return language_model_or_whole

    _replace(Model, "load_weights", make)


# Qwen3.5's language model saved alone -> the image-and-text checkpoints' architecture the builder names.
QWEN3_5_CONDITIONAL = {"Qwen3_5ForCausalLM": "Qwen3_5ForConditionalGeneration",
                       "Qwen3_5MoeForCausalLM": "Qwen3_5MoeForConditionalGeneration"}  # fmt: skip


def qwen3_5_text_as_conditional(config: Any) -> None:
    """Qwen3.5's language model saved alone (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM: what a
    GGUF file of it dequantizes to) goes to the builder's Qwen3.5 classes, which it names only by the
    image-and-text checkpoints' architectures (the vision tower is left out of the export anyway)."""
    first = list(getattr(config, "architectures", None) or ())[:1]
    if first and first[0] in QWEN3_5_CONDITIONAL:
        config.architectures = [QWEN3_5_CONDITIONAL[first[0]]]


def qwen35_rope_as_text(config: Any) -> None:
    """Qwen3.5's published configs name multimodal RoPE's sections (`mrope_section`), from which
    the builder writes an operator that takes a position of three rows, which qwen35_text_positions
    gave it one of: no such export could run a token. Text has the same position on all three
    rows, which is plain RoPE over the same frequencies, so the sections are left out."""
    first = list(getattr(config, "architectures", None) or ())[:1]
    if not first or first[0] not in QWEN3_5_CONDITIONAL.values():
        return
    text = getattr(config, "text_config", None) or config
    rope = dict(getattr(text, "rope_parameters", None) or {})
    if "mrope_section" in rope:
        text.rope_parameters = {k: v for k, v in rope.items() if k not in ("mrope_section", "mrope_interleaved")}


def dynamic_ntk_as_default(config: Any) -> None:
    """transformers' dynamic NTK RoPE (InternLM3's) rotates as plain RoPE up to the model's
    max_position_embeddings, past which the bundle serves nothing (build.exact_positions): the
    builder, which has no such type, gets plain RoPE over the same base. (HunYuan's "dynamic" has a
    fixed alpha, which its builder class reads.)"""
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and rope.get("rope_type") == "dynamic" and not rope.get("alpha"):
        config.rope_parameters = {**{k: v for k, v in rope.items() if k != "factor"}, "rope_type": "default"}


def hunyuan_moe_as_dense(config: Any) -> None:
    """Tencent's HunYuan mixture-of-experts checkpoints (Hunyuan-A13B) go to the builder's dense
    HunYuan class, which hunyuan_moe_layers gives their experts."""
    if list(getattr(config, "architectures", None) or ())[:1] == ["HunYuanMoEV1ForCausalLM"]:
        config.architectures = ["HunYuanDenseV1ForCausalLM"]


def qwen3_moe_as_qwen3(config: Any) -> None:
    """Qwen3's mixture-of-experts checkpoints go to the builder's Qwen3 class, which
    qwen3_moe_layers gives their experts (the builder has no class of their own)."""
    if list(getattr(config, "architectures", None) or ())[:1] == ["Qwen3MoeForCausalLM"]:
        config.architectures = ["Qwen3ForCausalLM"]


def _mamba_states(config: Any, groups: int, state: int, heads: int, width: int, kernel: int) -> None:
    """The builder sizes recurrent layers' states from Qwen3.5's names: a Mamba layer's B and C are
    its keys (`groups` of `state` dimensions), each head's x its values (`heads` of `width`), and its
    convolution `kernel` wide over both (_make_mamba, _make_mamba1)."""
    config.linear_num_key_heads, config.linear_key_head_dim = groups, state
    config.linear_num_value_heads, config.linear_value_head_dim = heads, width
    config.linear_conv_kernel_dim = kernel


def _no_rope_table(config: Any) -> None:
    """A RoPE entry for a model that rotates nowhere: the builder reads one, no layer uses it."""
    if not vars(config).get("rope_parameters"):
        config.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}


def granite_moe_as_granite4(config: Any) -> None:
    """IBM's Granite 3.x mixture-of-experts models (GraniteMoeForCausalLM: granite-3.1-1b-a400m and
    3b-a800m; GraniteMoeSharedForCausalLM, with a shared MLP beside the experts) go to the builder's
    Granite 4 class, whose layers granite4_mamba_layers gives their experts: attention layers with
    RoPE, and no shared MLP where the model has none. So do Granite SWA's (GraniteMoeSWAForCausalLM:
    granite-swash-3b-a600m), whose attention granite_swa_layers gives that class too."""
    model_type = getattr(config, "model_type", "")
    if model_type not in ("granitemoe", "granitemoeshared", "granitemoe_swa"):
        return
    config.architectures = ["GraniteMoeHybridForCausalLM"]
    if model_type != "granitemoe_swa":  # (Granite SWA's say which layers slide)
        config.layer_types = ["full_attention"] * config.num_hidden_layers
    config.position_embedding_type = "rope"
    config.shared_intermediate_size = getattr(config, "shared_intermediate_size", 0) or 0


def granite4_mamba_as_linear_attention(config: Any) -> None:
    if getattr(config, "model_type", "") != "granitemoehybrid" or "linear_attention" not in config.layer_types:
        return
    _mamba_states(config, config.mamba_n_groups, config.mamba_d_state, config.mamba_n_heads, config.mamba_d_head,
                  config.mamba_d_conv)  # fmt: skip


def nemotron_h_as_nemotron(config: Any) -> None:
    """NVIDIA's Nemotron-H (Nemotron Nano 2 among them) goes to the builder's Nemotron class (its
    ReLU-squared MLP), which nemotron_h_blocks gives its blocks; its Mamba layers' state shapes in
    Qwen3.5's names, as Granite 4.0-H's."""
    if getattr(config, "model_type", "") != "nemotron_h":
        return
    config.architectures = ["NemotronForCausalLM"]
    config.rms_norm_eps, config.hidden_act = config.layer_norm_epsilon, config.mlp_hidden_act
    _mamba_states(config, config.n_groups, config.ssm_state_size, config.mamba_num_heads, config.mamba_head_dim,
                  config.conv_kernel)  # fmt: skip
    _no_rope_table(config)


def falcon_h1_as_mistral(config: Any) -> None:
    """TII's Falcon-H1 goes to the builder's Mistral class (its attention and SwiGLU MLP), which
    falcon_h1_layers gives its layers: every layer has attention's keys and values and Mamba's
    states, whose shapes go in Qwen3.5's names, as Granite 4.0-H's."""
    if getattr(config, "model_type", "") != "falcon_h1":
        return
    config.architectures = ["MistralForCausalLM"]
    if not vars(config).get("head_dim"):
        config.head_dim = config.hidden_size // config.num_attention_heads
    _mamba_states(config, config.mamba_n_groups, config.mamba_d_state, config.mamba_n_heads, config.mamba_d_head,
                  config.mamba_d_conv)  # fmt: skip


def jamba_as_mistral(config: Any) -> None:
    """AI21's Jamba goes to the builder's Mistral class, which falcon_h1_layers gives its layers (the
    same class serves Falcon-H1's). Its Mamba layers' states in Qwen3.5's names: the convolution's
    over x alone (no key channels), and a state of one value per channel and state dimension."""
    if getattr(config, "model_type", "") != "jamba":
        return
    config.architectures = ["MistralForCausalLM"]
    _mamba_states(config, 0, config.mamba_d_state, config.mamba_expand * config.hidden_size, 1, config.mamba_d_conv)
    _no_rope_table(config)


def cohere_as_mistral(config: Any) -> None:
    """Cohere's models (Command R7B, Command A: Cohere2ForCausalLM; Aya Expanse, Command R:
    CohereForCausalLM) go to the builder's Mistral class, which falcon_h1_layers gives their
    layers (attention and the MLP side by side)."""
    if getattr(config, "model_type", "") in ("cohere", "cohere2"):
        config.architectures = ["MistralForCausalLM"]


def mixtral_as_mistral(config: Any) -> None:
    """Mistral's Mixtral goes to the builder's Mistral class, which falcon_h1_layers gives its
    experts (the same class serves Falcon-H1's, Jamba's and Cohere's)."""
    if getattr(config, "model_type", "") == "mixtral":
        config.architectures = ["MistralForCausalLM"]


FIXES = (dynamic_ntk_as_default, attention_softcap_as_transformers, gemma4_per_layer_shapes, gemma3n_as_gemma4,
         phi3_default_rope,
         longrope_type, gemma3_rope_per_layer_type, sliding_window_layers, norm_epsilon, qwen3_5_text_as_conditional,
         qwen35_rope_as_text, qwen3_moe_as_qwen3, hunyuan_moe_as_dense, mla_heads, llama4_chunks_as_full,
         post_norm_as_llama, granite_swa_as_granite, lfm3_as_lfm2,
         granite_moe_as_granite4, granite4_mamba_as_linear_attention, nemotron_h_as_nemotron, falcon_h1_as_mistral,
         jamba_as_mistral, cohere_as_mistral, mixtral_as_mistral, gpt_families.config_as_llama)  # fmt: skip


def _replace(cls: Any, method: str, make: Callable[[Any], Any]) -> None:
    """cls.method becomes make(the builder's own), once: install() may run twice in a process."""
    marker = f"_zerolayer_{method}"
    if vars(cls).get(marker):
        return
    setattr(cls, method, make(getattr(cls, method)))
    setattr(cls, marker, True)


def gemma_embedding_scale() -> None:
    import math

    from builders.gemma import GemmaModel

    def make(init: Any) -> Any:
        def exact_scale(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            self.embed_attrs["scale"] = math.sqrt(self.hidden_size)

        return exact_scale

    _replace(GemmaModel, "__init__", make)


def gpt_oss_layer_types() -> None:
    """The builder's gpt-oss class slides every even layer, whatever the config's `layer_types` say
    (a tiny gpt-oss whose layers are all global was 2.6 off transformers); the builder's own reading
    of `layer_types`, which every other class uses, applies instead (the published models alternate,
    sliding first, which it reads the same)."""
    from builders.gptoss import GPTOSSModel

    def make(init: Any) -> Any:
        def layer_types(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            vars(self).pop("is_local", None)  # the instance's lambda hid the class's method

        return layer_types

    _replace(GPTOSSModel, "__init__", make)


def olmo_layer_norm() -> None:
    from builders.olmo import OLMoModel

    def make_init(init: Any) -> Any:
        def layer_norm_epsilon(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            self.layernorm_attrs["epsilon"] = 1e-5  # fixed in OlmoLayerNorm; the config has no field for it

        return layer_norm_epsilon

    def make_norm(make_layernorm: Any) -> Any:
        def mean_centred(self: Any, layer_id: Any, layernorm: Any, skip: bool, simple: bool, location: str) -> None:
            make_layernorm(self, layer_id, layernorm, skip, False, location)

        return mean_centred

    _replace(OLMoModel, "__init__", make_init)
    _replace(OLMoModel, "make_layernorm", make_norm)


@contextlib.contextmanager
def _unrotated(model: Any) -> Iterator[None]:
    """The attention the builder makes meanwhile rotates nothing: no RoPE inside the operator and no
    RotaryEmbedding op beside it (a layer without RoPE: SmolLM3's, EXAONE 4's global ones)."""
    kept = {k: model.attention_attrs[k] for k in ("rope", "use_rope_in_attn")}
    model.attention_attrs.update(rope=False, use_rope_in_attn=False)
    try:
        yield
    finally:
        model.attention_attrs.update(kept)


@contextlib.contextmanager
def _declared_widths(model: Any, **widths: int) -> Iterator[None]:
    """The values the builder makes meanwhile are declared with these widths (hidden_size,
    intermediate_size), not the config's: a sublayer of other widths than the model's (Gemma 4's
    double-wide MLPs, Nemotron 3's experts and shared expert), whose values ONNX Runtime would
    otherwise find declared with the wrong shape."""
    kept = {name: getattr(model, name) for name in widths}
    for name, width in widths.items():
        setattr(model, name, width)
    try:
        yield
    finally:
        for name, width in kept.items():
            setattr(model, name, width)


def smollm3_no_rope_layers() -> None:
    from builders.smollm import SmolLM3Model

    def make(make_attention: Any) -> Any:
        def without_rotary(self: Any, layer_id: int, attention: Any, root_input: str, **kwargs: Any) -> None:
            if self.no_rope_layers[layer_id]:
                make_attention(self, layer_id, attention, root_input, **kwargs)
                return
            with _unrotated(self):  # the builder's own method turns off only the rotation inside the operator
                make_attention(self, layer_id, attention, root_input, **kwargs)

        return without_rotary

    _replace(SmolLM3Model, "make_attention", make)


def rope_types_past_llama3() -> None:
    from builders.base import Model
    from builders.llama import LlamaModel

    def make(llama3_only: Any) -> Any:
        def make_rope_init(self: Any, config: Any) -> None:
            params = getattr(config, "rope_parameters", None)
            if isinstance(params, dict) and params.get("rope_type", "default") != "llama3":
                Model.make_rope_init(self, config)
            else:
                llama3_only(self, config)

        return make_rope_init

    _replace(LlamaModel, "make_rope_init", make)


def yarn_as_transformers() -> None:
    from builders.base import Model
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    def make_init(read_rope: Any) -> Any:
        def make_rope_init(self: Any, config: Any) -> None:
            params = getattr(config, "rope_parameters", None)
            kind = params.get("rope_type") if isinstance(params, dict) else None
            if kind != "longrope":  # (the base class reads no LongRoPE: Phi-3's class reads its own)
                read_rope(self, config)
            if kind in ("yarn", "longrope"):  # (LongRoPE's short factors: build.exact_positions caps the context)
                inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[kind](config, None)
                self.rope_attrs["rescale_inv_freq"] = {"transformers": inv_freq}
                self.rope_attrs["mscale"] = float(attention_factor)

        return make_rope_init

    def make_rescale(rescale: Any) -> Any:
        def make_inv_freq_rescaled(self: Any, inv_freq: Any) -> Any:
            theirs = self.rope_attrs["rescale_inv_freq"].get("transformers")
            if theirs is None:
                return rescale(self, inv_freq)
            if theirs.shape != inv_freq.shape:
                raise ValueError(f"YaRN: transformers rotates {2 * theirs.shape[0]} dimensions of each head, "
                                 f"the builder {2 * inv_freq.shape[0]}")  # fmt: skip
            return theirs.to(inv_freq.dtype)

        return make_inv_freq_rescaled

    _replace(Model, "make_rope_init", make_init)
    _replace(Model, "make_inv_freq_rescaled", make_rescale)


def lm_head_is_the_model_s() -> None:
    from builders.base import Model

    def make(has_lm_head: Any) -> Any:
        def the_model_s_own(self: Any, module: Any) -> bool:
            if not has_lm_head(self, module):
                return False
            head = getattr(self.weights, "lm_head", None)  # a transformers model's, or a quantized one's
            return module is head if head is not None else self.layer_id >= self.num_layers

        return the_model_s_own

    _replace(Model, "has_lm_head", make)


def _global_and_plain_local_caches(self: Any) -> None:
    """The global layers' RoPE table as the config scales it, the local layers' plain at their base
    (under the names the builder's Gemma 3 class reads back)."""
    from builders.base import Model

    self.cos_cache_global_name, self.sin_cache_global_name = "cos_cache_global", "sin_cache_global"
    Model.make_rotary_embedding_caches(self, cos_cache_name="cos_cache_global", sin_cache_name="sin_cache_global")
    self.rope_attrs.update(create_caches=True, theta=self.rope_local_theta, rescale_factors=1, mscale=1)
    self.rope_attrs.pop("rescale_inv_freq", None)
    self.cos_cache_local_name, self.sin_cache_local_name = "cos_cache_local", "sin_cache_local"
    Model.make_rotary_embedding_caches(self, cos_cache_name="cos_cache_local", sin_cache_name="sin_cache_local")


def gemma3_plain_local_rope() -> None:
    from builders.gemma import Gemma3Model

    _replace(Gemma3Model, "make_rotary_embedding_multi_cache", lambda _builders: _global_and_plain_local_caches)


def qwen35_text_positions() -> None:
    from builders.base import Model
    from builders.qwen import Qwen35TextModel

    _replace(Qwen35TextModel, "make_inputs_and_outputs", lambda _three_rows: Model.make_inputs_and_outputs)


def qwen35_l2norm_epsilon() -> None:
    from builders.qwen import Qwen35TextModel

    def l2norm(self: Any, name: str, root_input: str, dtype: Any, shape: list[Any], axis: int = -1,
               p: int = 2) -> None:  # fmt: skip
        """x * rsqrt(sum(x^2) + 1e-6) over `axis`, into f"{name}/output_0" as the builder's LpNormalization."""
        assert p == 2
        summed = [*shape[:-1], 1]
        self.make_mul(f"{name}/Square", [root_input, root_input], dtype, shape)
        self.make_reduce_sum(f"{name}/ReduceSum", [f"{name}/Square/output_0", f"/model/constants/INT64/[{axis}]"],
                             dtype, summed, keepdims=True)  # fmt: skip
        epsilon = f"/model/constants/{self.to_str_dtype(dtype)}/1e-06"
        self.make_add(f"{name}/Epsilon", [f"{name}/ReduceSum/output_0", epsilon], dtype, summed)
        self.make_rsqrt(f"{name}/Rsqrt", [f"{name}/Epsilon/output_0"], dtype, summed)
        self.make_mul(name, [root_input, f"{name}/Rsqrt/output_0"], dtype, shape)

    _replace(Qwen35TextModel, "make_lp_normalization", lambda _no_epsilon: l2norm)


def _input_norm(self: Any, layer_id: int, norm: Any, simple: bool) -> str:
    """A layer's first norm (adding the previous layer's output to the stream, but in the first
    layer): its output's name."""
    self.make_layernorm(layer_id, norm, skip=not self.layernorm_attrs["first_layernorm"], simple=simple,
                        location="input")  # fmt: skip
    return str(self.layernorm_attrs["output_0"])


def _add_to_skip(self: Any, name: str, value: str) -> None:
    """`value` added to what the layer has so far to add to the stream (two sublayers side by side)."""
    self.make_add(name, [value, self.layernorm_attrs["skip_input"]], self.io_dtype, self.make_hidden_state_shape())
    self.layernorm_attrs["skip_input"] = f"{name}/output_0"


def _shared_expert_added(self: Any, layer_id: int, mlp: Any, root_input: str, make: Callable[..., Any]) -> None:
    """A shared expert beside the routed ones (GLM-4.5's, DeepSeek's, ERNIE's, Llama 4's, Nemotron 3's):
    `mlp` built by `make` (the class's make_mlp, or _ungated_mlp) as an MLP of its own width, its
    output added to what the layer adds to the stream so far (the routed experts')."""
    routed = self.layernorm_attrs["skip_input"]
    with _declared_widths(self, intermediate_size=mlp.up_proj.out_features):
        make(layer_id, mlp, root_input)  # (make_mlp leaves its output as the layer's: the routed one is put back)
    self.layernorm_attrs["skip_input"] = routed
    _add_to_skip(self, f"/model/layers.{layer_id}/moe/shared/Add", self.mlp_attrs["output_0"])


def _end_layer(self: Any, layer_id: int) -> None:
    """What the builder's make_layer leaves at a layer's end: the next norm adds this layer's output
    (the final norm, after the last layer)."""
    self.layernorm_attrs["first_layernorm"] = False
    if layer_id == self.num_layers - 1:
        self.layernorm_attrs["last_layernorm"] = True


def _experts(self: Any, layer_id: int, router: Any, experts: Any, root_input: str) -> str:
    """A layer's routed SwiGLU experts (Granite's, Jamba's, _layer_moe's: a router Parameter of [experts,
    hidden], fused gate-and-up weights [experts, 2 x width, hidden]) as the MoE operator: the
    router, the experts' weights, the operator; its output."""
    import types

    from builders.qwen import Qwen35MoETextModel

    routed = types.SimpleNamespace(gate=router, experts=experts)  # the names the builder reads
    self.moe_intermediate_size = experts.down_proj.shape[-1]
    Qwen35MoETextModel.make_moe_router(self, layer_id, routed, root_input)
    self.make_interleaved_swiglu_moe_preprocessing(layer_id, routed)
    return _experts_op(self, layer_id, root_input)


def _experts_op(self: Any, layer_id: int, root_input: str) -> str:
    """The MoE (or, quantized, QMoE) operator of a layer whose router and expert weights are made
    (make_moe_router, make_interleaved_swiglu_moe_preprocessing): its output."""
    basename, op_type = f"/model/layers.{layer_id}/moe", self.moe_attrs["op_type"]
    names = self.make_moe_expert_names(layer_id)
    scales = (names["gate_up_scales"], names["down_scales"]) if op_type == "QMoE" else ("", "")
    name = f"{basename}/{op_type}"
    self.make_moe_op(name, root_input=root_input, router_probs=f"{basename}/router/Reshape/output_0",
                     weight1=names["gate_up_weight"], scales1=scales[0], bias1=names["gate_up_bias"],
                     weight2=names["down_weight"], scales2=scales[1], bias2=names["down_bias"])  # fmt: skip
    return f"{name}/output_0"


def _mlp_of(self: Any, layer_id: int, layer: Any) -> Any:
    """A layer's feed-forward module, where transformers names it `mlp` (the builder's base class reads `moe`)."""
    return layer.mlp


def _layer_moe(self: Any, layer_id: int, moe: Any, root_input: str) -> None:
    """The builder's make_moe for transformers' fused-expert layers (Qwen3's, Mixtral's, OLMoE's,
    Qwen2-MoE's): the MLP of a layer the config keeps dense (`mlp_only_layers`), else the routed
    SwiGLU experts (_experts) and, where the layer has one, a shared expert gated by a sigmoid
    (Qwen2-MoE's, as the builder's Qwen3.5 MoE class writes it)."""
    if not hasattr(moe, "experts"):
        self.make_mlp(layer_id, moe, root_input)
        return
    gate = moe.router.gate if hasattr(moe, "router") else moe.gate  # (AFMoE's router holds a Linear `gate`)
    router = getattr(gate, "wg", gate)  # (HunYuan's router holds its weight as `wg`)
    statics = getattr(gate, "moe_statics", None)  # ERNIE 4.5's correction bias, [1, experts]
    # GLM-4.5's, DeepSeek's, ERNIE's correction bias; MiniMax-M2's and AFMoE's are the block's
    biases = (getattr(gate, "e_score_correction_bias", None), getattr(moe, "e_score_correction_bias", None),
              getattr(moe, "expert_bias", None))  # fmt: skip
    bias = next((b for b in biases if b is not None), None)
    if bias is not None or statics is not None:
        bias = statics.e_score_correction_bias.squeeze(0) if statics is not None else bias
        _score_routed_experts(self, layer_id, gate, bias, moe.experts.gate_up_proj, moe.experts.down_proj,
                              root_input, root_input, softmax=statics is not None)  # fmt: skip
        routed = self.layernorm_attrs["skip_input"]
    else:
        routed = _experts(self, layer_id, router, moe.experts, root_input)
    if getattr(moe, "shared_expert", None) is not None:
        from builders.qwen import Qwen35MoETextModel

        shared, gate = Qwen35MoETextModel.make_shared_expert(self, layer_id, moe.shared_expert,
                                                             moe.shared_expert_gate, root_input)  # fmt: skip
        name = f"/model/layers.{layer_id}/moe/GatedAdd"
        self.make_gated_add(name, routed, shared, gate, self.make_hidden_state_shape())
        routed = f"{name}/output_0"
    self.layernorm_attrs["skip_input"] = routed
    shared = getattr(moe, "shared_experts", None) or getattr(moe, "shared_mlp", None)  # (HunYuan's name)
    if shared is not None:  # GLM-4.5's, HunYuan's: a SwiGLU MLP added, ungated
        _shared_expert_added(self, layer_id, shared, root_input, self.make_mlp)


def qwen3_moe_layers() -> None:
    """The builder's Qwen3 class, with the layers of Qwen3's mixture-of-experts models where a
    config has experts (Qwen3-30B-A3B and the Qwen3-Coder ones): Qwen3's attention, then a router
    (softmax over the experts, the top k kept and, with norm_topk_prob, scaled to sum to 1: the MoE
    operator's own routing) and SwiGLU experts, without Qwen3.5's shared expert; the layers that
    `mlp_only_layers` or `decoder_sparse_step` leave dense keep their MLP."""
    import builders
    from builders.qwen import Qwen3Model

    if not getattr(builders.Qwen3Model, "_zerolayer_moe", False):
        builders.Qwen3Model = _with_fused_experts(Qwen3Model, lambda config: bool(config.norm_topk_prob))


def hunyuan_moe_layers() -> None:
    """The builder's dense HunYuan class, with the layers of HunYuan's mixtures of experts where a
    config has experts: its attention (query and key norms after RoPE), then a router (softmax over
    the experts, the top k kept and scaled to sum to 1, the MoE operator's own routing; its weight
    `gate.wg`) and SwiGLU experts, beside a shared MLP added ungated (_layer_moe); a count given per
    layer is the same in every layer (build.expert_choice_refusal refuses others)."""
    import builders
    from builders.hunyuan import HunyuanDenseV1Model

    def one_count(config: Any) -> None:
        for name in ("num_experts", "moe_topk"):  # (one per layer, all the same: build.expert_choice_refusal)
            if isinstance(getattr(config, name, None), list):
                setattr(config, name, getattr(config, name)[0])

    if not getattr(builders.HunyuanDenseV1Model, "_zerolayer_moe", False):
        builders.HunyuanDenseV1Model = _with_fused_experts(HunyuanDenseV1Model, lambda _: True, one_count)


def _with_fused_experts(base: Any, normalized: Callable[[Any], bool],
                        prepare: Callable[[Any], None] = lambda _: None) -> Any:  # fmt: skip
    """The builder's class `base`, given transformers' fused SwiGLU experts where a config has
    experts (_layer_moe: the router's softmax top k, scaled to sum to 1 where `normalized(config)`),
    its dense layers' MLP as wide as the config's intermediate_size; `prepare` reads the config first."""

    class WithFusedExperts(base):
        _zerolayer_moe = True

        def __init__(self, config: Any, *args: Any) -> None:
            prepare(config)
            super().__init__(config, *args)
            if self.moe_attrs["num_experts"]:
                self.moe_attrs.update(activation_type="swiglu", swiglu_fusion=1,
                                      normalize_routing_weights=normalized(config))  # fmt: skip
                self.intermediate_size = config.intermediate_size  # the dense layers' (the builder took the experts')

        get_moe_module = _mlp_of
        make_moe = _layer_moe

    return WithFusedExperts


def _ungated_mlp(self: Any, layer_id: int, mlp: Any, root_input: str) -> None:
    """An MLP without a gate (Arcee's, Jais 2's, Apertus's, Nemotron-H's): up, the activation (ReLU
    squared, or Apertus's xIELU), down, each projection with its bias where it has one (Nemotron's
    class, whose MLP this is, drops them: Jais 2 was 3.5 off, a Nemotron-H with mlp_bias 6.7)."""
    base = f"/model/layers.{layer_id}/mlp"
    up = _linear(self, mlp.up_proj, f"{base}/up_proj", root_input)
    if hasattr(mlp.act_fn, "alpha_p"):  # Apertus's xIELU, of learnt parameters per layer
        act = _xielu(self, mlp.act_fn, f"{base}/act_fn/xIELU", up)
    else:
        act = f"{self.make_activation(layer_id, root_input=up)}/output_0"
    self.mlp_attrs["output_0"] = _linear(self, mlp.down_proj, f"{base}/down_proj", act)


def _rms_norm(self: Any, norm: Any, base: str, value: str, width: int, epsilon: float) -> str:
    """An RMS norm (`norm`'s weight) of `value`, whose last dimension is `width`, as ONNX Runtime's
    SimplifiedLayerNormalization; its output's name."""
    name = f"{base}/SimplifiedLayerNormalization"
    weight = f"{base[1:].replace('/', '.')}.layernorm.weight"
    self.make_initializer(norm.weight, weight, to=self.io_dtype)
    self.make_node("SimplifiedLayerNormalization", inputs=[value, weight], outputs=[f"{name}/output_0"], name=name,
                   epsilon=epsilon, axis=-1, stash_type=1)  # fmt: skip
    self.make_value(f"{name}/output_0", self.io_dtype, shape=self.make_hidden_state_shape(last_dim=width))
    return f"{name}/output_0"


def _mla_as_heads(model: Any) -> None:
    """Each multi-head latent attention (DeepSeek V2's, as DeepSeek V3, Kimi K2 and GLM-4.7-Flash have
    it) given the projections of the plain multi-head attention it computes (mla_heads' shapes), in
    place: the queries (q_proj, or q_b_proj after q_a_proj and its norm) with each head's rotated
    part first; keys and values (k_proj, v_proj) of the rotated key and the normed latent side by
    side (_mla_input_proj), a head's key its rotated part as it is, then the latent's projection
    (kv_b_proj's key rows), its value kv_b_proj's value rows; widths padded with zeros to the
    head's, which the output projection's zero columns drop. (The keys and values held are then
    the heads', not the latent: more memory a token than DeepSeek's own cache.)"""
    import torch

    for layer in model.model.layers:
        a = layer.self_attn
        heads, nope, rope, value = a.num_heads, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
        width, rank = max(nope + rope, value), a.kv_lora_rank
        with torch.no_grad():
            query = a.q_proj if a.q_proj is not None else a.q_b_proj
            rows = query.weight.view(heads, nope + rope, -1)
            q = rows.new_zeros(heads, width, rows.shape[-1])
            q[:, :rope], q[:, rope : rope + nope] = rows[:, nope:], rows[:, :nope]
            latent = a.kv_b_proj.weight.view(heads, nope + value, rank)
            k = latent.new_zeros(heads, width, rope + rank)
            k[:, :rope, :rope] = torch.eye(rope)
            k[:, rope : rope + nope, rope:] = latent[:, :nope]
            v = latent.new_zeros(heads, width, rope + rank)
            v[:, :value, rope:] = latent[:, nope:]
            out = a.o_proj.weight.view(-1, heads, value)
            o = out.new_zeros(out.shape[0], heads, width)
            o[:, :, :value] = out
        projections = {"q_proj" if a.q_proj is not None else "q_b_proj": q, "k_proj": k, "v_proj": v}
        for name, weight in projections.items():
            setattr(a, name, _linear_of(weight.reshape(heads * width, -1), None))
        a.o_proj = _linear_of(o.reshape(o.shape[0], -1), a.o_proj.bias)


def _llama4_layers_named(model: Any) -> None:
    """Llama 4's layers under the names the class reads, in place: the feed-forward module as `mlp`,
    and in each rotated layer whose config asks for them, weightless query and key norms (as
    RMS norms of weight one)."""
    import torch

    config = model.config
    for layer, rotated in zip(model.model.layers, config.no_rope_layers, strict=True):
        layer.mlp = layer.feed_forward
        if rotated and config.use_qk_norm:
            attention = layer.self_attn
            attention.q_norm = attention.k_norm = torch.nn.RMSNorm(attention.head_dim, eps=config.rms_norm_eps)


def _llama4_moe(self: Any, layer_id: int, moe: Any, root_input: str) -> None:
    """Llama 4's experts' layer: its router's top expert (one) given the stream scaled by the sigmoid
    of the expert's logit (the expert's input scaled, not its output), which the MoE operator then
    runs with a weight of one; the shared expert's output added. (Its experts' weights are stored
    [experts, in, out]: transposed to the operator's layout.)"""
    import types

    from builders.qwen import Qwen35MoETextModel

    if not hasattr(moe, "experts"):  # a dense layer's MLP
        self.make_mlp(layer_id, moe, root_input)
        return
    if self.moe_attrs["top_k"] != 1:
        raise ValueError(f"Llama 4's experts: {self.moe_attrs['top_k']} per token, where one is exported")
    experts = types.SimpleNamespace(gate_up_proj=moe.experts.gate_up_proj.transpose(1, 2).contiguous(),
                                    down_proj=moe.experts.down_proj.transpose(1, 2).contiguous())  # fmt: skip
    routed = types.SimpleNamespace(gate=moe.router, experts=experts)
    self.moe_intermediate_size = int(experts.down_proj.shape[-1])
    Qwen35MoETextModel.make_moe_router(self, layer_id, routed, root_input)
    base, rows = f"/model/layers.{layer_id}/moe/input_scale", self.make_moe_router_shape(last_dim=1)
    logits = f"/model/layers.{layer_id}/moe/router/Reshape/output_0"  # [rows, experts]
    self.make_topk(f"{base}/TopK", [logits, "/model/constants/INT64/[1]"], dtype=self.io_dtype, shape=rows)
    self.make_node("Sigmoid", inputs=[f"{base}/TopK/output_0"], outputs=[f"{base}/Sigmoid/output_0"],
                   name=f"{base}/Sigmoid")  # fmt: skip
    self.make_value(f"{base}/Sigmoid/output_0", self.io_dtype, shape=rows)
    scale = _per_row(self, base, f"{base}/Sigmoid/output_0", root_input)
    self.make_mul(f"{base}/Mul", [root_input, scale], self.io_dtype, self.make_hidden_state_shape())
    self.make_interleaved_swiglu_moe_preprocessing(layer_id, routed)
    self.layernorm_attrs["skip_input"] = _experts_op(self, layer_id, f"{base}/Mul/output_0")
    _shared_expert_added(self, layer_id, moe.shared_expert, root_input, self.make_mlp)


def _routed_scale_folded(model: Any, factor: float) -> None:
    """DeepSeek V2's routed experts' output scaled by `factor` (routed_scaling_factor: 16 in DeepSeek
    V2's own config), in place, in their down projections: the MoE operator scales nothing."""
    import torch

    with torch.no_grad():
        for layer in model.model.layers:
            experts = getattr(layer.mlp, "experts", None)
            if experts is not None:
                experts.down_proj.mul_(factor)


def _linear_of(weight: Any, bias: Any) -> Any:
    """A torch Linear with these weight and bias (None: none)."""
    import torch

    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    return linear


def _mla_input_proj(self: Any, layer_id: int, attention: Any, root_input: str) -> None:
    """A multi-head latent attention's queries, keys and values as _mla_as_heads laid them out: the
    queries projected (through DeepSeek's low-rank projection and its norm, where it has one); the
    latent and the rotated key projected together (kv_a_proj_with_mqa), the latent normed, the two
    side by side projected to the keys and the values."""
    base, rank, rope = f"/model/layers.{layer_id}/attn", attention.kv_lora_rank, attention.qk_rope_head_dim
    if attention.q_a_proj is not None:
        q = _linear(self, attention.q_a_proj, f"{base}/q_a_proj", root_input)
        q = _rms_norm(self, attention.q_a_layernorm, f"{base}/q_a_layernorm", q, attention.q_a_proj.out_features,
                      attention.q_a_layernorm.variance_epsilon)  # fmt: skip
        q = _linear(self, attention.q_b_proj, f"{base}/q_b_proj", q)
    else:
        q = _linear(self, attention.q_proj, f"{base}/q_proj", root_input)
    both = _linear(self, attention.kv_a_proj_with_mqa, f"{base}/kv_a_proj_with_mqa", root_input)
    latent, rotated = f"{base}/kv_a/Split/output_0", f"{base}/kv_a/Split/output_1"
    self.make_split(f"{base}/kv_a/Split", [both, f"/model/constants/INT64/[{rank}, {rope}]"], [latent, rotated],
                    [self.io_dtype] * 2, [self.make_hidden_state_shape(last_dim=rank),
                                          self.make_hidden_state_shape(last_dim=rope)])  # fmt: skip
    latent = _rms_norm(self, attention.kv_a_layernorm, f"{base}/kv_a_layernorm", latent, rank,
                       attention.kv_a_layernorm.variance_epsilon)  # fmt: skip
    self.make_concat(f"{base}/kv_a/Concat", [rotated, latent], self.io_dtype,
                     self.make_hidden_state_shape(last_dim=rope + rank), axis=-1)  # fmt: skip
    joined = f"{base}/kv_a/Concat/output_0"
    self.attention_attrs.update(q_path=q, k_path=_linear(self, attention.k_proj, f"{base}/k_proj", joined),
                                v_path=_linear(self, attention.v_proj, f"{base}/v_proj", joined))  # fmt: skip


def _padded_rotation_order(width: int, rotated: int) -> list[int]:
    """A head's dimensions reordered so that the pairs RoPE turns when it rotates the first
    `rotated` of them by halves (i with i + rotated/2) are the pairs it turns when it rotates all
    `width` (i with i + width/2), the unrotated ones paired among themselves after each half."""
    half, rest = rotated // 2, (width - rotated) // 2
    return [*range(half), *range(rotated, rotated + rest), *range(half, rotated), *range(rotated + rest, width)]


def _heads_reordered_for_padded_rotation(self: Any, model: Any) -> None:
    """Each query and key head's dimensions in _padded_rotation_order, in place: the same order on
    both changes no score (the values, and so the output, are not touched)."""
    import torch

    order = torch.tensor(_padded_rotation_order(self.head_size, self.padded_rotation))
    with torch.no_grad():
        for layer in model.model.layers:
            for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                rows = projection.weight.shape[0] // self.head_size
                projection.weight.copy_(projection.weight.view(rows, self.head_size, -1)[:, order].reshape_as(
                    projection.weight))  # fmt: skip
                if projection.bias is not None:
                    projection.bias.copy_(projection.bias.view(rows, self.head_size)[:, order].reshape(-1))


def _padded_rotation_tables(self: Any, make_tables: Callable[[], Any]) -> Any:
    """The rotated part's cos and sin tables (as the builder makes them, [positions, rotated]),
    widened to the whole head: a frequency of 0 (cos 1, sin 0) for the unrotated pairs, which
    _padded_rotation_order put after each half of the rotated ones."""
    import torch

    kept = self.rope_attrs["partial_rotary_factor"]
    self.rope_attrs["partial_rotary_factor"] = self.padded_rotation / self.head_size
    try:
        cos, sin = make_tables()
    finally:
        self.rope_attrs["partial_rotary_factor"] = kept
    half, pad = self.padded_rotation // 2, (self.head_size - self.padded_rotation) // 2
    cos = torch.cat([cos[:, :half], torch.ones(cos.shape[0], pad, dtype=cos.dtype)], dim=-1)
    sin = torch.cat([sin[:, :half], torch.zeros(sin.shape[0], pad, dtype=sin.dtype)], dim=-1)
    return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)


def _query_and_gate_split(model: Any) -> None:
    """MiniCPM5's attention, in place, as AFMoE's: its fused projection of each head's queries and
    then its output gate's rows ([heads, 2, width, hidden]) split into `q_proj` and `gate_proj`,
    whose sigmoid multiplies the attention's output (make_attention_output_proj)."""
    import torch

    config = model.config
    for layer in model.model.layers:
        attention = layer.self_attn
        fused = attention.q_gate_proj
        rows = fused.weight.reshape(config.num_attention_heads, 2, config.head_dim, -1)
        sums = fused.bias.reshape(config.num_attention_heads, 2, config.head_dim) if fused.bias is not None else None
        for name, part in (("q_proj", 0), ("gate_proj", 1)):
            linear = torch.nn.Linear(rows.shape[-1], rows.shape[0] * rows.shape[2], bias=sums is not None)
            linear.weight = torch.nn.Parameter(rows[:, part].reshape(-1, rows.shape[-1]).contiguous(),
                                               requires_grad=False)  # fmt: skip
            if sums is not None:
                linear.bias = torch.nn.Parameter(sums[:, part].reshape(-1).contiguous(), requires_grad=False)
            setattr(attention, name, linear)
        del attention.q_gate_proj


def _nanochat_as_llama(model: Any) -> None:
    """Karpathy's nanochat, in place, as the Llama the builder's class builds (with per-head query
    and key norms and an ungated MLP): its norms have no weights (ones, then); it normalizes the
    embeddings before the first layer, which is the table's rows normalized; it turns each head's
    halves the other way (cat(x2, -x1)), which is the usual turn of the head with its second half
    negated, and negating that half in the query's and the key's rows changes no product of the two
    (nor their per-head norms, taken after the turn: it keeps their lengths)."""
    import torch

    config = model.config
    width = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    norms = [m for m in model.modules() if type(m).__name__ == "NanoChatRMSNorm"]
    with torch.no_grad():
        for norm in norms:
            norm.weight = torch.nn.Parameter(torch.ones(config.hidden_size), requires_grad=False)
        table = model.model.embed_tokens.weight
        table.mul_(torch.rsqrt(table.float().pow(2).mean(-1, keepdim=True) + config.rms_norm_eps).to(table.dtype))
        for layer in model.model.layers:
            attention = layer.self_attn
            attention.q_norm.weight = torch.nn.Parameter(torch.ones(width), requires_grad=False)
            attention.k_norm.weight = torch.nn.Parameter(torch.ones(width), requires_grad=False)
            for projection in (attention.q_proj, attention.k_proj):
                rows = projection.weight.view(-1, width, projection.weight.shape[-1])
                rows[:, width // 2 :].neg_()


def _learned_positions_added(self: Any, embeddings: str, positions: Any) -> str:
    """The tokens' `embeddings` plus each one's position's row of the table (gathered by the graph's
    position_ids): the sum's name."""
    base, table = "/model/embed_positions", "model.embed_positions.weight"
    self.make_initializer(positions, table, to=self.io_dtype)
    self.make_node("Gather", inputs=[table, self.input_names["position_ids"]], outputs=[f"{base}/Gather/output_0"],
                   name=f"{base}/Gather")  # fmt: skip
    self.make_value(f"{base}/Gather/output_0", self.io_dtype, shape=self.make_hidden_state_shape())
    self.make_add(f"{base}/Add", [embeddings, f"{base}/Gather/output_0"], self.io_dtype, self.make_hidden_state_shape())
    return f"{base}/Add/output_0"


def _embeddings_normed(self: Any, embeddings: str, norm: Any) -> str:
    """A LayerNorm of the embeddings before the first layer (BLOOM's)."""
    base, weight = "/model/embed_tokens/norm", "model.embed_tokens.norm"
    self.make_initializer(norm.weight, f"{weight}.weight", to=self.io_dtype)
    self.make_initializer(norm.bias, f"{weight}.bias", to=self.io_dtype)
    self.make_node("LayerNormalization", inputs=[embeddings, f"{weight}.weight", f"{weight}.bias"],
                   outputs=[f"{base}/output_0"], name=base, epsilon=float(norm.eps), axis=-1)  # fmt: skip
    self.make_value(f"{base}/output_0", self.io_dtype, shape=self.make_hidden_state_shape())
    return f"{base}/output_0"


def _alibi(self: Any, slopes: Any) -> str:
    """ALiBi's bias on the scores, [1, heads, queries, keys]: each head's slope times the key's
    position, 0 up to the attention mask's width (the keys a run attends over). Made once."""
    import onnx_ir as ir

    base = "/model/alibi"
    if f"{base}/Expand" in self.node_names:
        return f"{base}/Expand/output_0"
    heads, dtype, mask = len(slopes), self.io_dtype, self.input_names["attention_mask"]
    self.make_shape(f"{base}/mask/Shape", mask, [2])
    self.make_gather(f"{base}/keys", [f"{base}/mask/Shape/output_0", "/model/constants/INT64/1"], ir.DataType.INT64,
                     [], axis=0)  # fmt: skip
    self.make_range(f"{base}/Range", ["/model/constants/INT64/0", f"{base}/keys/output_0",
                    "/model/constants/INT64/1"], ir.DataType.INT64, ["total_sequence_length"])  # fmt: skip
    self.make_cast(f"{base}/Cast", f"{base}/Range/output_0", dtype, ["total_sequence_length"])
    self.make_initializer(slopes.reshape(1, heads, 1, 1), "model.alibi.slopes", to=dtype)
    self.make_mul(f"{base}/Mul", ["model.alibi.slopes", f"{base}/Cast/output_0"], dtype,
                  [1, heads, 1, "total_sequence_length"])  # fmt: skip
    self.make_shape(f"{base}/ids/Shape", self.input_names["input_ids"], [2])
    self.make_gather(f"{base}/queries", [f"{base}/ids/Shape/output_0", "/model/constants/INT64/[1]"],
                     ir.DataType.INT64, [1], axis=0)  # fmt: skip
    self.make_unsqueeze(f"{base}/keys/Unsqueeze", [f"{base}/keys/output_0", "/model/constants/INT64/[0]"],
                        ir.DataType.INT64, [1])  # fmt: skip
    self.make_concat(f"{base}/shape", [f"/model/constants/INT64/[1, {heads}]", f"{base}/queries/output_0",
                     f"{base}/keys/Unsqueeze/output_0"], ir.DataType.INT64, [4], axis=0)  # fmt: skip
    self.make_expand(f"{base}/Expand", [f"{base}/Mul/output_0", f"{base}/shape/output_0"], dtype,
                     [1, heads, "sequence_length", "total_sequence_length"])  # fmt: skip
    return f"{base}/Expand/output_0"


def _residual_multiplier_folded(model: Any) -> None:
    """HyperCLOVA X's sublayer outputs, scaled by `residual_multiplier` before they join the
    residual stream: the scale folded into the last weights before the sum (each post norm's
    weight, or where the model has none, the output projection's and the MLP's down projection's)."""
    post_norms = ("post_norm1", "post_norm2") if model.config.use_post_norm else None
    _sublayer_outputs_scaled(model, float(model.config.residual_multiplier), post_norms)


def _sublayer_outputs_scaled(model: Any, scale: float, post_norms: tuple[str, str] | None = None) -> None:
    """Each layer's attention and MLP outputs scaled by `scale` before they join the residual stream
    (HyperCLOVA X's residual_multiplier, MiniCPM3's scale_depth / sqrt(layers)): folded into the last
    weights before the sum, the `post_norms`' where the layer has them, else the output and down
    projections' (and their biases)."""
    import torch

    with torch.no_grad():
        for layer in model.model.layers:
            if post_norms is not None:
                last = [getattr(layer, name).weight for name in post_norms]
            else:
                last = [layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight]
                last += [b for b in (layer.self_attn.o_proj.bias, layer.mlp.down_proj.bias) if b is not None]
            for weight in last:
                weight.mul_(scale)


def _xielu(self: Any, act: Any, base: str, x: str) -> str:
    """transformers' XIELUActivation (Apertus's) of `x`: alpha_p x^2 + beta x where x > 0, else
    (expm1(min(x, eps)) - x) alpha_n + beta x, its alphas from its parameters (softplus'd)."""
    import onnx_ir as ir
    import torch.nn.functional as F

    dtype, shape = self.io_dtype, self.make_hidden_state_shape(last_dim=self.intermediate_size)
    number = f"/model/constants/{self.to_str_dtype(dtype)}"
    alpha_p = float(F.softplus(act.alpha_p.float()).reshape(-1)[0])
    alpha_n = float(act.beta.float() + F.softplus(act.alpha_n.float()).reshape(-1)[0])
    beta, eps = float(act.beta), float(act.eps)
    steps = [("Square", "Mul", [x, x]), ("Positive", "Mul", [f"{base}/Square/output_0", f"{number}/{alpha_p}"]),
             ("Linear", "Mul", [x, f"{number}/{beta}"]),
             ("PositiveSum", "Add", [f"{base}/Positive/output_0", f"{base}/Linear/output_0"]),
             ("Min", "Min", [x, f"{number}/{eps}"]), ("Exp", "Exp", [f"{base}/Min/output_0"]),
             ("Expm1", "Sub", [f"{base}/Exp/output_0", f"{number}/1.0"]),
             ("LessX", "Sub", [f"{base}/Expm1/output_0", x]),
             ("Negative", "Mul", [f"{base}/LessX/output_0", f"{number}/{alpha_n}"]),
             ("NegativeSum", "Add", [f"{base}/Negative/output_0", f"{base}/Linear/output_0"]),
             ("Greater", "Greater", [x, f"{number}/0.0"]),
             ("Where", "Where", [f"{base}/Greater/output_0", f"{base}/PositiveSum/output_0",
                                 f"{base}/NegativeSum/output_0"])]  # fmt: skip
    for name, op, inputs in steps:
        self.make_node(op, inputs=inputs, outputs=[f"{base}/{name}/output_0"], name=f"{base}/{name}")
        self.make_value(f"{base}/{name}/output_0", ir.DataType.BOOL if op == "Greater" else dtype, shape=shape)
    return f"{base}/Where/output_0"


def post_norm_layers() -> None:
    """The builder's Llama class, with the layers of OLMo 2 and 3, EXAONE 4 and GLM-4 where the
    config is theirs: an RMS norm of the attention's and the MLP's outputs before each joins the
    residual stream, and none before them (GLM-4's norm before them too); OLMo's and EXAONE's norm
    the queries and keys, over the whole projection in OLMo's, per head in EXAONE's (as Qwen3's).
    OLMo 3 adds sliding layers, whose RoPE is plain where the global layers' is scaled; EXAONE 4's
    hybrids rotate only in their sliding layers; GLM-4 rotates pairs of neighbouring dimensions
    (interleaved) of part of each head."""
    import builders
    from builders.llama import LlamaModel

    if getattr(builders.LlamaModel, "_zerolayer_post_norm", False):
        return

    class PostNormModel(LlamaModel):
        _zerolayer_post_norm = True

        def __init__(self, config: Any, *args: Any) -> None:
            super().__init__(config, *args)
            self.post_norm = config.model_type in POST_NORM_FAMILIES
            self.whole_qk_norm = config.model_type in WHOLE_QK_NORM_FAMILIES
            self.norm_names = LAYER_NORMS.get(config.model_type, POST_NORMS_ONLY)
            if config.model_type in QK_NORM_FAMILIES:
                self.attention_attrs.update(q_norm=True, k_norm=True)
            # SwiGLU experts: the softmax's top k, scaled to sum to 1 where the config asks (DeepSeek V2's
            # router never does: its routed_scaling_factor is folded into the experts, _routed_scale_folded).
            if config.model_type in ("olmoe", "qwen2_moe", "deepseek_v2", "mellum", "flex_olmo"):
                normalized = bool(config.norm_topk_prob) and config.model_type != "deepseek_v2"
                self.moe_attrs.update(activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=normalized)
                self.intermediate_size = config.intermediate_size  # a dense layer's MLP (Qwen2-MoE's)
                self.shared_expert_intermediate_size = getattr(config, "shared_expert_intermediate_size", 0)
            if config.model_type in (*SIGMOID_ROUTED_FAMILIES, *SOFTMAX_BIASED_FAMILIES):  # (_score_routed_experts)
                _score_routing(self, config)
                self.intermediate_size = config.intermediate_size  # the leading dense layers' MLP
                if getattr(config, "use_qk_norm", False):  # (GLM-4.5's, per head as Qwen3's; 4.5-Air has none)
                    self.attention_attrs.update(q_norm=True, k_norm=True)
            self.mla = config.model_type in MLA_FAMILIES
            if self.mla:  # the rotated pairs DeepSeek's neighbouring ones; the scores scaled by the queries' width
                from transformers.modeling_rope_utils import yarn_apply_mscale

                # (V2's always; MiniCPM3's never: it turns halves)
                self.rope_attrs["interleaved"] = int(bool(getattr(config, "rope_interleave",
                                                                  config.model_type != "minicpm3")))  # fmt: skip
                scale = config.zerolayer_query_width**-0.5  # (mla_heads')
                self.attention_attrs["scale"] = yarn_apply_mscale(config.rope_parameters, scale)
            if config.model_type in NEIGHBOURING_PAIR_FAMILIES:  # neighbouring pairs turned together
                self.rope_attrs["interleaved"] = 1
            if config.model_type == "hyperclovax":  # Granite's multipliers, but the logits' (a factor here)
                self.embed_attrs["scale"] = config.embedding_multiplier
                self.attention_attrs["scale"] = config.attention_multiplier
                self.lm_head_attrs["scale"] = config.logits_scaling
                if not config.use_post_norm:
                    self.norm_names = LLAMA_NORMS
            if config.model_type == "minicpm3":  # µP's embedding and LM head scales (the residual's: load_weights)
                self.embed_attrs["scale"] = float(config.scale_emb)
                self.lm_head_attrs["scale"] = 1.0 / float(config.logits_scaling)
            if config.model_type == "afmoe" and config.mup_enabled:  # (AFMoE's µP: the embeddings scaled)
                self.embed_attrs["scale"] = math.sqrt(self.hidden_size)
            if config.model_type == "vaultgemma":  # Gemma 2's embedding scale, norms (1 + w) and query scale
                self.embed_attrs["scale"] = math.sqrt(self.hidden_size)
                self.layernorm_attrs["add_offset"] = 1
                self.attention_attrs["scale"] = config.query_pre_attn_scalar**-0.5
            if config.model_type in LAYER_NORM_FAMILIES:  # LayerNorms with biases, not RMS norms
                self.layernorm_attrs["simple"] = False
            # EXAONE 4's global layers have no RoPE where the model has sliding ones.
            types = getattr(config, "layer_types", None) or []
            # (AFMoE's global layers never rotate, whatever its window.)
            windowed = config.model_type in ("exaone4", "exaone_moe") and getattr(config, "sliding_window", None)
            hybrid = bool(windowed) or config.model_type == "afmoe"
            self.unrotated = {i for i, kind in enumerate(types) if hybrid and kind != "sliding_attention"}
            # Llama 4's: RoPE (neighbouring pairs) and weightless per-head query and key norms but in its
            # every fourth layer; dense layers of their own width between its experts' (_llama4_moe).
            self.llama4 = config.model_type == "llama4_text"
            if self.llama4:
                self.unrotated = {i for i, rotated in enumerate(config.no_rope_layers) if not rotated}
                self.intermediate_size = config.intermediate_size_mlp
                self.attention_attrs.update(q_norm=bool(config.use_qk_norm), k_norm=bool(config.use_qk_norm))
                self.moe_attrs.update(activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=True)
            if config.model_type in gpt_families.LEARNED_POSITIONS:  # positions learned (make_embedding_lookup)
                self.input_names["position_ids"] = "position_ids"
            if config.model_type in (*gpt_families.LEARNED_POSITIONS, *gpt_families.ALIBI):  # (ALiBi's: _alibi)
                self.unrotated = set(range(self.num_layers))
            # GPT-NeoX's, GPT-J's and Falcon's attention and MLP side by side on the same input.
            self.parallel_residual = gpt_families.parallel_residual(config)
            # A rotated part of each head whose width the attention operator refuses (not a multiple of
            # 16: StableLM 3B's 20 of 80, Pythia 2.8B's): rotated as the whole head instead (padded_rotation).
            # (Set before any table is made: the global and local ones below are made at once.)
            rotated = int(self.rope_attrs.get("rotary_embedding_dim") or 0)
            self.padded_rotation = 0
            if rotated % 16 and not self.rope_attrs["interleaved"] and not self.attention_attrs["q_norm"]:
                self.padded_rotation = rotated
                self.rope_attrs.update(partial_rotary_factor=1.0, rotary_embedding_dim=0)
            self.rope_local_theta = getattr(config, "rope_local_base_freq", None)  # gemma3_rope_per_layer_type's
            if self.rope_local_theta is not None:  # (OLMo 3's, Mellum's: a base per layer type)
                _global_and_plain_local_caches(self)

        def make_rotary_embedding_caches_from_scratch(self) -> Any:
            if not self.padded_rotation:
                return super().make_rotary_embedding_caches_from_scratch()
            return _padded_rotation_tables(self, super().make_rotary_embedding_caches_from_scratch)

        def load_weights(self, input_path: str) -> Any:
            model = super().load_weights(input_path)
            model_type = getattr(model.config, "model_type", None)
            if model_type == "nanochat":
                _nanochat_as_llama(model)
            if model_type == "minicpm5_moe":
                _query_and_gate_split(model)
            if model_type == "hyperclovax":
                _residual_multiplier_folded(model)
            if model_type == "minicpm3":  # each sublayer's output scaled before the residual sum
                _sublayer_outputs_scaled(model, model.config.scale_depth / math.sqrt(model.config.num_hidden_layers))
            if model_type in gpt_families.GPT_FAMILIES:
                model = gpt_families.as_llama(model)
            if self.padded_rotation:
                _heads_reordered_for_padded_rotation(self, model)
            if self.mla:
                _mla_as_heads(model)
            if model_type == "deepseek_v2":
                _routed_scale_folded(model, float(model.config.routed_scaling_factor))
            if model_type == "llama4_text":
                _llama4_layers_named(model)
            for layer in getattr(getattr(model, "model", None), "layers", ()):
                mlp: Any = getattr(layer, "mlp", None)
                for up, down, act in UNGATED_MLP_NAMES:  # under the names _ungated_mlp reads
                    if hasattr(mlp, up):
                        mlp.up_proj, mlp.down_proj, mlp.act_fn = getattr(mlp, up), getattr(mlp, down), getattr(mlp, act)
            return model

        def make_embedding_lookup(self, embedding: Any, basename: str, lm_head: Any) -> str:
            looked_up = str(super().make_embedding_lookup(embedding, basename, lm_head))
            positions = getattr(self.weights, "zerolayer_positions", None)
            if positions is not None:  # gpt_families' models
                looked_up = _learned_positions_added(self, looked_up, positions)
            norm = getattr(self.weights, "zerolayer_embedding_norm", None)
            if norm is not None:  # BLOOM's
                looked_up = _embeddings_normed(self, looked_up, norm)
            return looked_up

        def make_group_query_attention(self, name: str, **kwargs: Any) -> None:
            slopes = getattr(self.weights, "zerolayer_alibi_slopes", None)
            if slopes is None:
                super().make_group_query_attention(name, **kwargs)
                return
            bias = _alibi(self, slopes)
            make_node: Callable[..., Any] = getattr(self, "make_node")  # noqa: B009  (replaced below)

            def with_bias(op_type: str, inputs: Any, outputs: Any, **attributes: Any) -> Any:
                if op_type == "GroupQueryAttention":  # its 11th input: a bias on every score
                    inputs = [*inputs[:10], bias, *inputs[11:]]
                return make_node(op_type, inputs, outputs, **attributes)

            setattr(self, "make_node", with_bias)  # noqa: B010  (for the one call below)
            try:
                super().make_group_query_attention(name, **kwargs)
            finally:
                del self.make_node  # the class's again

        def make_rotary_embedding_caches(self, **kwargs: Any) -> Any:
            two_tables = getattr(self, "rope_local_theta", None) is not None
            if two_tables and "cos_cache_name" not in kwargs:
                local = self.window_size != -1  # make_attention sets it per layer
                kwargs = {"cos_cache_name": self.cos_cache_local_name if local else self.cos_cache_global_name,
                          "sin_cache_name": self.sin_cache_local_name if local else self.sin_cache_global_name}
            return super().make_rotary_embedding_caches(**kwargs)

        def is_fused_qk_norm_gqa_supported(self) -> bool:
            if self.whole_qk_norm or self.llama4:  # (Llama 4's: not in every layer)
                return False
            return bool(super().is_fused_qk_norm_gqa_supported())

        def make_attention_qk_norm(self, layer_id: int, attention: Any) -> None:
            if not (self.llama4 and layer_id in self.unrotated):
                super().make_attention_qk_norm(layer_id, attention)

        def make_mlp_proj(self, layer_id: int, mlp: Any, root_input: str) -> None:
            if hasattr(mlp, "gate_proj"):
                super().make_mlp_proj(layer_id, mlp, root_input)
                return
            _ungated_mlp(self, layer_id, mlp, root_input)  # Arcee's, Jais 2's, Apertus's

        get_moe_module = _mlp_of  # OLMoE's and Qwen2-MoE's experts

        def make_moe(self, layer_id: int, moe: Any, root_input: str) -> None:
            (_llama4_moe if self.llama4 else _layer_moe)(self, layer_id, moe, root_input)

        def make_qk_norm(self, layer_id: int, attention: Any) -> None:
            if not self.whole_qk_norm:
                super().make_qk_norm(layer_id, attention)
                return
            for path, norm, width in (("q_path", attention.q_norm, self.q_size), ("k_path", attention.k_norm,
                                                                                  self.kv_size)):  # fmt: skip
                self.attention_attrs[path] = _rms_norm(self, norm, f"/model/layers.{layer_id}/attn/{path[0]}_norm",
                                                       self.attention_attrs[path], width,
                                                       self.layernorm_attrs["epsilon"])  # fmt: skip

        def make_attention_input_proj(self, layer_id: int, attention: Any, root_input: str, **kwargs: Any) -> None:
            if self.mla:
                _mla_input_proj(self, layer_id, attention, root_input)
                return
            super().make_attention_input_proj(layer_id, attention, root_input, **kwargs)

        def make_attention_output_proj(self, layer_id: int, attention: Any, root_input: str, **kwargs: Any) -> None:
            if hasattr(attention, "gate_proj"):  # AFMoE's, MiniCPM5's: the output gated by sigmoid(gate_proj(input))
                base, width = f"/model/layers.{layer_id}/attn/gate_proj", self.num_attn_heads * self.head_size
                gate = f"{self.make_matmul(attention.gate_proj, f'{base}/MatMul', root_input)}/output_0"
                if attention.gate_proj.bias is not None:  # (MiniCPM5's, with attention_bias)
                    self.make_add_bias(attention.gate_proj.bias, f"{base}/Add", root_input=gate)
                    gate = f"{base}/Add/output_0"
                shape = self.make_hidden_state_shape(last_dim=width)
                self.make_sigmoid(f"{base}/Sigmoid", gate, self.io_dtype, shape)
                self.make_mul(f"{base}/Mul", [self.attention_attrs["o_path"], f"{base}/Sigmoid/output_0"],
                              self.io_dtype, shape)  # fmt: skip
                self.attention_attrs["o_path"] = f"{base}/Mul/output_0"
            super().make_attention_output_proj(layer_id, attention, root_input, **kwargs)

        def make_attention(self, layer_id: int, attention: Any, root_input: str, **kwargs: Any) -> None:
            if layer_id not in self.unrotated:
                super().make_attention(layer_id, attention, root_input, **kwargs)
                return
            with _unrotated(self):
                super().make_attention(layer_id, attention, root_input, **kwargs)

        def make_layer(self, layer_id: int, layer: Any) -> None:
            if self.parallel_residual:
                self._parallel_layer(layer_id, layer)
                return
            if not self.post_norm:
                super().make_layer(layer_id, layer)
                return
            if self.prunes_hidden_rows():
                raise ValueError("post-norm layers: pruning the LM head's rows (paged attention) is not supported")
            before_attention, after_attention, before_mlp, after_mlp = (
                None if name is None else getattr(layer, name) for name in self.norm_names)  # fmt: skip
            residual = self.layernorm_attrs["root_input"]  # the embeddings, or the last layer's sum
            self.make_attention(layer_id, layer.self_attn, root_input=self._norm(layer_id, before_attention, "input",
                                                                                 residual))  # fmt: skip
            residual = self._post_norm(layer_id, after_attention, "post_attention", residual)
            feed_forward = self.make_moe if self.moe_attrs["num_experts"] > 0 else self.make_mlp  # (AFMoE's experts)
            feed_forward(layer_id, layer.mlp, root_input=self._norm(layer_id, before_mlp, "pre_feedforward", residual))
            last = layer_id == self.num_layers - 1
            if last:  # the final norm (SkipSimplifiedLayerNormalization) adds the MLP's normed output itself
                self.layernorm_attrs["root_input"] = residual
                self._post_norm(layer_id, after_mlp, "post_feedforward", None)
            else:
                self.layernorm_attrs["root_input"] = self._post_norm(layer_id, after_mlp, "post_feedforward", residual)
            self.layernorm_attrs["first_layernorm"] = False
            self.layernorm_attrs["last_layernorm"] = last

        def _parallel_layer(self, layer_id: int, layer: Any) -> None:
            """x + attention(norm1(x)) + mlp(norm2(x)), or mlp(norm1(x)) where the layer has one
            norm (post_attention_layernorm None): the input norm adds the last layer's output to
            the residual stream (its root input after), which the MLP's norm reads too."""
            if self.prunes_hidden_rows():
                raise ValueError("parallel layers: pruning the LM head's rows (paged attention) is not supported")
            self.make_layernorm(layer_id, layer.input_layernorm, skip=not self.layernorm_attrs["first_layernorm"],
                                simple=self.layernorm_attrs["simple"], location="input")  # fmt: skip
            normed = self.layernorm_attrs["output_0"]
            self.make_attention(layer_id, layer.self_attn, root_input=normed)
            attention = self.layernorm_attrs["skip_input"]
            if layer.post_attention_layernorm is not None:
                normed = self._norm(layer_id, layer.post_attention_layernorm, "post_attention",
                                    self.layernorm_attrs["root_input"])  # fmt: skip
            self.make_mlp(layer_id, layer.mlp, root_input=normed)
            name = f"/model/layers.{layer_id}/parallel/Add"
            self.make_add(name, [attention, self.layernorm_attrs["skip_input"]], self.io_dtype,
                          self.make_hidden_state_shape())  # fmt: skip
            self.layernorm_attrs["skip_input"] = f"{name}/output_0"
            self.layernorm_attrs["first_layernorm"] = False
            self.layernorm_attrs["last_layernorm"] = layer_id == self.num_layers - 1

        def _norm(self, layer_id: int, norm: Any, location: str, tensor: str) -> str:
            """`tensor` normalized by `norm` (itself where the layer has no norm there)."""
            if norm is None:
                return tensor
            kept = self.layernorm_attrs["root_input"]
            self.layernorm_attrs["root_input"] = tensor
            self.make_layernorm(layer_id, norm, skip=False, simple=self.layernorm_attrs["simple"], location=location)
            self.layernorm_attrs["root_input"] = kept
            return str(self.layernorm_attrs["output_0"])

        def _post_norm(self, layer_id: int, norm: Any, location: str, residual: str | None) -> str:
            """RMS-normalize the sublayer's output (layernorm_attrs' skip_input) and, given the
            residual stream, add it: the sum's name; otherwise leave it as skip_input."""
            normed = self._norm(layer_id, norm, location, self.layernorm_attrs["skip_input"])
            if residual is None:
                self.layernorm_attrs["skip_input"] = normed
                return normed
            name = f"/model/layers.{layer_id}/{location}/residual/Add"
            self.make_add(name, [residual, normed], self.io_dtype, self.make_hidden_state_shape())
            return f"{name}/output_0"

    builders.LlamaModel = PostNormModel


# Granite SWA's model types: the dense one (the builder's Granite class) and the experts' (its Granite 4 class).
GRANITE_SWA_TYPES = ("granite_swa", "granitemoe_swa")


def _granite_swa_attention(self: Any, config: Any) -> None:
    """Granite SWA's attention, on a builder class being made: a learnable sink per head (an extra
    logit in each softmax's denominator, as gpt-oss's: the operator's head_sink), and RoPE of each
    layer's own base (`layer_rope_theta`; 0: none), one table per base (`_granite_layer_table`)."""
    from builders.base import Model

    self.layer_thetas = []
    if config.model_type not in GRANITE_SWA_TYPES:
        return
    self.attention_attrs["sinks"] = True
    self.layer_thetas = [float(t) for t in config.layer_rope_theta]
    self.tables = {}
    for k, theta in enumerate(sorted({t for t in self.layer_thetas if t})):
        names = (f"cos_cache_{k}", f"sin_cache_{k}")
        self.rope_attrs.update(create_caches=True, theta=theta)
        Model.make_rotary_embedding_caches(self, cos_cache_name=names[0], sin_cache_name=names[1])
        self.tables[theta] = names
    self.layer = 0


def _granite_layer_table(self: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The RoPE table of the layer being made (`self.layer`), where the layers have their own bases."""
    if not getattr(self, "layer_thetas", None) or "cos_cache_name" in kwargs:
        return kwargs
    cos, sin = self.tables[self.layer_thetas[self.layer]]
    return {"cos_cache_name": cos, "sin_cache_name": sin}


def _granite_rotates(self: Any, layer_id: int) -> bool:
    """Whether layer `layer_id`'s attention has RoPE (a Granite SWA's layer of base 0 has none)."""
    self.layer = layer_id
    return not getattr(self, "layer_thetas", None) or bool(self.layer_thetas[layer_id])


def granite_swa_layers() -> None:
    """The builder's Granite class, with Granite SWA's attention where the config is theirs
    (`_granite_swa_attention`). (The builder windows the layers `layer_types` marks sliding itself.)"""
    import builders
    from builders.granite import GraniteModel

    if getattr(builders.GraniteModel, "_zerolayer_swa", False):
        return

    class GraniteSWAModel(GraniteModel):
        _zerolayer_swa = True

        def __init__(self, config: Any, *args: Any) -> None:
            super().__init__(config, *args)
            _granite_swa_attention(self, config)

        def make_rotary_embedding_caches(self, **kwargs: Any) -> Any:
            return super().make_rotary_embedding_caches(**_granite_layer_table(self, kwargs))

        def make_attention(self, layer_id: int, attention: Any, root_input: str, **kwargs: Any) -> None:
            if _granite_rotates(self, layer_id):
                super().make_attention(layer_id, attention, root_input, **kwargs)
                return
            with _unrotated(self):
                super().make_attention(layer_id, attention, root_input, **kwargs)

    builders.GraniteModel = GraniteSWAModel


def lfm3_layers() -> None:
    """The builder's LFM2 class, with LFM3's layers where the config is theirs: attention in its
    sliding layers as in its full ones (LFM2's class takes any other layer for a convolution), an
    RMS norm of each operator's and feed-forward's output before it joins the residual stream
    (`use_sandwich_norm`), a sigmoid gate per head on the attention's output (`g_proj`, from the
    layer's input), and RoPE per layer type: plain at the sliding layers' base, and on the full
    layers' proportional (a part of each head rotated at frequencies of the whole head: the table
    holds zero frequencies for the rest, which it leaves as it is)."""
    import builders
    import torch
    from builders.base import Model
    from builders.lfm2 import LFM2Model

    if getattr(builders.LFM2Model, "_zerolayer_lfm3", False):
        return

    class LFM3Model(LFM2Model):
        _zerolayer_lfm3 = True

        def __init__(self, config: Any, *args: Any) -> None:
            super().__init__(config, *args)
            self.lfm3 = config.model_type == "lfm3"
            if not self.lfm3:
                return
            self.gated = bool(config.use_attention_gate)
            self.layer = 0
            full = config.zerolayer_rope_by_type["full_attention"]
            if full.get("rope_type", "default") not in ("default", "proportional"):
                raise ValueError(f"LFM3: RoPE {full['rope_type']!r} on the full-attention layers is not supported")
            self._make_rope_tables(float(full["rope_theta"]), float(full.get("partial_rotary_factor", 1.0)))

        def _make_rope_tables(self, theta: float, part: float) -> None:
            self.rope_attrs.update(create_caches=True, partial_rotary_factor=1.0)
            Model.make_rotary_embedding_caches(self, cos_cache_name="cos_cache_local", sin_cache_name="sin_cache_local")
            half = self.head_size // 2
            rotated = int(part * self.head_size // 2)
            inv_freq = torch.zeros(half)
            inv_freq[:rotated] = 1.0 / theta ** (torch.arange(0, 2 * rotated, 2).float() / self.head_size)
            angles = torch.outer(torch.arange(self.context_length).float(), inv_freq)
            self.make_initializer(angles.cos(), "cos_cache_global", to=self.io_dtype)
            self.make_initializer(angles.sin(), "sin_cache_global", to=self.io_dtype)

        def make_intermediate_size_init(self, config: Any) -> None:
            if config.model_type == "lfm3":  # (no block_* sizing: its size is the MLP's)
                self.intermediate_size = config.intermediate_size
            else:
                super().make_intermediate_size_init(config)

        def make_rotary_embedding_caches(self, **kwargs: Any) -> Any:
            if getattr(self, "lfm3", False) and "cos_cache_name" not in kwargs:
                where = "global" if self.layer_types[self.layer] == "full_attention" else "local"
                return f"cos_cache_{where}", f"sin_cache_{where}"
            return super().make_rotary_embedding_caches(**kwargs)

        def make_attention(self, layer_id: int, attention: Any, root_input: str, **kwargs: Any) -> None:
            if not self.lfm3:
                super().make_attention(layer_id, attention, root_input, **kwargs)
                return
            self.layer = layer_id
            Model.make_attention(self, layer_id, attention, root_input, **kwargs)  # (its names are the base's)

        def make_attention_output_proj(self, layer_id: int, attention: Any, root_input: str, **kwargs: Any) -> None:
            if getattr(self, "lfm3", False) and self.gated:
                self.attention_attrs["o_path"] = self._gated(layer_id, attention, root_input)
            super().make_attention_output_proj(layer_id, attention, root_input, **kwargs)

        def _gated(self, layer_id: int, attention: Any, root_input: str) -> str:
            """The attention's output, each head's scaled by sigmoid(g_proj(layer input))."""
            base, heads, width = f"/model/layers.{layer_id}/attn/g_proj", self.num_attn_heads, self.head_size
            gate = self.make_matmul(attention.g_proj, f"{base}/MatMul", root_input)
            self.make_sigmoid(f"{base}/Sigmoid", f"{gate}/output_0", self.io_dtype,
                              ["batch_size", "sequence_length", heads])  # fmt: skip
            self.make_unsqueeze(f"{base}/Unsqueeze", [f"{base}/Sigmoid/output_0", "/model/constants/INT64/[-1]"],
                                self.io_dtype, ["batch_size", "sequence_length", heads, 1])  # fmt: skip
            self.make_reshape(f"{base}/Reshape_1", [self.attention_attrs["o_path"],
                                                    f"/model/constants/INT64/[0, 0, {heads}, {width}]"],
                              self.io_dtype, ["batch_size", "sequence_length", heads, width])  # fmt: skip
            self.make_mul(f"{base}/Mul", [f"{base}/Reshape_1/output_0", f"{base}/Unsqueeze/output_0"],
                          self.io_dtype, ["batch_size", "sequence_length", heads, width])  # fmt: skip
            self.make_reshape(f"{base}/Reshape_2", [f"{base}/Mul/output_0",
                                                    f"/model/constants/INT64/[0, 0, {heads * width}]"],
                              self.io_dtype, self.make_hidden_state_shape(last_dim=heads * width))  # fmt: skip
            return f"{base}/Reshape_2/output_0"

        def make_layer(self, layer_id: int, layer: Any) -> None:
            if not self.lfm3:
                super().make_layer(layer_id, layer)
                return
            if self.prunes_hidden_rows():
                raise ValueError("LFM3: pruning the LM head's rows (paged attention) is not supported")
            self.make_layernorm(layer_id, layer.operator_norm, skip=not self.layernorm_attrs["first_layernorm"],
                                simple=self.layernorm_attrs["simple"], location="operator")  # fmt: skip
            if self.layer_types[layer_id] == "conv":
                conv = self.make_short_conv(layer_id, layer.conv, self.layernorm_attrs["output_0"])
                self.layernorm_attrs["skip_input"] = conv
            else:
                self.make_attention(layer_id, layer.self_attn, root_input=self.layernorm_attrs["output_0"])
            self._normed_output(layer_id, layer.post_operator_norm, "post_operator")
            self.make_layernorm(layer_id, layer.ffn_norm, skip=True, simple=self.layernorm_attrs["simple"],
                                location="ffn")  # fmt: skip
            self.make_feed_forward(layer_id, layer, root_input=self.layernorm_attrs["output_0"])
            self._normed_output(layer_id, layer.post_ffn_norm, "post_ffn")
            self.layernorm_attrs["first_layernorm"] = False
            self.layernorm_attrs["last_layernorm"] = layer_id == self.num_layers - 1

        def _normed_output(self, layer_id: int, norm: Any, location: str) -> None:
            """The sublayer's output (skip_input, which the next skip norm adds to the residual
            stream) RMS-normalized by `norm`, where the layer has one (a sandwich norm)."""
            if getattr(norm, "weight", None) is None:
                return
            kept = self.layernorm_attrs["root_input"]
            self.layernorm_attrs["root_input"] = self.layernorm_attrs["skip_input"]
            self.make_layernorm(layer_id, norm, skip=False, simple=True, location=location)
            self.layernorm_attrs["root_input"] = kept
            self.layernorm_attrs["skip_input"] = self.layernorm_attrs["output_0"]

    builders.LFM2Model = LFM3Model


def gemma4_dense_mlp() -> None:
    from builders.base import Model
    from builders.gemma import Gemma4Model, Gemma4MoEModel

    def make(make_mlp: Any) -> Any:
        def make_mlp_or_moe(self: Any, layer_id: int, mlp: Any, root_input: str) -> None:
            if getattr(self.current_layer, "router", None) is not None:
                return make_mlp(self, layer_id, mlp, root_input)
            # The width its values are declared with: twice the config's in E2B's and E4B's
            # KV-sharing layers (use_double_wide_mlp), which ONNX Runtime warns of at every load.
            with _declared_widths(self, intermediate_size=mlp.up_proj.weight.shape[0]):
                Gemma4Model.make_mlp(self, layer_id, mlp, root_input)
            return None
        return make_mlp_or_moe

    _replace(Gemma4MoEModel, "make_mlp", make)

    def make_load(load_weights: Any) -> Any:
        def load_text_only_or_whole(self: Any, input_path: str) -> Any:
            config_file = Path(self.model_name_or_path) / "config.json"
            names = json.loads(config_file.read_text()).get("architectures") if config_file.is_file() else None
            # The language model saved alone: its weights are its own, no prefix to strip.
            if names == ["Gemma3nForConditionalGeneration"]:
                return _gemma3n_language_model(self.model_name_or_path)
            if names in (["Gemma4ForCausalLM"], ["Gemma4UnifiedForCausalLM"], ["Gemma3nForCausalLM"]):
                return Model.load_weights(self, input_path)
            return load_weights(self, input_path)
        return load_text_only_or_whole

    _replace(Gemma4MoEModel, "load_weights", make_load)


def _gemma3n_language_model(folder: str) -> Any:
    """Gemma 3n's image-audio-and-text checkpoint (as published): its language model alone, the
    weights under model.language_model read as Gemma3nForCausalLM's. The towers are never loaded
    (its vision tower's class needs timm to load at all, and they are most of a gigabyte)."""
    import sys

    transformers = sys.modules["transformers"]
    config = transformers.Gemma3nConfig.from_pretrained(folder).text_config
    return _language_model(folder, config, transformers.Gemma3nForCausalLM, {r"^model\.language_model\.": "model."},
                           "Gemma 3n")  # fmt: skip


def _language_model(folder: str, config: Any, causal_lm: Any, keys: dict[str, str], whose: str) -> Any:
    """A checkpoint's language model alone, as `causal_lm` of `config`, its weights renamed by
    `keys` (the rest, a vision tower's, left unread); one it has no weight for is refused."""
    layout = CHECKPOINT_LAYOUT.get(whose)
    if layout is not None:  # a subclass that reads the checkpoint's layout, as transformers does for `whose`
        from transformers.conversion_mapping import (
            get_checkpoint_conversion_mapping,
            register_checkpoint_conversion_mapping,
        )

        causal_lm = type(f"{causal_lm.__name__}Of{whose}", (causal_lm,), {})
        register_checkpoint_conversion_mapping(causal_lm.__name__, get_checkpoint_conversion_mapping(layout),
                                               overwrite=True)  # fmt: skip
    model, info = causal_lm.from_pretrained(folder, config=config, key_mapping=keys, output_loading_info=True)
    if info.get("missing_keys"):  # the loader fills them with random values and goes on
        raise ValueError(f"{folder}: no weights for {sorted(info['missing_keys'])[:3]} of {whose}'s language model")
    return model


def _gemma4_norm(self: Any, name: str, root_input: str, weight: Any, shape: list[Any],
                 epsilon: float | None = None) -> str:  # fmt: skip
    """An RMS norm over the last axis of `root_input`, in its type, Gemma 4's: its weight as it is
    (the model's epsilon unless given)."""
    weight_name, dtype = f"model.{name}.weight", self.values[root_input].dtype
    self.make_initializer(weight + self.layernorm_attrs["add_offset"], weight_name, to=dtype)
    node = f"/model/{name.replace('.', '/')}/SimplifiedLayerNormalization"
    self.make_node("SimplifiedLayerNormalization", inputs=[root_input, weight_name], outputs=[f"{node}/output_0"],
                   name=node, epsilon=self.layernorm_attrs["epsilon"] if epsilon is None else epsilon, axis=-1,
                   stash_type=1)  # fmt: skip
    self.make_value(f"{node}/output_0", dtype, shape=shape)
    return f"{node}/output_0"


def _as(self: Any, value: str, dtype: Any, shape: list[Any]) -> str:
    """`value` in `dtype`: itself, or a Cast of it."""
    if self.values[value].dtype == dtype:
        return value
    self.make_cast(f"{value}/Cast", value, dtype, shape)
    return f"{value}/Cast/output_0"


def _per_layer_table_lookup(self: Any, weight: Any, name: str, shape: list[Any]) -> str:
    """Each token's row of the per-layer table: a Gather, or in a quantized build, 8-bit blocks of
    the build's block size with a scale and zero point each (GatherBlockQuantized). The table has
    a row of layers x width per token of the vocabulary, some two billion values in Gemma 4 E2B: as
    floats it would outweigh the rest of an int8 model several times over. Gemma 3n's table stops
    short of its vocabulary (its image and audio tokens have no row): those tokens read row 0, as
    in transformers."""
    import numpy as np
    import onnx_ir as ir

    ids = self.input_names["input_ids"]
    if weight.shape[0] < self.vocab_size:
        self.make_less(f"{name}/InTable", [ids, f"/model/constants/INT64/{weight.shape[0]}"])
        self.make_node("Where", inputs=[f"{name}/InTable/output_0", ids, "/model/constants/INT64/0"],
                       outputs=[f"{name}/ids/output_0"], name=f"{name}/ids")  # fmt: skip
        self.make_value(f"{name}/ids/output_0", ir.DataType.INT64, shape=["batch_size", "sequence_length"])
        ids = f"{name}/ids/output_0"
    if self.onnx_dtype not in (ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT4, ir.DataType.UINT4):
        self.make_initializer(weight, "model.embed_tokens_per_layer.weight", to=self.io_dtype)
        self.make_gather(name, ["model.embed_tokens_per_layer.weight", ids], self.io_dtype, shape, axis=0)
        return f"{name}/output_0"
    block = int(self.quant_attrs["matmul_block_size"])
    rows, width = weight.shape
    padded = -(-width // block) * block
    quantized = np.empty((rows, padded // block, block), dtype=np.uint8)
    scales = np.empty((rows, padded // block), dtype=np.float32)
    zero_points = np.empty((rows, padded // block), dtype=np.uint8)
    for start in range(0, rows, 4096):  # a few rows at a time: the whole table's float copies are gigabytes
        rows_of = slice(start, start + 4096)
        part = weight[rows_of].detach().float().numpy()
        blocks = np.pad(part, ((0, 0), (0, padded - width))).reshape(len(part), -1, block)
        low, high = np.minimum(blocks.min(-1), 0.0), np.maximum(blocks.max(-1), 0.0)  # zero stays exact
        scale = np.where(high > low, (high - low) / 255.0, 1.0).astype(np.float32)
        zero = np.clip(np.round(-low / scale), 0, 255)
        quantized[rows_of] = np.clip(np.round(blocks / scale[..., None]) + zero[..., None], 0, 255)
        scales[rows_of], zero_points[rows_of] = scale, zero
    self.make_initializer(quantized.reshape(rows, padded), "model.embed_tokens_per_layer.qweight")
    self.make_initializer(scales, "model.embed_tokens_per_layer.scales", to=self.io_dtype)
    self.make_initializer(zero_points, "model.embed_tokens_per_layer.zero_points")
    node = f"{name}BlockQuantized"
    self.make_node("GatherBlockQuantized", inputs=["model.embed_tokens_per_layer.qweight", ids,
                   "model.embed_tokens_per_layer.scales", "model.embed_tokens_per_layer.zero_points"],
                   outputs=[f"{node}/output_0"], name=node, domain="com.microsoft", bits=8, block_size=block,
                   gather_axis=0, quantize_axis=1)  # fmt: skip
    self.make_value(f"{node}/output_0", self.io_dtype, shape=[*shape[:-1], padded])
    if padded == width:
        return f"{node}/output_0"
    self.make_slice(f"{name}/Slice", [f"{node}/output_0", "/model/constants/INT64/[0]", f"/model/constants/INT64/"
                    f"[{width}]", "/model/constants/INT64/[-1]"], dtype=self.io_dtype, shape=shape)  # fmt: skip
    return f"{name}/Slice/output_0"


def _per_layer_embedder(weights: Any) -> Any:
    """The text model of a Gemma 4 with per-layer embeddings (E2B, E4B), or None."""
    return next((m for m in weights.modules() if getattr(m, "embed_tokens_per_layer", None) is not None), None)


def gemma4_per_layer_inputs() -> None:
    from builders.gemma import Gemma3Model, Gemma4Model

    def make_embedding(make_embedding: Any) -> Any:
        def and_per_layer_inputs(self: Any, embedding: Any) -> None:
            text = _per_layer_embedder(self.weights)
            if text is None:
                return make_embedding(self, embedding)
            if embedding is text.embed_tokens_per_layer.weight:  # the builder takes any table of the vocabulary's rows
                return None
            make_embedding(self, embedding)
            self.per_layer_inputs = _make_per_layer_inputs(self, text)
            return None

        return and_per_layer_inputs

    def _make_per_layer_inputs(self: Any, text: Any) -> str:
        """[batch, sequence, layers, width]: each token's own embedding for every layer, plus a
        projection of its main embedding, normed, the two averaged (transformers'
        get_per_layer_inputs and project_per_layer_inputs)."""
        width, layers = text.hidden_size_per_layer_input, text.config.num_hidden_layers
        dtype, seq = self.io_dtype, ["batch_size", "sequence_length"]
        packed, split = [*seq, layers * width], [*seq, layers, width]
        base = "/model/per_layer_inputs"
        gathered = _per_layer_table_lookup(self, text.embed_tokens_per_layer.weight, f"{base}/Gather", packed)
        to_split = f"/model/constants/INT64/[0, 0, {layers}, {width}]"
        number = f"/model/constants/{self.to_str_dtype(dtype)}"
        scale = text.embed_tokens_per_layer.scalar_embed_scale
        # Gemma 4 keeps these scales as floats, Gemma 3n as buffers of another name.
        projection_scale = float(getattr(text, "per_layer_model_projection_scale", None) or
                                 text.per_layer_projection_scale)  # fmt: skip
        self.make_mul(f"{base}/Mul", [gathered, f"{number}/{scale}"], dtype, packed)
        self.make_reshape(f"{base}/Reshape", [f"{base}/Mul/output_0", to_split], dtype, split)
        embeds = "/model/embed_tokens/Mul/output_0"  # the main embeddings, scaled (io dtype)
        projected = self.make_matmul(text.per_layer_model_projection, f"{base}/projection/MatMul", embeds)
        self.make_mul(f"{base}/projection/Mul", [f"{projected}/output_0", f"{number}/{projection_scale}"], dtype,
                      packed)  # fmt: skip
        self.make_reshape(f"{base}/projection/Reshape", [f"{base}/projection/Mul/output_0", to_split], dtype, split)
        normed = _gemma4_norm(self, "per_layer_projection_norm", f"{base}/projection/Reshape/output_0",
                              text.per_layer_projection_norm.weight, split)  # fmt: skip
        self.make_add(f"{base}/Add", [normed, f"{base}/Reshape/output_0"], dtype, split)
        self.make_mul(f"{base}/Scale", [f"{base}/Add/output_0", f"{number}/{float(text.per_layer_input_scale)}"],
                      dtype, split)  # fmt: skip
        return f"{base}/Scale/output_0"

    def make_layer(make_layer: Any) -> Any:
        def and_per_layer_input(self: Any, layer_id: int, layer: Any) -> None:
            make_layer(self, layer_id, layer)
            if getattr(layer, "per_layer_input_gate", None) is not None:
                _per_layer_input_block(self, layer_id, layer)

        return and_per_layer_input

    def _per_layer_input_block(self: Any, layer_id: int, layer: Any) -> None:
        """After the MLP's residual and before the layer's scalar: the layer's output gates its
        own per-layer input, projected back, normed and added (transformers' Gemma4TextDecoderLayer).
        The residual stream keeps its type (fp32 in an fp16 graph, as Gemma 2's norms leave it)."""
        dtype, base = self.io_dtype, f"/model/layers.{layer_id}/per_layer_input"
        root, skip = self.layernorm_attrs["root_input"], self.layernorm_attrs["skip_input"]
        hidden, width = ["batch_size", "sequence_length", self.hidden_size], layer.hidden_size_per_layer_input
        narrow, stream = [*hidden[:2], width], self.values[root].dtype
        self.make_add(f"{base}/Residual", [root, _as(self, skip, stream, hidden)], stream, hidden)
        output = f"{base}/Residual/output_0"  # the layer's output so far: the new residual
        gate = self.make_matmul(layer.per_layer_input_gate, f"{base}/gate/MatMul", _as(self, output, dtype, hidden))
        self.make_node("Gelu", inputs=[f"{gate}/output_0"], outputs=[f"{base}/Gelu/output_0"], name=f"{base}/Gelu",
                       approximate="tanh")  # fmt: skip  (gelu_pytorch_tanh, Gemma's hidden activation)
        self.make_value(f"{base}/Gelu/output_0", dtype, shape=narrow)
        own = f"/model/constants/INT64/{layer_id}"
        self.make_gather(f"{base}/Gather", [self.per_layer_inputs, own], dtype, narrow, axis=2)
        self.make_mul(f"{base}/Mul", [f"{base}/Gelu/output_0", f"{base}/Gather/output_0"], dtype, narrow)
        projected = self.make_matmul(layer.per_layer_projection, f"{base}/projection/MatMul", f"{base}/Mul/output_0")
        projected = _as(self, f"{projected}/output_0", stream, hidden)
        normed = _gemma4_norm(self, f"layers.{layer_id}.post_per_layer_input_norm", projected,
                              layer.post_per_layer_input_norm.weight, hidden)  # fmt: skip
        self.layernorm_attrs["root_input"], self.layernorm_attrs["skip_input"] = output, normed

    _replace(Gemma4Model, "make_embedding", make_embedding)
    # Gemma 4's make_layer runs Gemma 2's layer (super()), then scales its output: the block goes
    # between the two, so on the class its super() call finds (Gemma 3 has none of its own).
    _replace(Gemma3Model, "make_layer", make_layer)


def gemma4_shared_kv() -> None:
    from builders.gemma import Gemma4Model

    def make(make_input_proj: Any) -> Any:
        def own_or_shared(self: Any, layer_id: int, attention: Any, root_input: str, **kwargs: Any) -> None:
            stored = vars(self).setdefault("_zerolayer_kv", {})  # layer type -> the last layer of it that stores
            if not getattr(attention, "is_kv_shared_layer", False):
                make_input_proj(self, layer_id, attention, root_input, **kwargs)
                if getattr(attention, "store_full_length_kv", False):
                    stored[attention.layer_type] = (layer_id, self.attention_attrs["k_path"],
                                                    self.attention_attrs["v_path"], attention.k_norm)  # fmt: skip
                return
            # Keys and values of the last layer of its type that makes its own, before their norm
            # and rotation: this layer's key norm is that layer's, so its keys come out the same.
            self.attention_attrs["q_path"] = _linear(self, attention.q_proj, f"/model/layers.{layer_id}/attn/q_proj",
                                                     root_input)  # fmt: skip
            source, self.attention_attrs["k_path"], self.attention_attrs["v_path"], attention.k_norm = \
                stored[attention.layer_type]
            vars(self).setdefault("_zerolayer_kv_source", {})[layer_id] = source

        return own_or_shared

    def make_names(make_key_value_cache_names: Any) -> Any:
        def source_s_past(self: Any, layer_id: int) -> tuple[str, str, str, str]:
            """A sharing layer's operator reads its source's past and writes the same keys and values
            at the same positions (present and past share a buffer): the engine binds its present to
            the buffer of the past its operator reads. It has no past inputs of its own."""
            past_k, past_v, present_k, present_v = make_key_value_cache_names(self, layer_id)
            source = vars(self).get("_zerolayer_kv_source", {}).get(layer_id)
            if source is None:
                return past_k, past_v, present_k, present_v
            inputs = self.model.graph.inputs
            for value in [v for v in inputs if v.name in (past_k, past_v)]:
                inputs.remove(value)
            return (*make_key_value_cache_names(self, source)[:2], present_k, present_v)

        return source_s_past

    _replace(Gemma4Model, "make_attention_input_proj", make)
    _replace(Gemma4Model, "make_key_value_cache_names", make_names)


def gemma3n_layers() -> None:
    """Gemma 3n's layers on the builder's Gemma 4 class (gemma3n_as_gemma4 sends them there). Its
    residual stream is AltUp's N streams, carried here as one tensor [batch, sequence, hidden, N]:
    each layer predicts all N from a router of the active one (`altup_active_idx`, the first in the
    published models; each prediction a mix of all N), runs attention and its MLP on it (with a
    low-rank LAuReL branch beside the attention, and in the first layers a sparse MLP gate: only
    what is above the gate's mean plus a number of its standard deviations passes), corrects all N
    by what the layer added, and adds its per-layer input, gated by the active one, to all but the
    first. Before the first layer the streams are the embeddings and
    N - 1 projections of them; after the last, the N averaged, the other N - 1 projected back (each
    projection rescaled to the first stream's magnitude). transformers' Gemma3nTextDecoderLayer and
    Gemma3nTextModel, step by step."""
    from builders.gemma import Gemma4MoEModel

    def make(make_layer: Any) -> Any:
        def altup_or_gemma4(self: Any, layer_id: int, layer: Any) -> None:
            import onnx_ir as ir

            if getattr(layer, "altup", None) is None:
                make_layer(self, layer_id, layer)
                return
            text = _per_layer_embedder(self.weights)
            if layer_id == 0:
                self.altup_streams = _altup_streams(self, text, "/model/altup_projections",
                                                    "/model/embed_tokens/Mul/output_0")  # fmt: skip
            _gemma3n_layer(self, layer_id, layer)
            if layer_id == self.num_layers - 1:  # the final norm adds its two inputs: each half the mean
                half = _altup_mean(self, text, "/model/altup_unembed_projections", self.altup_streams)
                # In the norm's type: an fp16 graph's norms take fp32, as Gemma 2's.
                half = _as(self, half, ir.DataType.FLOAT if self.layernorm_attrs["cast"]["use_fp32"] else self.io_dtype,
                           _hidden(self))  # fmt: skip
                self.layernorm_attrs.update(root_input=half, skip_input=half, last_layernorm=True)

        return altup_or_gemma4

    _replace(Gemma4MoEModel, "make_layer", make)


def _hidden(self: Any, *last: int) -> list[Any]:
    return ["batch_size", "sequence_length", *(last or (self.hidden_size,))]


def _number(self: Any, value: float) -> str:
    return f"/model/constants/{self.to_str_dtype(self.io_dtype)}/{value}"


def _stream(self: Any, name: str, streams: str, index: int) -> str:
    """Stream `index` [batch, sequence, hidden] of the stacked streams."""
    self.make_gather(name, [streams, f"/model/constants/INT64/{index}"], self.io_dtype, _hidden(self), axis=3)
    return f"{name}/output_0"


def _rms(self: Any, name: str, value: str, floored: bool = True) -> str:
    """sqrt(mean(value^2)) over the hidden axis (kept), floored as transformers floors a
    projection's (at sqrt(1e-5)) unless `floored` is false."""
    shape = _hidden(self, 1)
    self.make_mul(f"{name}/Square", [value, value], self.io_dtype, _hidden(self))
    self.make_reduce_mean(f"{name}/Mean", [f"{name}/Square/output_0", "/model/constants/INT64/[-1]"],
                          self.io_dtype, shape, keepdims=True)  # fmt: skip
    mean = f"{name}/Mean/output_0"
    if floored:
        self.make_node("Max", inputs=[mean, _number(self, 1e-5)], outputs=[f"{name}/Max/output_0"], name=f"{name}/Max")
        self.make_value(f"{name}/Max/output_0", self.io_dtype, shape=shape)
        mean = f"{name}/Max/output_0"
    self.make_sqrt(f"{name}/Sqrt", [mean], self.io_dtype, shape)
    return f"{name}/Sqrt/output_0"


def _rescaled(self: Any, name: str, value: str, target: str) -> str:
    """`value` scaled to the magnitude `target` (an RMS over the hidden axis)."""
    self.make_div(f"{name}/Ratio", [target, _rms(self, f"{name}/RMS", value)], self.io_dtype, _hidden(self, 1))
    self.make_mul(f"{name}/Mul", [value, f"{name}/Ratio/output_0"], self.io_dtype, _hidden(self))
    return f"{name}/Mul/output_0"


def _unsqueezed(self: Any, name: str, value: str, axis: int, shape: list[Any]) -> str:
    self.make_unsqueeze(name, [value, f"/model/constants/INT64/[{axis}]"], self.io_dtype, shape)
    return f"{name}/output_0"


def _altup_streams(self: Any, text: Any, base: str, embeddings: str) -> str:
    """The embeddings and N - 1 projections of them, each at the embeddings' magnitude, stacked
    [batch, sequence, hidden, N]."""
    n = len(text.altup_projections) + 1
    # (The embeddings' magnitude is unfloored: transformers floors only the projections'.)
    target = _rms(self, f"{base}/target", embeddings, floored=False)
    streams = [embeddings]
    for i, projection in enumerate(text.altup_projections):
        projected = f"{self.make_matmul(projection, f'{base}.{i}/MatMul', embeddings)}/output_0"
        streams.append(_rescaled(self, f"{base}.{i}", projected, target))
    stacked = [_unsqueezed(self, f"{base}/Unsqueeze_{i}", v, -1, _hidden(self, self.hidden_size, 1))
               for i, v in enumerate(streams)]  # fmt: skip
    self.make_concat(f"{base}/Concat", stacked, self.io_dtype, _hidden(self, self.hidden_size, n), axis=-1)
    return f"{base}/Concat/output_0"


def _altup_mean(self: Any, text: Any, base: str, streams: str) -> str:
    """Half the mean of stream 0 and the other streams projected back (each at stream 0's
    magnitude): the final norm's two inputs, which it adds."""
    first = _stream(self, f"{base}/stream_0", streams, 0)
    target = _rms(self, f"{base}/target", first)
    total = first
    for i, projection in enumerate(text.altup_unembed_projections):
        stream = _stream(self, f"{base}/stream_{i + 1}", streams, i + 1)
        projected = f"{self.make_matmul(projection, f'{base}.{i}/MatMul', stream)}/output_0"
        rescaled = _rescaled(self, f"{base}.{i}", projected, target)
        self.make_add(f"{base}/Sum_{i}", [total, rescaled], self.io_dtype, _hidden(self))
        total = f"{base}/Sum_{i}/output_0"
    count = len(text.altup_unembed_projections) + 1
    self.make_mul(f"{base}/Half", [total, _number(self, 0.5 / count)], self.io_dtype, _hidden(self))
    return f"{base}/Half/output_0"


def _router(self: Any, altup: Any, base: str, value: str) -> str:
    """tanh(modality_router(router_norm(value) / hidden)): [batch, sequence, N]. Its small
    matmuls stay float in a quantized build (a handful of coefficients steer every stream)."""
    n = altup.modality_router.weight.shape[0]
    normed = _gemma4_norm(self, f"{base[len('/model/'):].replace('/', '.')}.router_norm", value,
                          altup.router_norm.weight, _hidden(self))  # fmt: skip
    self.make_mul(f"{base}/Scale", [normed, _number(self, float(altup.router_input_scale))], self.io_dtype,
                  _hidden(self))  # fmt: skip
    altup.modality_router.exclude_from_quantization = True
    routed = f"{self.make_matmul(altup.modality_router, f'{base}/modality_router/MatMul', f'{base}/Scale/output_0')}"
    self.make_tanh(f"{base}/Tanh", f"{routed}/output_0", self.io_dtype, _hidden(self, n))
    return f"{base}/Tanh/output_0"


def _gemma3n_mlp(self: Any, layer_id: int, mlp: Any, value: str) -> str:
    """down(gelu_tanh(gate) * up), the gate made sparse where the layer's sparsity is set: less
    its mean plus its standard deviation times the normal quantile of the sparsity, then ReLU."""
    from statistics import NormalDist

    base, width = f"/model/layers.{layer_id}/mlp", mlp.gate_proj.weight.shape[0]
    gate = f"{self.make_matmul(mlp.gate_proj, f'{base}/gate_proj/MatMul', value)}/output_0"
    if mlp.activation_sparsity > 0.0:
        axis, column = "/model/constants/INT64/[-1]", _hidden(self, 1)
        self.make_reduce_mean(f"{base}/sparse/Mean", [gate, axis], self.io_dtype, column, keepdims=True)
        self.make_sub(f"{base}/sparse/Centred", [gate, f"{base}/sparse/Mean/output_0"], self.io_dtype,
                      _hidden(self, width))  # fmt: skip
        centred = f"{base}/sparse/Centred/output_0"
        self.make_mul(f"{base}/sparse/Square", [centred, centred], self.io_dtype, _hidden(self, width))
        self.make_reduce_mean(f"{base}/sparse/Variance", [f"{base}/sparse/Square/output_0", axis], self.io_dtype,
                              column, keepdims=True)  # fmt: skip
        self.make_sqrt(f"{base}/sparse/Std", [f"{base}/sparse/Variance/output_0"], self.io_dtype, column)
        quantile = NormalDist().inv_cdf(float(mlp.activation_sparsity))
        self.make_mul(f"{base}/sparse/Cutoff", [f"{base}/sparse/Std/output_0", _number(self, quantile)],
                      self.io_dtype, column)  # fmt: skip
        self.make_sub(f"{base}/sparse/Sub", [centred, f"{base}/sparse/Cutoff/output_0"], self.io_dtype,
                      _hidden(self, width))  # fmt: skip
        self.make_node("Relu", inputs=[f"{base}/sparse/Sub/output_0"], outputs=[f"{base}/sparse/Relu/output_0"],
                       name=f"{base}/sparse/Relu")  # fmt: skip
        self.make_value(f"{base}/sparse/Relu/output_0", self.io_dtype, shape=_hidden(self, width))
        gate = f"{base}/sparse/Relu/output_0"
    self.make_node("Gelu", inputs=[gate], outputs=[f"{base}/Gelu/output_0"], name=f"{base}/Gelu", approximate="tanh")
    self.make_value(f"{base}/Gelu/output_0", self.io_dtype, shape=_hidden(self, width))
    up = f"{self.make_matmul(mlp.up_proj, f'{base}/up_proj/MatMul', value)}/output_0"
    self.make_mul(f"{base}/Mul", [f"{base}/Gelu/output_0", up], self.io_dtype, _hidden(self, width))
    return f"{self.make_matmul(mlp.down_proj, f'{base}/down_proj/MatMul', f'{base}/Mul/output_0')}/output_0"


def _gemma3n_layer(self: Any, layer_id: int, layer: Any) -> None:
    """One Gemma 3n layer on self.altup_streams (see gemma3n_layers)."""
    dtype, base, altup = self.io_dtype, f"/model/layers.{layer_id}", layer.altup
    n, hidden = altup.correction_coefs.weight.shape[0], _hidden(self)
    active_index = self.weights.config.get_text_config().altup_active_idx  # the stream the layer runs on
    stacked = _hidden(self, self.hidden_size, n)
    streams = self.altup_streams

    def norm(name: str, module: Any, value: str) -> str:
        return _gemma4_norm(self, f"layers.{layer_id}.{name}", value, module.weight, hidden)

    def add(name: str, a: str, b: str, shape: list[Any] = hidden) -> str:
        self.make_add(f"{base}/{name}", [a, b], dtype, shape)
        return f"{base}/{name}/output_0"

    # Predict: each stream plus a mix of all of them, by coefficients routed from the active one.
    modalities = _router(self, altup, f"{base}/altup/predict", _stream(self, f"{base}/altup/active", streams,
                                                                       active_index))  # fmt: skip
    altup.prediction_coefs.exclude_from_quantization = True
    coefs = f"{self.make_matmul(altup.prediction_coefs, f'{base}/altup/prediction_coefs/MatMul', modalities)}/output_0"
    self.make_reshape(f"{base}/altup/coefs/Reshape", [coefs, f"/model/constants/INT64/[0, 0, {n}, {n}]"], dtype,
                      _hidden(self, n, n))  # fmt: skip  (row j: the weights of each stream in stream j)
    self.make_transpose(f"{base}/altup/coefs/Transpose", f"{base}/altup/coefs/Reshape/output_0", dtype,
                        _hidden(self, n, n), [0, 1, 3, 2])  # fmt: skip
    self.make_node("MatMul", inputs=[streams, f"{base}/altup/coefs/Transpose/output_0"],
                   outputs=[f"{base}/altup/mix/output_0"], name=f"{base}/altup/mix")  # fmt: skip
    self.make_value(f"{base}/altup/mix/output_0", dtype, shape=stacked)
    predictions = add("altup/predictions", f"{base}/altup/mix/output_0", streams, stacked)
    active = _stream(self, f"{base}/altup/predicted", predictions, active_index)

    # The layer on the active stream: attention beside LAuReL, then the MLP.
    normed = norm("input_layernorm", layer.input_layernorm, active)
    left = f"{self.make_matmul(layer.laurel.linear_left, f'{base}/laurel/linear_left/MatMul', normed)}/output_0"
    right = f"{self.make_matmul(layer.laurel.linear_right, f'{base}/laurel/linear_right/MatMul', left)}/output_0"
    laurel = add("laurel/Add", normed, norm("laurel.post_laurel_norm", layer.laurel.post_laurel_norm, right))
    self.make_attention(layer_id, layer.self_attn, root_input=normed)
    attention = norm("post_attention_layernorm", layer.post_attention_layernorm, self.layernorm_attrs["skip_input"])
    gated = add("attention/residual", active, attention)
    self.make_mul(f"{base}/laurel/Mean", [add("laurel/Sum", gated, laurel), _number(self, 2**-0.5)], dtype, hidden)
    mixed = f"{base}/laurel/Mean/output_0"
    mlp = _gemma3n_mlp(self, layer_id, layer.mlp, norm("pre_feedforward_layernorm", layer.pre_feedforward_layernorm,
                                                        mixed))  # fmt: skip
    activated = add("mlp/residual", mixed, norm("post_feedforward_layernorm", layer.post_feedforward_layernorm, mlp))

    # Correct: every prediction moves by what the layer added to the active one, scaled per stream.
    modalities = _router(self, altup, f"{base}/altup/correct", activated)
    altup.correction_coefs.exclude_from_quantization = True
    scales = f"{self.make_matmul(altup.correction_coefs, f'{base}/altup/correction_coefs/MatMul', modalities)}"
    self.make_add(f"{base}/altup/scales/Add", [f"{scales}/output_0", _number(self, 1.0)], dtype, _hidden(self, n))
    self.make_sub(f"{base}/altup/innovation", [activated, active], dtype, hidden)
    innovation = _unsqueezed(self, f"{base}/altup/innovation/Unsqueeze", f"{base}/altup/innovation/output_0", -1,
                             _hidden(self, self.hidden_size, 1))  # fmt: skip
    scales = _unsqueezed(self, f"{base}/altup/scales/Unsqueeze", f"{base}/altup/scales/Add/output_0", 2,
                         _hidden(self, 1, n))  # fmt: skip
    self.make_mul(f"{base}/altup/correction", [innovation, scales], dtype, stacked)
    corrected = add("altup/corrected", f"{base}/altup/correction/output_0", predictions, stacked)

    # The per-layer input, gated by the corrected active stream, added to all streams but the first.
    first = _stream(self, f"{base}/altup/first", corrected, active_index)
    if self.weights.config.get_text_config().altup_correct_scale:
        scale = f"model.layers.{layer_id}.altup.correct_output_scale"
        self.make_initializer(altup.correct_output_scale, scale, to=dtype)
        self.make_mul(f"{base}/altup/first/Scale", [first, scale], dtype, hidden)
        first = f"{base}/altup/first/Scale/output_0"
    width = layer.hidden_size_per_layer_input
    gate = f"{self.make_matmul(layer.per_layer_input_gate, f'{base}/per_layer_input/gate/MatMul', first)}/output_0"
    self.make_node("Gelu", inputs=[gate], outputs=[f"{base}/per_layer_input/Gelu/output_0"],
                   name=f"{base}/per_layer_input/Gelu", approximate="tanh")  # fmt: skip
    self.make_value(f"{base}/per_layer_input/Gelu/output_0", dtype, shape=_hidden(self, width))
    self.make_gather(f"{base}/per_layer_input/Gather", [self.per_layer_inputs, f"/model/constants/INT64/{layer_id}"],
                     dtype, _hidden(self, width), axis=2)  # fmt: skip
    self.make_mul(f"{base}/per_layer_input/Mul", [f"{base}/per_layer_input/Gelu/output_0",
                  f"{base}/per_layer_input/Gather/output_0"], dtype, _hidden(self, width))  # fmt: skip
    projected = self.make_matmul(layer.per_layer_projection, f"{base}/per_layer_input/projection/MatMul",
                                 f"{base}/per_layer_input/Mul/output_0")  # fmt: skip
    own = norm("post_per_layer_input_norm", layer.post_per_layer_input_norm, f"{projected}/output_0")
    others = "model.altup.others"  # 0 for the first stream, 1 for the rest (whichever is active)
    if layer_id == 0:  # one constant all layers share
        self.make_initializer(_ones_but_first(n), others, to=dtype)
    self.make_mul(f"{base}/per_layer_input/Spread", [_unsqueezed(self, f"{base}/per_layer_input/Unsqueeze", own, -1,
                  _hidden(self, self.hidden_size, 1)), others], dtype, stacked)  # fmt: skip
    self.altup_streams = add("altup/out", corrected, f"{base}/per_layer_input/Spread/output_0", stacked)
    self.layernorm_attrs["first_layernorm"] = False


def _ones_but_first(n: int) -> Any:
    import torch

    ones = torch.ones(n)
    ones[0] = 0.0
    return ones


def _int64s(*dims: int) -> str:
    """The builder's constant of these int64s (a shape)."""
    return f"/model/constants/INT64/{list(dims)}"


def _linear(self: Any, module: Any, base: str, value: str) -> str:
    """A Linear on `value` as the builder writes one: `base`/MatMul, then `base`/Add of its bias
    where it has one; the output's name."""
    value = f"{self.make_matmul(module, f'{base}/MatMul', value)}/output_0"
    if module.bias is None:
        return value
    self.make_add_bias(module.bias, f"{base}/Add", root_input=value)
    return f"{base}/Add/output_0"


def _causal_conv(self: Any, layer_id: int, conv1d: Any, base: str, value: str) -> str:
    """A Mamba layer's causal depthwise convolution (SiLU after it) of `value` [batch, sequence,
    channels], whose last positions are the layer's conv state; the output, in the same layout."""
    import torch

    dtype, channels, weights = self.io_dtype, conv1d.weight.shape[0], f"model.layers.{layer_id}.mamba.conv1d"
    self.make_transpose(f"{base}/conv_in/Transpose", value, dtype, ["batch_size", channels, "sequence_length"],
                        [0, 2, 1])  # fmt: skip
    self.make_initializer(conv1d.weight, f"{weights}.weight", to=dtype)
    self.make_initializer(conv1d.bias if conv1d.bias is not None else torch.zeros(channels), f"{weights}.bias",
                          to=dtype)  # fmt: skip
    self.make_causal_conv_with_state(f"{base}/CausalConvWithState", root_input=f"{base}/conv_in/Transpose/output_0",
                                     weight=f"{weights}.weight", bias=f"{weights}.bias", channels=channels,
                                     past_conv_state=self.input_names["past.conv"][layer_id],
                                     present_conv_state=self.output_names["present.conv"][layer_id])  # fmt: skip
    self.make_transpose(f"{base}/conv_out/Transpose", f"{base}/CausalConvWithState/output_0", dtype,
                        ["batch_size", "sequence_length", channels], [0, 2, 1])  # fmt: skip
    return f"{base}/conv_out/Transpose/output_0"


def _scan(self: Any, layer_id: int, base: str, shared: dict[str, str], values: str, decay: str, heads: int) -> str:
    """A Mamba layer's selective scan as ONNX Runtime's linear attention, its gated rule: the
    layer's recurrent state decays by exp(`decay`) and gains keys (shared["k"]) times `values`, and
    queries (shared["q"]) read it; `heads` heads of both, no scaling. The output's name."""
    self.make_linear_attention(f"{base}/LinearAttention", q_path=shared["q"], k_path=shared["k"], v_path=values,
                               decay=decay, beta="", q_num_heads=heads, kv_num_heads=heads, update_rule="gated",
                               past_recurrent_state=self.input_names["past.recurrent"][layer_id],
                               present_recurrent_state=self.output_names["present.recurrent"][layer_id],
                               scale=1.0)  # fmt: skip
    return f"{base}/LinearAttention/output_0"


def _make_mamba(self: Any, layer_id: int, mamba: Any, root_input: str) -> None:
    """A Mamba 2 mixer (transformers' GraniteMoeHybridMambaLayer, NemotronHMamba2Mixer): the input
    projection split into a gate, the convolved x, B and C, and each head's time step; the scan as
    gated linear attention (the state decays by exp(dt * A) and gains (dt * x) B^T; the output
    reads it with C: Mamba 2's recurrence, B and C shared by each group's heads); D's skip; the
    gate, a norm per group."""
    import torch

    dtype, base, weights = self.io_dtype, f"/model/layers.{layer_id}/mamba", f"model.layers.{layer_id}.mamba"
    seq, heads, width = ["batch_size", "sequence_length"], mamba.num_heads, mamba.head_dim
    inner, groups, state = mamba.intermediate_size, mamba.n_groups, mamba.ssm_state_size
    conv_dim, per_group, group_width, bc = mamba.conv_dim, heads // groups, inner // groups, groups * state

    gate, xbc, dt = (f"{base}/in_proj/Split/output_{i}" for i in range(3))
    self.make_split(f"{base}/in_proj/Split", [_linear(self, mamba.in_proj, f"{base}/in_proj", root_input),
                    _int64s(inner, conv_dim, heads)], [gate, xbc, dt], [dtype] * 3,
                    [[*seq, inner], [*seq, conv_dim], [*seq, heads]])  # fmt: skip

    xbc = _causal_conv(self, layer_id, mamba.conv1d, base, xbc)
    x, b, c = (f"{base}/conv_out/Split/output_{i}" for i in range(3))
    self.make_split(f"{base}/conv_out/Split", [xbc, _int64s(inner, bc, bc)],
                    [x, b, c], [dtype] * 3, [[*seq, inner], [*seq, bc], [*seq, bc]])  # fmt: skip

    # dt = softplus(dt + dt_bias); the decay's log dt * A, A = -exp(A_log), per head.
    self.make_initializer(mamba.dt_bias, f"{weights}.dt_bias", to=dtype)
    self.make_add(f"{base}/dt/Add", [dt, f"{weights}.dt_bias"], dtype, [*seq, heads])
    self.make_softplus(f"{base}/dt/Softplus", f"{base}/dt/Add/output_0", dtype, [*seq, heads])
    dt = f"{base}/dt/Softplus/output_0"
    self.make_initializer(-torch.exp(mamba.A_log.float()), f"{weights}.A", to=dtype)
    self.make_mul(f"{base}/decay/Mul", [dt, f"{weights}.A"], dtype, [*seq, heads])

    # Values dt * x, per head; keys B and queries C, each group's repeated for its heads.
    by_head = [*seq, heads, width]
    self.make_reshape(f"{base}/x/Reshape", [x, _int64s(0, 0, heads, width)], dtype, by_head)
    x = f"{base}/x/Reshape/output_0"
    self.make_unsqueeze(f"{base}/dt/Unsqueeze", [dt, _int64s(-1)], dtype, [*seq, heads, 1])
    self.make_mul(f"{base}/v/Mul", [x, f"{base}/dt/Unsqueeze/output_0"], dtype, by_head)
    self.make_reshape(f"{base}/v/Reshape", [f"{base}/v/Mul/output_0", _int64s(0, 0, inner)], dtype, [*seq, inner])
    shared = {}
    for tag, source in (("k", b), ("q", c)):
        self.make_reshape(f"{base}/{tag}/Reshape", [source, _int64s(0, 0, groups, 1, state)], dtype,
                          [*seq, groups, 1, state])  # fmt: skip
        self.make_expand(f"{base}/{tag}/Expand", [f"{base}/{tag}/Reshape/output_0", _int64s(1, 1, 1, per_group, 1)],
                         dtype, [*seq, groups, per_group, state])  # fmt: skip
        self.make_reshape(f"{base}/{tag}/Reshape_heads", [f"{base}/{tag}/Expand/output_0",
                          _int64s(0, 0, heads * state)], dtype, [*seq, heads * state])  # fmt: skip
        shared[tag] = f"{base}/{tag}/Reshape_heads/output_0"
    scanned = _scan(self, layer_id, base, shared, f"{base}/v/Reshape/output_0", f"{base}/decay/Mul/output_0", heads)

    # y + D x (D per head); then the gate, silu(gate) times it, and an RMS norm over each group's
    # channels, scaled: after the gate (Granite's, Nemotron-H's), before it, or none (Falcon-H1's options).
    self.make_initializer(mamba.D.reshape(heads, 1), f"{weights}.D", to=dtype)
    self.make_mul(f"{base}/D/Mul", [x, f"{weights}.D"], dtype, by_head)
    self.make_reshape(f"{base}/D/Reshape", [f"{base}/D/Mul/output_0", _int64s(0, 0, inner)], dtype, [*seq, inner])
    self.make_add(f"{base}/D/Add", [scanned, f"{base}/D/Reshape/output_0"], dtype, [*seq, inner])
    self.make_sigmoid(f"{base}/gate/Sigmoid", gate, dtype, [*seq, inner])
    self.make_mul(f"{base}/gate/SiLU", [gate, f"{base}/gate/Sigmoid/output_0"], dtype, [*seq, inner])

    def gated(value: str) -> str:
        self.make_mul(f"{base}/gate/Mul", [value, f"{base}/gate/SiLU/output_0"], dtype, [*seq, inner])
        return f"{base}/gate/Mul/output_0"

    def normed(value: str) -> str:
        self.make_reshape(f"{base}/norm/Reshape", [value, _int64s(0, 0, groups, group_width)], dtype,
                          [*seq, groups, group_width])  # fmt: skip
        grouped = _gemma4_norm(self, f"layers.{layer_id}.mamba.norm.group", f"{base}/norm/Reshape/output_0",
                               torch.ones(group_width), [*seq, groups, group_width],
                               mamba.norm.variance_epsilon)  # fmt: skip
        self.make_reshape(f"{base}/norm/Reshape_back", [grouped, _int64s(0, 0, inner)], dtype, [*seq, inner])
        self.make_initializer(mamba.norm.weight, f"{weights}.norm.weight", to=dtype)
        self.make_mul(f"{base}/norm/Mul", [f"{base}/norm/Reshape_back/output_0", f"{weights}.norm.weight"], dtype,
                      [*seq, inner])  # fmt: skip
        return f"{base}/norm/Mul/output_0"

    y = f"{base}/D/Add/output_0"
    if not getattr(mamba, "mamba_rms_norm", True):
        y = gated(y)
    elif getattr(mamba.norm, "norm_before_gate", False):
        y = gated(normed(y))
    else:
        y = normed(gated(y))
    self.layernorm_attrs["skip_input"] = _linear(self, mamba.out_proj, f"{base}/out_proj", y)


def _make_mamba1(self: Any, layer_id: int, mamba: Any, root_input: str) -> None:
    """A Mamba (1) mixer (transformers' JambaMambaMixer): the input projection split into x and a
    gate; x convolved (SiLU after) and projected to a low-rank time step, B and C (each RMS-normed
    where the mixer has norms, as Jamba's); dt = softplus(dt_proj(...)) per channel; the scan as
    gated linear attention with a head per channel, one value each: the state decays by
    exp(dt * A) per state dimension and gains dt * x B; the output reads it with C; D's skip, the
    gate."""
    import torch

    dtype, base, weights = self.io_dtype, f"/model/layers.{layer_id}/mamba", f"model.layers.{layer_id}.mamba"
    seq, inner, state, rank = ["batch_size", "sequence_length"], mamba.intermediate_size, mamba.ssm_state_size, \
        mamba.time_step_rank
    wide = [*seq, inner]

    x, gate = f"{base}/in_proj/Split/output_0", f"{base}/in_proj/Split/output_1"
    projected = _linear(self, mamba.in_proj, f"{base}/in_proj", root_input)
    self.make_split(f"{base}/in_proj/Split", [projected, _int64s(inner, inner)], [x, gate], [dtype] * 2,
                    [wide, wide])  # fmt: skip
    x = _causal_conv(self, layer_id, mamba.conv1d, base, x)

    low, b, c = (f"{base}/x_proj/Split/output_{i}" for i in range(3))
    self.make_split(f"{base}/x_proj/Split", [_linear(self, mamba.x_proj, f"{base}/x_proj", x),
                    _int64s(rank, state, state)], [low, b, c], [dtype] * 3,
                    [[*seq, rank], [*seq, state], [*seq, state]])  # fmt: skip
    parts = {}
    for name, value, width in (("dt", low, rank), ("b", b, state), ("c", c, state)):
        norm = getattr(mamba, f"{name}_layernorm", None)
        parts[name] = value if norm is None else _gemma4_norm(
            self, f"layers.{layer_id}.mamba.{name}_layernorm", value, norm.weight, [*seq, width],
            norm.variance_epsilon)  # fmt: skip
    self.make_softplus(f"{base}/dt/Softplus", _linear(self, mamba.dt_proj, f"{base}/dt_proj", parts["dt"]), dtype, wide)
    dt = f"{base}/dt/Softplus/output_0"
    self.make_unsqueeze(f"{base}/dt/Unsqueeze", [dt, _int64s(-1)], dtype, [*wide, 1])
    self.make_initializer(-torch.exp(mamba.A_log.float()), f"{weights}.A", to=dtype)
    self.make_mul(f"{base}/decay/Mul", [f"{base}/dt/Unsqueeze/output_0", f"{weights}.A"], dtype, [*wide, state])
    self.make_reshape(f"{base}/decay/Reshape", [f"{base}/decay/Mul/output_0", _int64s(0, 0, inner * state)], dtype,
                      [*seq, inner * state])  # fmt: skip
    self.make_mul(f"{base}/v/Mul", [x, dt], dtype, wide)
    shared = {}
    for tag, source in (("k", parts["b"]), ("q", parts["c"])):  # each channel's head reads the same B and C
        self.make_unsqueeze(f"{base}/{tag}/Unsqueeze", [source, _int64s(2)], dtype, [*seq, 1, state])
        self.make_expand(f"{base}/{tag}/Expand", [f"{base}/{tag}/Unsqueeze/output_0", _int64s(1, 1, inner, 1)], dtype,
                         [*wide, state])  # fmt: skip
        self.make_reshape(f"{base}/{tag}/Reshape", [f"{base}/{tag}/Expand/output_0", _int64s(0, 0, inner * state)],
                          dtype, [*seq, inner * state])  # fmt: skip
        shared[tag] = f"{base}/{tag}/Reshape/output_0"
    scanned = _scan(self, layer_id, base, shared, f"{base}/v/Mul/output_0", f"{base}/decay/Reshape/output_0", inner)
    self.make_initializer(mamba.D, f"{weights}.D", to=dtype)
    self.make_mul(f"{base}/D/Mul", [x, f"{weights}.D"], dtype, wide)
    self.make_add(f"{base}/D/Add", [scanned, f"{base}/D/Mul/output_0"], dtype, wide)
    self.make_sigmoid(f"{base}/gate/Sigmoid", gate, dtype, wide)
    self.make_mul(f"{base}/gate/SiLU", [gate, f"{base}/gate/Sigmoid/output_0"], dtype, wide)
    self.make_mul(f"{base}/gate/Mul", [f"{base}/D/Add/output_0", f"{base}/gate/SiLU/output_0"], dtype, wide)
    self.layernorm_attrs["skip_input"] = _linear(self, mamba.out_proj, f"{base}/out_proj", f"{base}/gate/Mul/output_0")


def granite4_mamba_layers() -> None:
    """The builder's Granite 4 class, with the Mamba 2 layers of Granite 4.0-H (the hybrids) and
    attention without RoPE where the config says so (their `position_embedding_type` "nope")."""
    from builders.granite import GraniteModel, GraniteMoEHybridModel

    def make_init(init: Any) -> Any:
        def keeping_position_type(self: Any, config: Any, *args: Any) -> None:
            init(self, config, *args)
            self.rotates = getattr(config, "position_embedding_type", None) == "rope"
            if self.moe_attrs["num_experts"]:  # SwiGLU experts; the top k's softmax is the router's, renormalized
                self.moe_attrs.update(activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=True)
            _granite_swa_attention(self, config)  # Granite SWA's experts' model

        return keeping_position_type

    def make_caches(make_caches: Any) -> Any:
        def layer_table(self: Any, **kwargs: Any) -> Any:
            return make_caches(self, **_granite_layer_table(self, kwargs))

        return layer_table

    def make_mlp(make_mlp: Any) -> Any:
        def shared_and_experts(self: Any, layer_id: int, mlp: Any, root_input: str) -> None:
            """transformers' GraniteMoeHybridDecoderLayer: the experts' output plus the shared MLP's
            (Granite 3.x MoE's GraniteMoeDecoderLayer: the experts' alone)."""
            moe = getattr(self.current_layer, "block_sparse_moe", None)
            if mlp is not moe:
                make_mlp(self, layer_id, mlp, root_input)
            if moe is None:
                return
            experts = _experts(self, layer_id, moe.router, moe.experts, root_input)
            if mlp is moe:
                self.layernorm_attrs["skip_input"] = experts
            else:
                _add_to_skip(self, f"/model/layers.{layer_id}/moe/Add", experts)

        return shared_and_experts

    def make_layer(make_layer: Any) -> Any:
        def keeping_layer(self: Any, layer_id: int, layer: Any) -> None:
            self.current_layer = layer
            if getattr(layer, "shared_mlp", None) is not None:
                make_layer(self, layer_id, layer)
            else:  # Granite 3.x MoE's layer (or one whose shared MLP is of width 0): Granite's, its experts
                # as its MLP (the class reads the shared one)
                layer.mlp = layer.block_sparse_moe
                GraniteModel.make_layer(self, layer_id, layer)

        return keeping_layer

    def make_attention(make_attention: Any) -> Any:
        def mamba_or_attention(self: Any, layer_id: int, attention: Any, root_input: str, **kwargs: Any) -> None:
            if self.layer_types[layer_id] == "linear_attention":
                _make_mamba(self, layer_id, self.current_layer.mamba, root_input)
            elif self.rotates and _granite_rotates(self, layer_id):
                make_attention(self, layer_id, attention, root_input, **kwargs)
            else:
                with _unrotated(self):
                    make_attention(self, layer_id, attention, root_input, **kwargs)

        return mamba_or_attention

    _replace(GraniteMoEHybridModel, "__init__", make_init)
    _replace(GraniteMoEHybridModel, "make_layer", make_layer)
    _replace(GraniteMoEHybridModel, "make_attention", make_attention)
    _replace(GraniteMoEHybridModel, "make_mlp", make_mlp)
    _replace(GraniteMoEHybridModel, "make_rotary_embedding_caches", make_caches)


# The MoE operator has no ReLU-squared experts; its SwiGLU computes x * sigmoid(alpha * x) * (y + beta)
# of each expert's two projections x and y, which with both the up projection, beta 0 and this alpha is
# x * x where x > 0 and 0 elsewhere, to within x^2 * sigmoid(-alpha |x|): 6e-13 at most.
# (The up projection is then held twice: the experts take half as much memory again as their weights.)
RELU_SQUARED_ALPHA = 1e6


def _score_routing(self: Any, config: Any, **activation: float) -> None:
    """The MoE operator's attributes for experts chosen by scores plus a correction bias and mixed by
    the chosen scores scaled to sum to 1, then by routed_scaling_factor where the config has one
    (_score_routed_experts: Nemotron 3's, GLM-4.5's, DeepSeek V3's, ERNIE 4.5's): SwiGLU experts
    (`activation`: the SwiGLU's alpha and beta, Nemotron 3's)."""
    names = ("routed_scaling_factor", "route_scale", "router_scaling_factor")  # (AFMoE's, Hy3's names)
    scale = float(next((getattr(config, n) for n in names if getattr(config, n, None)), 1.0))
    norm_min = getattr(config, "moe_norm_min", None)  # (ERNIE 4.5's clamp of the chosen scores' sum)
    self.score_sum_floor = (True, float(norm_min)) if norm_min is not None else (False, 1e-20)
    # DeepSeek V3's group-limited choice: the experts in n_group groups, chosen within the topk_group best
    self.expert_groups = (int(getattr(config, "n_group", None) or 1), int(getattr(config, "topk_group", None) or 1))
    self.moe_attrs.update(activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=True,
                          use_expert_bias=True, routed_scaling_factor=scale,
                          router_sentinel=-10000.0, **activation)  # (LFM2-MoE's: far below any log-sigmoid)


def _score_routed_experts(self: Any, layer_id: int, gate: Any, bias: Any, gate_up: Any, down: Any, root_input: str,
                          experts_input: str, softmax: bool = False) -> None:
    """Experts routed as LFM2-MoE's, whose routing the builder's LFM2-MoE class writes (_score_routing),
    but for the scale of their mix (_mix_scale, the family's own): chosen by the sigmoid of the
    router's logits (or, `softmax`, ERNIE 4.5's softmax of them) plus `bias`, mixed by those scores.
    The router reads the stream (`root_input`), the experts (fused gate-and-up weights [experts,
    2 x width, input], down [experts, output, width]) `experts_input`; the operator's output,
    scaled, is left as what the layer adds to the stream."""
    import types

    from builders.lfm2 import LFM2MoEModel as Routing

    gate.exclude_from_quantization = True  # (as LFM2-MoE's: int4 rounding could flip a choice)
    routed = types.SimpleNamespace(gate=gate, expert_bias=bias,
                                   experts=types.SimpleNamespace(gate_up_proj=gate_up, down_proj=down))  # fmt: skip
    self.moe_intermediate_size = int(gate_up.shape[1]) // 2
    with _declared_widths(self, hidden_size=int(gate_up.shape[2])):  # (the experts' input: the stream, or a latent)
        self.make_interleaved_swiglu_moe_preprocessing(layer_id, routed)
        scores = (_softmax_scores if softmax else Routing.make_moe_router_scores)(self, layer_id, routed, root_input)
        chosen = _expert_choice(self, layer_id, routed, scores)
        weights = Routing.make_moe_router_selected_scores(self, layer_id, scores, chosen)
        probs = Routing.make_moe_router_mask(self, layer_id, scores, chosen, weights)
        Routing.make_moe_subgraph(self, layer_id, routed, experts_input, probs,
                                  _mix_scale(self, layer_id, weights, root_input))  # fmt: skip


def _expert_choice(self: Any, layer_id: int, routed: Any, scores: str) -> str:
    """The chosen experts' indices [rows, top_k]: the top k of the scores plus the correction bias, as
    the builder's LFM2-MoE class chooses them, where the experts form one group; else DeepSeek V3's
    group-limited choice (_score_routing's expert_groups), as transformers makes it for every family
    routed so: each group ranked by the sum of its two best biased scores, the experts of all but
    the topk_group best groups masked below any score, then the top k."""
    import onnx_ir as ir
    from builders.lfm2 import LFM2MoEModel as Routing

    groups, kept = self.expert_groups
    if kept >= groups:
        return str(Routing.make_moe_router_selection(self, layer_id, routed, scores))
    base, experts = f"/model/layers.{layer_id}/moe/router", self.moe_attrs["num_experts"]
    rows, per_group = self.make_moe_router_shape()[0], experts // groups
    float32 = ir.DataType.FLOAT
    biased = scores
    if self.moe_attrs["use_expert_bias"]:
        bias = f"model.layers.{layer_id}.moe.expert_bias"
        self.make_initializer(routed.expert_bias, bias, to=float32)
        self.make_add(f"{base}/Add", [scores, bias], dtype=float32, shape=[rows, experts])
        biased = f"{base}/Add/output_0"
    grouped = [rows, groups, per_group]
    self.make_reshape(f"{base}/groups/Reshape", [biased, f"/model/constants/INT64/[-1, {groups}, {per_group}]"],
                      dtype=float32, shape=grouped)  # fmt: skip
    by_group = f"{base}/groups/Reshape/output_0"
    self.make_topk(f"{base}/groups/TopK", [by_group, "/model/constants/INT64/[2]"], dtype=float32,
                   shape=[rows, groups, 2])  # fmt: skip
    self.make_reduce_sum(f"{base}/groups/ReduceSum", [f"{base}/groups/TopK/output_0", "/model/constants/INT64/[-1]"],
                         dtype=float32, shape=[rows, groups])  # fmt: skip
    group_scores = f"{base}/groups/ReduceSum/output_0"
    self.make_topk(f"{base}/groups/TopKGroups", [group_scores, f"/model/constants/INT64/[{kept}]"], dtype=float32,
                   shape=[rows, kept])  # fmt: skip
    self.make_node("ReduceMin", inputs=[f"{base}/groups/TopKGroups/output_0", "/model/constants/INT64/[-1]"],
                   outputs=[f"{base}/groups/ReduceMin/output_0"], name=f"{base}/groups/ReduceMin", keepdims=True)
    self.make_value(f"{base}/groups/ReduceMin/output_0", float32, shape=[rows, 1])
    self.make_greater_or_equal(f"{base}/groups/Kept", [group_scores, f"{base}/groups/ReduceMin/output_0"],
                               shape=[rows, groups])  # fmt: skip
    self.make_unsqueeze(f"{base}/groups/Unsqueeze", [f"{base}/groups/Kept/output_0", "/model/constants/INT64/[-1]"],
                        dtype=ir.DataType.BOOL, shape=[rows, groups, 1])  # fmt: skip
    # (transformers masks with -inf; any score of a kept group, a sigmoid or softmax plus a bias, is far above)
    self.make_where(f"{base}/groups/Where", [f"{base}/groups/Unsqueeze/output_0", by_group,
                                             f"/model/constants/FLOAT/{GROUP_MASKED}"], dtype=float32, shape=grouped)
    self.make_reshape(f"{base}/groups/Flatten", [f"{base}/groups/Where/output_0",
                                                 f"/model/constants/INT64/[-1, {experts}]"],
                      dtype=float32, shape=[rows, experts])  # fmt: skip
    top_k = self.moe_attrs["top_k"]
    self.make_topk(f"{base}/TopK", [f"{base}/groups/Flatten/output_0", f"/model/constants/INT64/[{top_k}]"],
                   dtype=float32, shape=[rows, top_k])  # fmt: skip
    return f"{base}/TopK/output_1"


# Where a group-limited choice puts the experts of the groups it leaves out (_expert_choice).
GROUP_MASKED = -1e30


def _mix_scale(self: Any, layer_id: int, chosen_scores: str, root_input: str) -> str:
    """The factor the MoE operator's mix (the chosen scores over their sum) is scaled by, per row: the
    sum over itself plus the family's epsilon (Nemotron 3's, GLM-4.5's, DeepSeek's 1e-20), or over
    itself clamped at it (ERNIE 4.5's moe_norm_min), so 1 but where the chosen scores flushed to
    (nearly) zero, as theirs; times routed_scaling_factor. (LFM2-MoE's class adds 1e-6, its own:
    2.5e-4 off on a tiny ERNIE whose bias chose experts of scores near 0.)"""
    import onnx_ir as ir

    base, rows = f"/model/layers.{layer_id}/moe/router/scale", self.make_moe_router_shape(last_dim=1)
    clamped, epsilon = self.score_sum_floor
    self.make_reduce_sum(f"{base}/ReduceSum", [chosen_scores, "/model/constants/INT64/[-1]"], dtype=ir.DataType.FLOAT,
                         shape=rows, keepdims=True)  # fmt: skip
    total = f"{base}/ReduceSum/output_0"
    floor = f"/model/constants/FLOAT/{epsilon}"
    if clamped:
        self.make_node("Max", inputs=[total, floor], outputs=[f"{base}/Max/output_0"], name=f"{base}/Max")
        self.make_value(f"{base}/Max/output_0", ir.DataType.FLOAT, shape=rows)
        below = f"{base}/Max/output_0"
    else:
        self.make_add(f"{base}/Add", [total, floor], dtype=ir.DataType.FLOAT, shape=rows)
        below = f"{base}/Add/output_0"
    self.make_div(f"{base}/Div", [total, below], dtype=ir.DataType.FLOAT, shape=rows)
    self.make_mul(f"{base}/Mul", [f"{base}/Div/output_0",
                                  f"/model/constants/FLOAT/{float(self.moe_attrs['routed_scaling_factor'])}"],
                  ir.DataType.FLOAT, rows)  # fmt: skip
    scale = _per_row(self, base, f"{base}/Mul/output_0", root_input)
    if self.io_dtype != ir.DataType.FLOAT:
        self.make_cast(f"{base}/Cast", scale, self.io_dtype, shape=self.make_hidden_state_shape(last_dim=1))
        scale = f"{base}/Cast/output_0"
    return scale


def _per_row(self: Any, base: str, value: str, root_input: str) -> str:
    """`value` [rows, 1] reshaped to the stream's (`root_input`'s) leading dimensions and 1, to
    broadcast over its width: its output's name."""
    import onnx_ir as ir

    shape = self.make_hidden_state_shape(last_dim=1)
    self.make_shape(f"{base}/Shape", root_input, shape=[len(shape)])
    self.make_slice(f"{base}/Slice", [f"{base}/Shape/output_0", "/model/constants/INT64/[0]",
                                      "/model/constants/INT64/[-1]"], dtype=ir.DataType.INT64,
                    shape=[len(shape) - 1])  # fmt: skip
    self.make_concat(f"{base}/Concat", [f"{base}/Slice/output_0", "/model/constants/INT64/[1]"],
                     dtype=ir.DataType.INT64, shape=[len(shape)], axis=0)  # fmt: skip
    dtype = self.make_value(value).dtype
    self.make_reshape(f"{base}/Reshape", [value, f"{base}/Concat/output_0"], dtype=dtype, shape=shape)
    return f"{base}/Reshape/output_0"


def _softmax_scores(self: Any, layer_id: int, routed: Any, root_input: str) -> str:
    """The router's softmax over the experts, in float32 (ERNIE 4.5's scores; LFM2-MoE's class writes
    the sigmoid's in the same place): its output's name."""
    import onnx_ir as ir

    base, shape = f"/model/layers.{layer_id}/moe/router", self.make_moe_router_shape()
    logits = f"{self.make_matmul(routed.gate, f'{base}/MatMul', root_input)}/output_0"
    self.make_reshape(f"{base}/Reshape", [logits, f"/model/constants/INT64/{[-1, self.moe_attrs['num_experts']]}"],
                      dtype=self.io_dtype, shape=shape)  # fmt: skip
    logits = f"{base}/Reshape/output_0"
    if self.io_dtype != ir.DataType.FLOAT:
        self.make_cast(f"{base}/Cast", logits, ir.DataType.FLOAT, shape=shape)
        logits = f"{base}/Cast/output_0"
    self.make_softmax(f"{base}/Softmax", logits, ir.DataType.FLOAT, shape)
    return f"{base}/Softmax/output_0"


def _relu_squared_experts(self: Any, layer_id: int, moe: Any, root_input: str) -> None:
    """Nemotron 3's experts' block: sigmoid-routed experts (_score_routed_experts) whose ReLU-squared
    experts are the MoE operator's SwiGLU of the up projection with itself (RELU_SQUARED_ALPHA),
    working on a latent projection of the stream where the model has one (Nemotron 3 Super's: the
    operator told the latent width, the experts' sum projected back); and the shared expert, an
    ungated MLP, added."""
    import torch

    up = moe.experts.up_proj  # [experts, width, hidden]
    base, latent = f"/model/layers.{layer_id}/moe", isinstance(moe.fc1_latent_proj, torch.nn.Linear)
    experts_input = _linear(self, moe.fc1_latent_proj, f"{base}/fc1_latent_proj", root_input) if latent else root_input
    _score_routed_experts(self, layer_id, moe.gate, moe.gate.e_score_correction_bias, torch.cat([up, up], dim=1),
                          moe.experts.down_proj, root_input, experts_input)  # fmt: skip
    if latent:
        self.layernorm_attrs["skip_input"] = _linear(self, moe.fc2_latent_proj, f"{base}/fc2_latent_proj",
                                                     self.layernorm_attrs["skip_input"])  # fmt: skip
    _shared_expert_added(self, layer_id, moe.shared_experts, root_input, partial(_ungated_mlp, self))


def nemotron_h_blocks() -> None:
    """The builder's Nemotron class, with Nemotron-H's blocks where the config is one's: each block a
    norm and one mixer, its output added to the stream: Mamba 2 (_make_mamba), attention without
    RoPE, the ReLU-squared MLP (the class's own), or Nemotron 3's experts (_relu_squared_experts)."""
    import builders
    from builders.nemotron import NemotronModel

    if getattr(builders.NemotronModel, "_zerolayer_blocks", False):
        return

    class NemotronHModel(NemotronModel):
        _zerolayer_blocks = True

        def __init__(self, config: Any, *args: Any) -> None:
            super().__init__(config, *args)
            self.blocks = config.model_type == "nemotron_h"
            if self.blocks:  # RMS norms of their weights as they are (Nemotron's are LayerNorm1P)
                self.layernorm_attrs.update(simple=True, add_offset=0)
                self.intermediate_size = config.intermediate_size  # the builder took the experts'
                _score_routing(self, config, activation_alpha=RELU_SQUARED_ALPHA, activation_beta=0.0)

        def is_layer(self, module: Any) -> bool:
            return bool(super().is_layer(module)) or (self.blocks and type(module).__name__ == "NemotronHBlock")

        def make_mlp_proj(self, layer_id: int, mlp: Any, root_input: str) -> None:
            if self.blocks:
                _ungated_mlp(self, layer_id, mlp, root_input)
            else:
                super().make_mlp_proj(layer_id, mlp, root_input)

        def has_final_norm(self, module: Any, orig_model: Any) -> bool:
            norm = getattr(getattr(orig_model, "model", None), "norm_f", None)
            return bool(super().has_final_norm(module, orig_model)) or (norm is not None and module is norm)

        def make_layer(self, layer_id: int, layer: Any) -> None:
            if not self.blocks:
                return super().make_layer(layer_id, layer)
            normed, kind = _input_norm(self, layer_id, layer.norm, simple=True), self.layer_types[layer_id]
            if kind == "linear_attention":
                _make_mamba(self, layer_id, layer.mixer, normed)
            elif kind == "full_attention":
                with _unrotated(self):
                    self.make_attention(layer_id, layer.mixer, root_input=normed)
            elif kind == "moe":
                _relu_squared_experts(self, layer_id, layer.mixer, normed)
            else:  # "mlp" (build.py refuses the others)
                self.make_mlp(layer_id, layer.mixer, root_input=normed)
            _end_layer(self, layer_id)
            return None

    builders.NemotronModel = NemotronHModel


def falcon_h1_layers() -> None:
    """The builder's Mistral class, with Falcon-H1's layers where the config is one's: a norm, then
    a Mamba 2 mixer (_make_mamba) and attention side by side on its output, their sum added to the
    stream; a norm and the MLP. Its µP multipliers are folded into the weights they scale (the
    attention's input, keys and output; the mixer's input, each projected channel and output; the
    MLP's gate and output), the embedding's and the LM head's into the class's own scales. It also
    gives Jamba's, Cohere's and Mixtral's configs their layers (see this module's docstring)."""
    import types

    import builders
    import torch
    from builders.mistral import MistralModel

    if getattr(builders.MistralModel, "_zerolayer_falcon", False):
        return

    class FalconH1Model(MistralModel):
        _zerolayer_falcon = True

        def __init__(self, config: Any, *args: Any) -> None:
            super().__init__(config, *args)
            self.falcon, self.jamba = config.model_type == "falcon_h1", config.model_type == "jamba"
            self.cohere = config.model_type in ("cohere", "cohere2")
            if self.cohere:  # LayerNorms (no biases), neighbouring pairs rotated, logits scaled
                self.layernorm_attrs["simple"] = False
                self.rope_attrs["interleaved"] = 1
                self.lm_head_attrs["scale"] = config.logit_scale
                # Command R7B's and Command A's global layers have no RoPE where the others slide.
                kinds = list(getattr(config, "layer_types", None) or [])
                self.unrotated = {i for i, kind in enumerate(kinds) if kind == "full_attention"
                                  and "sliding_attention" in kinds}  # fmt: skip
            self.mixtral = config.model_type == "mixtral"
            if self.jamba or self.mixtral:  # experts: SwiGLU, the softmax's top k (Mixtral's scaled to sum to 1)
                self.moe_attrs.update(activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=self.mixtral)
            if not self.falcon:
                return
            self.embed_attrs["scale"], self.lm_head_attrs["scale"] = config.embedding_multiplier, \
                config.lm_head_multiplier
            self.multipliers = {name: getattr(config, name) for name in (
                "attention_in_multiplier", "key_multiplier", "attention_out_multiplier", "ssm_in_multiplier",
                "ssm_out_multiplier", "mlp_multipliers")}  # fmt: skip
            # Every layer ("hybrid") has attention's keys and values and Mamba's states.
            self.layer_types = ["full_attention"] * self.num_layers
            for kind in ("key", "value"):
                self.input_names[f"past_key_values.{kind}"] = self.make_cache_names(["full_attention"],
                                                                                    f"past_key_values.{kind}")
                self.output_names[f"present.{kind}"] = self.make_cache_names(["full_attention"], f"present.{kind}")
            for kind in ("conv", "recurrent"):
                self.input_names[f"past.{kind}"] = {i: f"past.{i}.{kind}" for i in range(self.num_layers)}
                self.output_names[f"present.{kind}"] = {i: f"present.{i}.{kind}" for i in range(self.num_layers)}

        def make_layer(self, layer_id: int, layer: Any) -> None:
            if self.jamba:
                return self._make_jamba_layer(layer_id, layer)
            if self.cohere:
                return self._make_cohere_layer(layer_id, layer)
            if not self.falcon:
                return super().make_layer(layer_id, layer)
            self._fold(layer)
            normed = _input_norm(self, layer_id, layer.input_layernorm, simple=True)
            _make_mamba(self, layer_id, layer.mamba, normed)
            mixed = self.layernorm_attrs["skip_input"]
            self.make_attention(layer_id, layer.self_attn, root_input=normed)
            _add_to_skip(self, f"/model/layers.{layer_id}/mixers/Add", mixed)
            self.make_layernorm(layer_id, layer.pre_ff_layernorm, skip=True, simple=True, location="post_attention")
            self.make_mlp(layer_id, layer.feed_forward, root_input=self.layernorm_attrs["output_0"])
            _end_layer(self, layer_id)
            return None

        get_moe_module = _mlp_of  # Mixtral's experts
        make_moe = _layer_moe

        def make_layernorm(self, layer_id: int, layernorm: Any, skip: bool, simple: bool, location: str) -> None:
            if getattr(self, "cohere", False) and getattr(layernorm, "bias", None) is None:  # Cohere's have none
                layernorm = types.SimpleNamespace(weight=layernorm.weight, bias=torch.zeros_like(layernorm.weight))
            super().make_layernorm(layer_id, layernorm, skip, simple, location)

        def _make_cohere_layer(self, layer_id: int, layer: Any) -> None:
            """transformers' Cohere layers: one norm, and attention and the MLP on its output side by
            side, their sum added to the stream."""
            normed = _input_norm(self, layer_id, layer.input_layernorm, simple=False)
            with _unrotated(self) if layer_id in self.unrotated else contextlib.nullcontext():
                self.make_attention(layer_id, layer.self_attn, root_input=normed)
            attended = self.layernorm_attrs["skip_input"]
            self.make_mlp(layer_id, layer.mlp, root_input=normed)
            _add_to_skip(self, f"/model/layers.{layer_id}/parallel/Add", attended)
            _end_layer(self, layer_id)

        def _make_jamba_layer(self, layer_id: int, layer: Any) -> None:
            """transformers' Jamba layers: a norm, a Mamba mixer or attention without RoPE; a norm, the
            MLP or experts (router and SwiGLU experts, as Granite's)."""
            normed = _input_norm(self, layer_id, layer.input_layernorm, simple=True)
            if getattr(layer, "mamba", None) is not None:
                _make_mamba1(self, layer_id, layer.mamba, normed)
            else:
                with _unrotated(self):
                    self.make_attention(layer_id, layer.self_attn, root_input=normed)
            self.make_layernorm(layer_id, layer.pre_ff_layernorm, skip=True, simple=True, location="post_attention")
            normed, forward = self.layernorm_attrs["output_0"], layer.feed_forward
            if getattr(forward, "router", None) is None:
                self.make_mlp(layer_id, forward, root_input=normed)
            else:
                self.layernorm_attrs["skip_input"] = _experts(self, layer_id, forward.router, forward.experts, normed)
            _end_layer(self, layer_id)

        def _fold(self, layer: Any) -> None:
            m, attention, mixer, mlp = self.multipliers, layer.self_attn, layer.mamba, layer.feed_forward
            gate, down = m["mlp_multipliers"]
            rows = mixer.mup_vector.reshape(-1)
            scales = [(attention.q_proj, m["attention_in_multiplier"], 1.0),
                      (attention.k_proj, m["attention_in_multiplier"] * m["key_multiplier"], m["key_multiplier"]),
                      (attention.v_proj, m["attention_in_multiplier"], 1.0),
                      (attention.o_proj, m["attention_out_multiplier"], m["attention_out_multiplier"]),
                      (mixer.in_proj, rows[:, None] * m["ssm_in_multiplier"], rows),
                      (mixer.out_proj, m["ssm_out_multiplier"], m["ssm_out_multiplier"]),
                      (mlp.gate_proj, gate, gate), (mlp.down_proj, down, down)]  # fmt: skip
            with torch.no_grad():
                for linear, weight_scale, bias_scale in scales:
                    linear.weight.mul_(weight_scale)
                    if linear.bias is not None:
                        linear.bias.mul_(bias_scale)

    builders.MistralModel = FalconH1Model


def _fix_config(config: Any) -> Any:
    config = qwen3_next.as_qwen3_5_moe_config(language_model_alone(config))
    text = getattr(config, "text_config", None)
    for c in (config, text) if text is not None else (config,):
        for fix in FIXES:
            fix(c)
    return config


def install() -> None:
    """Put the fixes in place (before the builder module runs and imports what it uses)."""
    import importlib
    import sys

    if "rope_theta" not in vars(PretrainedConfig):
        PretrainedConfig.rope_theta = property(_get, _set)  # type: ignore[attr-defined]

    # The builder's own modules first: importing them puts a new `transformers` module object in
    # sys.modules (transformers 5's lazy loading), and the builder imports AutoConfig from that one.
    importlib.import_module("onnxruntime_genai.models")  # puts the builder's folder on sys.path
    importlib.import_module("builders")
    gemma_embedding_scale()
    gpt_oss_layer_types()
    olmo_layer_norm()
    smollm3_no_rope_layers()
    rope_types_past_llama3()
    yarn_as_transformers()
    gemma3_plain_local_rope()
    lm_head_is_the_model_s()
    qwen35_text_positions()
    qwen35_l2norm_epsilon()
    qwen3_moe_layers()
    hunyuan_moe_layers()
    post_norm_layers()
    gemma4_dense_mlp()
    gemma4_per_layer_inputs()
    gemma4_shared_kv()
    gemma3n_layers()
    load_language_model_alone()
    granite4_mamba_layers()
    nemotron_h_blocks()
    falcon_h1_layers()
    granite_swa_layers()
    lfm3_layers()

    transformers = sys.modules["transformers"]
    base = transformers.AutoConfig
    if getattr(base, "_zerolayer_fixed", False):
        return

    class _BuilderAutoConfig(base):  # type: ignore[misc,valid-type]
        """What `from transformers import AutoConfig` gives the builder: its configs fixed up.
        (transformers' own loaders import AutoConfig from its module, so they get the original.)"""

        _zerolayer_fixed = True

        @classmethod
        def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
            loaded = base.from_pretrained(*args, **kwargs)
            if isinstance(loaded, tuple):  # return_unused_kwargs=True
                return (_fix_config(loaded[0]), *loaded[1:])
            return _fix_config(loaded)

    setattr(transformers, "AutoConfig", _BuilderAutoConfig)  # noqa: B010  (mypy: not a declared name)


if __name__ == "__main__":
    install()
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)
