"""GGUF files of the families transformers' GGUF loader does not read, as llama.cpp writes them:
their config from the file's keys and their tensors through gguf's own dequantizer, in
transformers' names (gguf_to_hf then saves them as a Hugging Face folder).

- gpt-oss (ggml-org's gpt-oss-20b and 120b files, the ones llama.cpp and Ollama users have):
  llama.cpp's converter splits each layer's experts' fused gate and up projections (whose columns
  alternate gate, up) into ffn_gate_exps and ffn_up_exps, keeps the experts in MXFP4, and writes
  no layer pattern nor the SwiGLU clamp: llama.cpp runs every other layer sliding, from the
  first, and clamps at 7, as every published gpt-oss does.
- Gemma 3n (E2B, E4B: the files of Ollama's gemma3n and unsloth's): its sparse MLP gates are
  written as the standard deviations they keep (the normal distribution's quantile of the
  config's sparsity), the three AltUp projections each way stacked into one tensor, and the
  per-layer embedding table padded with zero rows to the whole vocabulary (its image and audio
  tokens have none), which are cut off again.
- mistral3 (Mistral's own GGUF files of Ministral 3, and Mistral Small 3.1 and 3.2's language
  model), granite and granitemoe (IBM's own GGUF files of Granite 3) and smollm3 (Hugging Face's
  own SmolLM3 files): a Llama's tensors, the queries' and keys' rows permuted as for a "llama"
  file, and Ministral 3's YaRN and query scale by position, or Granite's four multipliers, under
  keys of their own (SmolLM3's layers without RoPE are every fourth, as llama.cpp assumes).
- olmo2 (OLMo 2's and 3's), olmoe, exaone4 (EXAONE 4.0's), command-r (Command R, Aya Expanse),
  cohere2 (Command R7B), glm4 (GLM-4-0414, GLM-Z1), seed_oss, arcee (AFM; permuted, as a Llama)
  and hunyuan-dense: a Llama's tensor names, not permuted, and their own norms and layer patterns
  (Command R7B's, every fourth layer global, is llama.cpp's assumption); ernie4_5 (ERNIE 4.5 0.3B)
  the same.
- lfm2moe (LFM2-8B-A1B): LFM2's convolutions, their kernels written without the channel dimension,
  and experts routed by sigmoid with a bias for choosing, whose weights llama.cpp always normalises.
- granitehybrid (Granite 4.0-H: H-Micro, H-Tiny, H-Small, H-1B, H-350M): Mamba 2 layers, which the
  converter reshapes (A as -exp(A_log), the gated norm by group), between Granite's attention
  layers, a shared MLP in each layer and experts in some. (Granite 4.0's dense models are granite
  files.)
- nemotron_h (Nemotron Nano 2, Nemotron-H): the same Mamba 2 layers, attention and squared-ReLU MLP
  layers, one mixer a block, told apart by the per-layer lists of key heads and MLP widths;
  nemotron_h_moe (Nemotron 3) with experts' blocks where a layer has their tensors.
- falcon-h1 (Falcon-H1, Falcon-H1R): attention and a Mamba 2 mixer side by side in every layer, its
  µP multipliers multiplied into the weights by the converter (so each is read as 1).
- jamba (Jamba Reasoning 3B, Jamba Mini): Mamba (1) layers and attention layers, experts in some,
  whose places its config gives as a period and an offset, read back from the file's layers.
- olmo (OLMo 1; permuted, as a Llama) and jais2 (Jais 2): a Llama's tensor names and their own norms;
  apertus (Apertus) too, its xIELU activation's parameters written as per-layer keys.
- phi2 (Phi-2, Phi-1.5) and starcoder (StarCoder 1, SantaCoder: GPT-BigCode): their tensors by
  gguf's table as they are, their MLP's width from the tensors (the converter writes four times the
  hidden size).
- gptneox (Pythia, Dolly 2, RedPajama-INCITE): the converter lays each layer's fused queries, keys
  and values out as all queries, then keys, then values; the checkpoint has them head by head.
- qwen2moe (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B), which transformers' loader reads without the
  experts' and the shared expert's widths (it takes 1408 and 5632 whatever the file states) and
  with the shared expert's gate of an unquantized file one dimension too many: a Llama's tensors,
  not permuted, its experts by moe_weight.
- gemma (Gemma 1 and 1.1, CodeGemma), which transformers' loader does not read: a Llama's tensors,
  not permuted, each norm's weight as Gemma keeps it (the converter writes one plus it, the factor
  llama.cpp multiplies by).
- chatglm (GLM-4 9B, glm-4-9b-chat's own layout and the -hf one's, and GLM-Edge): GLM-4-0414's
  layers without its post norms; no head width stated (it is the queries' rows shared out), the
  queries, keys and values one tensor in the former, three in the latter.
- glm4moe (GLM-4.5, 4.5-Air, 4.6, 4.7; and Solar Open, written as GLM-4.5): a Llama's tensors, not
  permuted, GLM's biases and partial rotation, dense leading layers, then experts chosen by sigmoid
  with a bias for choosing, within groups where the file has them, beside shared experts; its
  multi-token prediction block written after the model's, as Nemotron 3's. bailingmoe2 (Ling 2.0:
  Ling-mini-2.0, Ling-flash-2.0, Ring-mini-2.0) is the same model (firmware.toolchain.bailing), its
  queries, keys and values one tensor, as chatglm's own layout.
- afmoe (Arcee's Trinity Nano, Mini): a Llama's tensors, not permuted, its attention's output gate,
  norms before and after each sublayer, µP's embedding scale, and every fourth layer global and
  unrotated, which llama.cpp assumes (its converter writes neither), experts by sigmoid with the
  block's bias beside shared experts.
- minicpm (MiniCPM-1B and -2B, MiniCPM4): the Granite llama.cpp runs it as (firmware.toolchain.minicpm),
  its rows permuted as a Llama's, MiniCPM4's LongRoPE from the factors the file keeps as tensors.
- deepseek2 (DeepSeek-V2-Lite, DeepSeek V3, Moonlight, Kimi K2, GLM-4.7-Flash, Youtu-LLM): multi-head
  latent attention, whose latent's projection to the keys and values the converter splits in two
  (the keys' half transposed), and experts chosen by softmax (DeepSeek V2's) or by sigmoid with a
  bias (V3's), as the file's gating key says or, without one, as llama.cpp guesses (GLM-4.7-Flash's
  by its layers and vocabulary, softmax otherwise), or none (Youtu-LLM's dense layers); DeepSeek's
  YaRN mscale from its log multiplier.
- ernie4_5-moe (ERNIE-4.5-21B-A3B): ERNIE 4.5's layers (a Llama's tensors, not permuted), dense
  leading layers, then experts every interleave_moe_layer_step layers, chosen by softmax with a
  bias for choosing, beside shared experts.
- dots1 (rednote's dots.llm1): Qwen3's attention (a Llama's tensors, not permuted, query and key
  norms), dense leading layers, then experts chosen by sigmoid with a bias for choosing, beside
  shared experts; no sliding layers (its published configs have none).
- mpt (MosaicML's MPT): BLOOM's ALiBi (the maximum bias the converter writes, 8 in every published
  model, is transformers' own), LayerNorms without biases.
- qwen3vl and qwen3vlmoe (Qwen3-VL's language model, dense and its mixtures of experts, the files
  beside an mmproj file): Qwen3's and Qwen3-MoE's tensors, not permuted, the experts' weights always
  scaled to sum to 1; the multimodal RoPE's sections and the deepstack layers' count unread (text has
  the same position on each of RoPE's three rows, plain RoPE, and no image features). qwen2vl
  (Qwen2-VL's and Qwen2.5-VL's) likewise: Qwen2's tensors, not permuted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from firmware.errors import BundleError
from firmware.toolchain.gpt_families import MPT_ALIBI_BIAS_MAX

GPT_OSS, GEMMA3N, MISTRAL3, GRANITE, SMOLLM3 = "gpt-oss", "gemma3n", "mistral3", "granite", "smollm3"
GRANITE_MOE, OLMO2, EXAONE4, COMMAND_R, COHERE2 = "granitemoe", "olmo2", "exaone4", "command-r", "cohere2"
GLM4, SEED_OSS, ARCEE, HUNYUAN_DENSE, OLMOE = "glm4", "seed_oss", "arcee", "hunyuan-dense", "olmoe"
ERNIE4_5, LFM2_MOE, GRANITE_HYBRID, NEMOTRON_H = "ernie4_5", "lfm2moe", "granitehybrid", "nemotron_h"
FALCON_H1, JAMBA, PHI2, STARCODER, OLMO, JAIS2 = "falcon-h1", "jamba", "phi2", "starcoder", "olmo", "jais2"
APERTUS, GPT_NEOX, CHATGLM, QWEN2_MOE, GEMMA = "apertus", "gptneox", "chatglm", "qwen2moe", "gemma"
NEMOTRON_H_MOE, EXAONE, GLM4_MOE, DEEPSEEK2 = "nemotron_h_moe", "exaone", "glm4moe", "deepseek2"
ERNIE4_5_MOE, QWEN3VL, QWEN3VL_MOE, DOTS1, MPT = "ernie4_5-moe", "qwen3vl", "qwen3vlmoe", "dots1", "mpt"
QWEN2VL, BAILINGMOE2, AFMOE, MINICPM = "qwen2vl", "bailingmoe2", "afmoe", "minicpm"
ARCHITECTURES = (GPT_OSS, GEMMA3N, MISTRAL3, GRANITE, SMOLLM3, GRANITE_MOE, OLMO2, EXAONE4, COMMAND_R, COHERE2,
                 GLM4, SEED_OSS, ARCEE, HUNYUAN_DENSE, OLMOE, ERNIE4_5, LFM2_MOE, GRANITE_HYBRID, NEMOTRON_H, FALCON_H1,
                 JAMBA, PHI2, STARCODER, OLMO, JAIS2, APERTUS, GPT_NEOX, CHATGLM, QWEN2_MOE, GEMMA, NEMOTRON_H_MOE,
                 EXAONE, GLM4_MOE, DEEPSEEK2, ERNIE4_5_MOE, QWEN3VL, QWEN3VL_MOE, DOTS1, MPT, QWEN2VL, BAILINGMOE2,
                 AFMOE, MINICPM)
COHERE2_GLOBAL_EVERY = 4  # Command R7B's global layers: every fourth (llama.cpp's swa pattern, not in its files)
NO_ROPE_EVERY = 4  # SmolLM3's layers without RoPE: every fourth (llama.cpp's n_no_rope_layer_step)
# Trinity's (AFMoE's) global layers, without RoPE: every fourth (llama.cpp's swa pattern and
# n_no_rope_layer_step for afmoe; its converter writes neither, every published Trinity has 4).
AFMOE_GLOBAL_EVERY = 4
SIGMOID_GATING = 2  # gguf.ExpertGatingFuncType.SIGMOID
# GLM-4.7-Flash's deepseek2 files, which llama.cpp tells apart (to route by sigmoid without a gating
# key) by their layers (with or without the prediction block) and vocabulary.
GLM47_FLASH_LAYERS, GLM47_FLASH_VOCABULARY = (47, 48), 154880
SWIGLU_LIMIT = 7.0  # llama.cpp's constant for gpt-oss (llama-graph.cpp), gpt-oss's own
# Gemma 3n's AltUp projections, stacked by llama.cpp's converter: file tensor -> transformers' list.
GEMMA3N_STACKED = {"altup_proj.weight": "model.altup_projections", "altup_unembd_proj.weight":
                   "model.altup_unembed_projections"}  # fmt: skip


def config(meta: dict[str, Any]) -> Any:
    """The transformers config of a file of one of ARCHITECTURES, from its metadata (build's
    `_gguf_metadata`: its keys and its tensors' shapes)."""
    arch = meta.get("general.architecture")
    readers: dict[str, Callable[[dict[str, Any]], Any]] = {
               GPT_OSS: _gpt_oss_config, GEMMA3N: _gemma3n_config, MISTRAL3: _mistral3_config,
               GRANITE: _granite_config, SMOLLM3: _smollm3_config, GRANITE_MOE: _granite_config,
               OLMO2: _olmo2_config, EXAONE4: _exaone4_config, COMMAND_R: _cohere_config,
               COHERE2: _cohere_config, GLM4: _glm4_config, SEED_OSS: _seed_oss_config, ARCEE: _arcee_config,
               HUNYUAN_DENSE: _hunyuan_config, OLMOE: _olmoe_config, ERNIE4_5: _ernie_config,
               LFM2_MOE: _lfm2_moe_config, GRANITE_HYBRID: _granite_config, NEMOTRON_H: _nemotron_h_config,
               NEMOTRON_H_MOE: _nemotron_h_config, EXAONE: _exaone_config,
               FALCON_H1: _falcon_h1_config, JAMBA: _jamba_config, PHI2: _phi2_config,
               STARCODER: _starcoder_config, OLMO: _olmo_config, JAIS2: _jais2_config,
               APERTUS: _apertus_config, GPT_NEOX: _gpt_neox_config, CHATGLM: _chatglm_config,
               QWEN2_MOE: _qwen2_moe_config, GEMMA: _gemma_config, GLM4_MOE: _glm4_moe_config,
               DEEPSEEK2: _deepseek2_config, ERNIE4_5_MOE: _ernie_moe_config, QWEN3VL: _qwen3_vl_config,
               QWEN3VL_MOE: _qwen3_vl_config, DOTS1: _dots1_config, MPT: _mpt_config,
               QWEN2VL: _qwen2_vl_config, BAILINGMOE2: partial(_glm4_moe_config, arch=BAILINGMOE2,
                                                               whose="Ling 2.0's"),
               AFMOE: _afmoe_config, MINICPM: _minicpm_config}  # fmt: skip
    if arch not in readers:
        raise BundleError(f"a GGUF file of architecture {arch!r} is not one read here ({', '.join(ARCHITECTURES)})")
    return readers[arch](meta)


# A Llama-shaped config's model type -> (its GGUF architecture, whether llama.cpp's converter
# permuted its queries' and keys' rows: its LlamaModel and the converters built on it do).
LLAMA_SHAPED = {"mistral": (MISTRAL3, True), "ministral3": (MISTRAL3, True), "granite": (GRANITE, True),
                "smollm3": (SMOLLM3, True), "granitemoe": (GRANITE_MOE, True),
                "granitemoeshared": (GRANITE_MOE, True), "olmo2": (OLMO2, False), "olmo3": (OLMO2, False),
                "exaone4": (EXAONE4, False), "cohere": (COMMAND_R, False), "cohere2": (COHERE2, False),
                "glm4": (GLM4, False), "seed_oss": (SEED_OSS, False), "arcee": (ARCEE, True),
                "hunyuan_v1_dense": (HUNYUAN_DENSE, False), "olmoe": (OLMOE, False),
                "ernie4_5": (ERNIE4_5, False), "olmo": (OLMO, True), "jais2": (JAIS2, False),
                "qwen2_moe": (QWEN2_MOE, False), "exaone": (EXAONE, False), "glm4_moe": (GLM4_MOE, False),
                "ernie4_5_moe": (ERNIE4_5_MOE, False), "qwen3": (QWEN3VL, False),
                "qwen3_moe": (QWEN3VL_MOE, False), "dots1": (DOTS1, False), "qwen2": (QWEN2VL, False),
                "afmoe": (AFMOE, False)}  # fmt: skip


def state(gguf: Path, model_config: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """Every weight of the model in transformers' names, dequantized to float32 (`meta`: the file's
    metadata, where a family keeps weights as keys); a tensor the model needs and the file lacks is
    refused, naming it."""
    found = read_tensors(gguf)

    def take(name: str) -> Any:
        if name not in found:
            raise BundleError(f"{gguf}: the file has no tensor {name} (a tensor layout this build does not read)")
        return found[name]

    # A model type -> its reader of the file's tensors (taking `take` and the config); a Llama's reader
    # (Ministral 3's, Mistral Small's, Granite's, SmolLM3's, OLMo's, EXAONE's...) for every other.
    readers: dict[str, Callable[..., dict[str, Any]]] = {
        "gpt_oss": _gpt_oss_state, "gemma3n_text": _gemma3n_state, "lfm2_moe": _lfm2_moe_state,
        "granitemoehybrid": _granite_hybrid_state, "nemotron_h": _nemotron_h_state, "falcon_h1": _falcon_h1_state,
        "apertus": partial(_apertus_state, gguf, meta), "phi": partial(_by_name_table, arch=PHI2),
        "gpt_bigcode": partial(_by_name_table, arch=STARCODER), "gpt_neox": _gpt_neox_state,
        "mpt": partial(_by_name_table, arch=MPT),
        "glm": partial(_fused_qkv_state, found, arch=CHATGLM), "gemma": _gemma_state,
        "deepseek_v3": _deepseek2_state, "deepseek_v2": _deepseek2_state, "youtu": _deepseek2_state,
        "jamba": partial(_by_name_table, arch=JAMBA, special=lambda hf: _mamba_or_experts(take, hf))}  # fmt: skip
    reader = readers.get(model_config.model_type, _llama_state)
    if meta.get("general.architecture") == BAILINGMOE2:  # (a GLM-4.5 whose queries, keys and values are one)
        reader = partial(_fused_qkv_state, found, arch=BAILINGMOE2)
    out = reader(take, model_config)
    return {k: v.contiguous() for k, v in out.items()}


def _by_name_table(take: Any, model_config: Any, arch: str, special: Any = None,
                   prefix: str = "model.") -> dict[str, Any]:  # fmt: skip
    """Each weight of `model_config`'s model read by gguf's own table of the tensor names of `arch`
    (llama.cpp's name of the architecture; the table maps checkpoints' names to llama.cpp's, and a
    checkpoint's names start with `prefix` where transformers' start with "model."), but those
    `special` reads (it gives None for the rest)."""
    import torch
    import transformers
    from gguf import get_tensor_name_map

    names = get_tensor_name_map(_gguf_arch(arch), model_config.num_hidden_layers)
    with torch.device("meta"):
        wanted = getattr(transformers, model_config.architectures[0])(model_config).state_dict()
    out = {}
    for hf in wanted:
        if hf == "lm_head.weight" and model_config.tie_word_embeddings:
            continue
        value = special(hf) if special is not None else None
        if value is None:
            base, _, suffix = (prefix + hf.removeprefix("model.") if hf.startswith("model.") else hf).rpartition(".")
            file_name = names.get_name(base) if suffix in ("weight", "bias") else None
            file_name = f"{file_name}.{suffix}" if file_name else f"{names.get_name(hf)}.weight"
            if file_name.startswith("None."):
                raise BundleError(f"no GGUF tensor name is known for the model's weight {hf}")
            value = take(file_name)
        out[hf] = value
    return out


def read_tensors(gguf: Path, wanted: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """The file's tensors (those `wanted` where given) dequantized to float32, by their file names,
    in PyTorch's order of dimensions."""
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize

    found = {}
    for t in GGUFReader(str(gguf)).tensors:
        if wanted is not None and not wanted(t.name):
            continue
        shape = [int(d) for d in reversed(t.shape)]  # GGUF lists a tensor's dimensions innermost first
        found[t.name] = torch.from_numpy(dequantize(t.data, t.tensor_type).astype("float32").reshape(shape))
    return found


def _key(meta: dict[str, Any], arch: str) -> Any:
    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}")
        return default if value is None else value

    return key


def as_float32(value: Any) -> float:
    """A number the file stores as a float32, as its config wrote it (7 significant digits)."""
    return float(f"{float(value):.7g}")


def _gpt_oss_config(meta: dict[str, Any]) -> Any:
    from transformers import GptOssConfig

    key, shapes = _key(meta, GPT_OSS), meta["shapes"]
    layers = int(key("block_count"))
    pattern = key("attention.sliding_window_pattern")
    sliding = [bool(s) for s in pattern] if isinstance(pattern, list) else [i % 2 == 0 for i in range(layers)]
    rope = rope_parameters(meta, GPT_OSS)
    if rope["rope_type"] == "yarn":  # gpt-oss's YaRN, not truncated (its config's `truncate`)
        rope["truncate"] = False
    elif rope["rope_type"] != "default":
        raise BundleError(f"a gpt-oss file with RoPE scaling {rope['rope_type']!r} (read: yarn)")
    return GptOssConfig(
        vocab_size=shapes["token_embd.weight"][0], hidden_size=int(key("embedding_length")), num_hidden_layers=layers,
        num_attention_heads=int(key("attention.head_count")), num_key_value_heads=int(key("attention.head_count_kv")),
        head_dim=int(key("attention.key_length")), intermediate_size=int(key("expert_feed_forward_length")),
        num_local_experts=int(key("expert_count")), num_experts_per_tok=int(key("expert_used_count")),
        sliding_window=int(key("attention.sliding_window")), max_position_embeddings=int(key("context_length")),
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        rms_norm_eps=as_float32(key("attention.layer_norm_rms_epsilon")), rope_parameters=rope,
        swiglu_limit=SWIGLU_LIMIT, attention_bias=True, architectures=["GptOssForCausalLM"],
        **_tokens_and_tying(meta))  # fmt: skip


def _gpt_oss_state(take: Any, model_config: Any) -> dict[str, Any]:
    """Each weight by gguf's own table of gpt-oss's names, but the experts': llama.cpp's converter
    splits their fused gate and up projections, whose columns alternate gate, up."""
    import torch

    def experts(hf: str) -> Any:
        layer, _, leaf = hf.partition(".mlp.experts.")
        if not leaf:
            return None
        blk = f"blk.{layer.rsplit('.', 1)[1]}."
        if leaf == "gate_up_proj":  # [experts, width, hidden] gate and up -> [experts, hidden, 2 x width]
            gate, up = take(blk + "ffn_gate_exps.weight"), take(blk + "ffn_up_exps.weight")
            return torch.stack((gate, up), dim=2).flatten(1, 2).transpose(1, 2)
        if leaf == "gate_up_proj_bias":
            return torch.stack((take(blk + "ffn_gate_exps.bias"), take(blk + "ffn_up_exps.bias")), dim=2).flatten(1, 2)
        if leaf == "down_proj":
            return take(blk + "ffn_down_exps.weight").transpose(1, 2)
        return take(blk + "ffn_down_exps.bias") if leaf == "down_proj_bias" else None

    return _by_name_table(take, model_config, GPT_OSS, experts)


def _gemma3n_config(meta: dict[str, Any]) -> Any:
    from transformers import Gemma3nTextConfig

    key, shapes = _key(meta, GEMMA3N), meta["shapes"]
    layers = int(key("block_count"))
    widths = key("feed_forward_length")
    return Gemma3nTextConfig(
        vocab_size=shapes["token_embd.weight"][0], hidden_size=int(key("embedding_length")), num_hidden_layers=layers,
        intermediate_size=[int(w) for w in widths] if isinstance(widths, list) else int(widths),
        num_attention_heads=int(key("attention.head_count")), num_key_value_heads=int(key("attention.head_count_kv")),
        head_dim=int(key("attention.key_length")), max_position_embeddings=int(key("context_length")),
        rms_norm_eps=as_float32(key("attention.layer_norm_rms_epsilon")),
        sliding_window=int(key("attention.sliding_window")),
        layer_types=["sliding_attention" if s else "full_attention" for s in key("attention.sliding_window_pattern")],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": float(key("rope.freq_base"))},
                         "sliding_attention": {"rope_type": "default",
                                               "rope_theta": float(key("rope.freq_base_swa", 10000.0))}},
        final_logit_softcapping=key("final_logit_softcapping"), altup_active_idx=int(key("altup.active_idx", 0)),
        altup_num_inputs=int(key("altup.num_inputs", 4)),
        hidden_size_per_layer_input=int(key("embedding_length_per_layer_input")),
        vocab_size_per_layer_input=shapes["per_layer_token_embd.weight"][0],
        num_kv_shared_layers=int(key("attention.shared_kv_layers", 0)),
        laurel_rank=shapes["blk.0.laurel_l.weight"][0],
        # The converter writes each layer's sparsity as the quantile of the normal distribution it keeps.
        activation_sparsity_pattern=[0.5 * (1 + math.erf(s / math.sqrt(2))) for s in
                                     key("activation_sparsity_scale", [-math.inf] * layers)],
        architectures=["Gemma3nForCausalLM"], **_tokens_and_tying(meta))  # fmt: skip


def _gemma3n_state(take: Any, model_config: Any) -> dict[str, Any]:
    """Each weight by gguf's own table of Gemma 3n's names, the stacked projections unstacked."""
    import torch

    def unstacked(hf: str) -> Any:
        stacked = next((f for f, prefix in GEMMA3N_STACKED.items() if hf.startswith(prefix + ".")), None)
        return None if stacked is None else take(stacked)[int(hf.split(".")[2])]

    out = _by_name_table(take, model_config, GEMMA3N, unstacked)
    # The zero rows llama.cpp padded the per-layer table with are cut: transformers gives the
    # tokens past the table row 0, not zeros (the config is the model's from here on).
    table = out["model.embed_tokens_per_layer.weight"]
    written = torch.nonzero(table.abs().amax(dim=1)).flatten()
    rows = int(written[-1]) + 1 if len(written) else len(table)
    out["model.embed_tokens_per_layer.weight"] = table[:rows]
    model_config.vocab_size_per_layer_input = rows
    return out


def _llama_fields(meta: dict[str, Any], arch: str) -> dict[str, Any]:
    """The config fields of a Llama-shaped file's keys (llama.cpp's TextModel writes them)."""
    key, shapes = _key(meta, arch), meta["shapes"]
    width = key("attention.key_length")
    return dict(
        vocab_size=shapes["token_embd.weight"][0], hidden_size=int(key("embedding_length")),
        intermediate_size=int(key("feed_forward_length")), num_hidden_layers=int(key("block_count")),
        num_attention_heads=int(key("attention.head_count")), num_key_value_heads=max(_key_heads(meta, arch)),
        **({"head_dim": int(width)} if width else {}), max_position_embeddings=int(key("context_length")),
        rms_norm_eps=as_float32(key("attention.layer_norm_rms_epsilon", key("attention.layer_norm_epsilon"))),
        rope_parameters=rope_parameters(meta, arch),
        **_tokens_and_tying(meta))  # fmt: skip


def _tokens_and_tying(meta: dict[str, Any]) -> dict[str, Any]:
    """The config's special tokens and whether its LM head is the embedding (no output tensor)."""
    return dict(tie_word_embeddings="output.weight" not in meta["shapes"],
                bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
                eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
                pad_token_id=meta.get("tokenizer.ggml.padding_token_id"))  # fmt: skip


def _key_heads(meta: dict[str, Any], arch: str) -> list[int]:
    """Each layer's key heads: one count for all, or a list in which a layer without attention (a
    convolution's, a Mamba layer's) has none."""
    key = _key(meta, arch)
    heads = key("attention.head_count_kv")
    return [int(h) for h in heads] if isinstance(heads, list) else [int(heads)] * int(key("block_count"))


def rope_parameters(meta: dict[str, Any], arch: str) -> dict[str, Any]:
    """RoPE's parameters as llama.cpp's TextModel writes them: linear or YaRN scaling under
    rope.scaling.*, Llama 3's as the table of divisors it makes (rope_freqs)."""
    key = _key(meta, arch)
    theta = float(key("rope.freq_base", 10000.0))
    scaling = key("rope.scaling.type")
    if meta.get("tensor.rope_freqs.weight"):
        return llama3_rope(meta, theta)
    if scaling == "linear":
        return {"rope_type": "linear", "rope_theta": theta, "factor": float(key("rope.scaling.factor"))}
    if scaling == "yarn":
        rope = {"rope_type": "yarn", "rope_theta": theta, "factor": float(key("rope.scaling.factor")),
                "original_max_position_embeddings": int(key("rope.scaling.original_context_length")),
                "beta_fast": float(key("rope.scaling.yarn_beta_fast", 32.0)),
                "beta_slow": float(key("rope.scaling.yarn_beta_slow", 1.0))}  # fmt: skip
        if key("rope.scaling.yarn_attn_factor") is not None:
            rope["attention_factor"] = as_float32(key("rope.scaling.yarn_attn_factor"))
        return rope
    if scaling == "longrope":  # (MiniCPM4's: its factors the tensors rope_factors_long and _short)
        long, short = meta.get("tensor.rope_factors_long.weight"), meta.get("tensor.rope_factors_short.weight")
        if long is None or short is None:
            raise BundleError(f"a {arch} file with LongRoPE scaling but no factors (rope_factors_long, _short)")
        # (llama.cpp's original context: the key's, or the model's context where there is none)
        original = key("rope.scaling.original_context_length", key("context_length"))
        return {"rope_type": "longrope", "rope_theta": theta, "long_factor": [as_float32(f) for f in long],
                "short_factor": [as_float32(f) for f in short], "original_max_position_embeddings": int(original)}
    if scaling not in (None, "none"):
        raise BundleError(f"a {arch} file with RoPE scaling {scaling!r} (read: linear, yarn, longrope, Llama 3's)")
    return {"rope_type": "default", "rope_theta": theta}


def llama3_rope(meta: dict[str, Any], theta: float) -> dict[str, Any]:
    """Llama 3.1's RoPE scaling (Llama 3.1, 3.2, 3.3, EXAONE 4) from what llama.cpp keeps of it: the
    divisor of each rotary frequency (tensor rope_freqs), not the four numbers it was made from.
    Those are found by trying the usual values until the divisors are reproduced; a table no
    Llama 3 scaling makes is refused rather than dropped (transformers' loader drops it: every
    position's rotation changes)."""
    import numpy as np

    arch = meta["general.architecture"]
    table = np.asarray(meta["tensor.rope_freqs.weight"], dtype=np.float64)
    dim = 2 * len(table)
    wavelen = 2 * math.pi * theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    factor = float(table.max())
    for original in [2**k for k in range(6, 21)]:
        for low in (1.0, 0.5, 2.0):
            for high in (4.0, 2.0, 8.0, 1.5, 16.0):
                if high <= low:
                    continue
                smooth = (original / wavelen - low) / (high - low)
                blend = 1 / ((1 - smooth) / factor + smooth)
                made = np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, blend))
                if np.allclose(made, table, rtol=1e-5, atol=0):
                    return {"rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": low,
                            "high_freq_factor": high, "original_max_position_embeddings": original}  # fmt: skip
    raise BundleError(f"{arch} GGUF: its RoPE frequency table (rope_freqs) is not one Llama 3's scaling makes; "
                      "build from the Hugging Face folder instead")  # fmt: skip


def _layer_types(meta: dict[str, Any], arch: str) -> list[str] | None:
    """Each layer's attention from the file's sliding-window pattern (one flag a layer), or None
    where it has no window."""
    key = _key(meta, arch)
    pattern = key("attention.sliding_window_pattern")
    if not key("attention.sliding_window") or not isinstance(pattern, list):
        return None
    return ["sliding_attention" if flag else "full_attention" for flag in pattern]


def _mistral3_config(meta: dict[str, Any]) -> Any:
    """Ministral 3's (its YaRN and its query scale by position past the original context) or, with
    no RoPE scaling, Mistral Small 3.1's and 3.2's language model, a Mistral."""
    from transformers import Ministral3Config, MistralConfig

    key = _key(meta, MISTRAL3)
    common = {**_llama_fields(meta, MISTRAL3), "sliding_window": key("attention.sliding_window")}
    scaling = key("rope.scaling.type")
    if scaling == "yarn":
        mscale = float(key("rope.scaling.yarn_log_multiplier", 1.0))  # llama.cpp writes mscale_all_dim
        common["rope_parameters"] |= {"mscale": mscale, "mscale_all_dim": mscale,
                                      "llama_4_scaling_beta": as_float32(key("attention.temperature_scale", 0.0))}
        return Ministral3Config(**common, architectures=["Ministral3ForCausalLM"])
    if scaling not in (None, "none"):
        raise BundleError(f"a mistral3 file with RoPE scaling {scaling!r} (read: yarn, or none)")
    return MistralConfig(**common, architectures=["MistralForCausalLM"])


def _granite_config(meta: dict[str, Any]) -> Any:
    """Granite 3's dense models, or its mixtures of experts (granitemoe: 3.0's 1B and 3B A800M,
    shared experts too): a Llama's fields and its four multipliers, under llama.cpp's names
    (attention.scale, embedding_scale, residual_scale, logit_scale)."""
    from transformers import GraniteConfig, GraniteMoeConfig, GraniteMoeSharedConfig

    arch = meta["general.architecture"]
    key = _key(meta, arch)
    fields = dict(
        **_llama_fields(meta, arch), attention_multiplier=as_float32(key("attention.scale", 1.0)),
        embedding_multiplier=as_float32(key("embedding_scale", 1.0)),
        residual_multiplier=as_float32(key("residual_scale", 1.0)), logits_scaling=as_float32(key("logit_scale", 1.0)))
    if arch == GRANITE:
        return GraniteConfig(**fields, architectures=["GraniteForCausalLM"])
    if arch == GRANITE_HYBRID:
        return _granite_hybrid_config(meta, fields)
    fields |= {"num_local_experts": int(key("expert_count")), "num_experts_per_tok": int(key("expert_used_count"))}
    shared = key("expert_shared_feed_forward_length")
    if shared:
        return GraniteMoeSharedConfig(**fields, shared_intermediate_size=int(shared),
                                      architectures=["GraniteMoeSharedForCausalLM"])  # fmt: skip
    return GraniteMoeConfig(**fields, architectures=["GraniteMoeForCausalLM"])


def _minicpm_config(meta: dict[str, Any]) -> Any:
    """OpenBMB's MiniCPM (1B, 2B, MiniCPM4), which llama.cpp runs with Granite's graph: as Granite, its
    µP scales under Granite's keys (embedding_scale, residual_scale, logit_scale, where a file lacks
    one, llama.cpp's MiniCPM-2B defaults), its scores at 1/sqrt(head width) where no attention.scale
    says otherwise, its rows permuted as a Llama's."""
    from transformers import GraniteConfig

    key, fields = _key(meta, MINICPM), _llama_fields(meta, MINICPM)
    width = fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"]
    return GraniteConfig(**fields, attention_multiplier=as_float32(key("attention.scale", width**-0.5)),
                         embedding_multiplier=as_float32(key("embedding_scale", 12.0)),
                         residual_multiplier=as_float32(key("residual_scale",
                                                            1.4 / math.sqrt(fields["num_hidden_layers"]))),
                         logits_scaling=as_float32(key("logit_scale", 256 / fields["hidden_size"])),
                         architectures=["GraniteForCausalLM"])  # fmt: skip


def _granite_hybrid_config(meta: dict[str, Any], fields: dict[str, Any]) -> Any:
    """Granite 4.0-H (H-Micro, H-Tiny, H-Small, H-1B, H-350M): Mamba 2 layers (those without key
    heads) between attention layers, a shared MLP in every layer, experts in some. Its attention
    is turned by RoPE only where the file says rope.scaling.finetuned, llama.cpp's switch for it
    (the converter writes false for the hybrids, which have no positions, and a context of 2^20)."""
    from transformers import GraniteMoeHybridConfig

    key, shapes = _key(meta, GRANITE_HYBRID), meta["shapes"]
    inner, heads, hidden = int(key("ssm.inner_size")), int(key("ssm.time_step_rank")), fields["hidden_size"]
    if inner % hidden or inner % heads:
        raise BundleError(f"a {GRANITE_HYBRID} file whose Mamba width ({inner}) is not a multiple of its hidden size "
                          f"({hidden}) and heads ({heads})")  # fmt: skip
    kinds = ["attention" if h else "mamba" for h in _key_heads(meta, GRANITE_HYBRID)]
    mamba = next((i for i, kind in enumerate(kinds) if kind == "mamba"), 0)
    fields |= {"intermediate_size": int(key("expert_feed_forward_length", fields["intermediate_size"]))}
    return GraniteMoeHybridConfig(
        **fields, layer_types=kinds, mamba_n_heads=heads, mamba_d_head=inner // heads,
        mamba_n_groups=int(key("ssm.group_count")), mamba_d_state=int(key("ssm.state_size")),
        mamba_d_conv=int(key("ssm.conv_kernel")), mamba_expand=inner // hidden,
        mamba_conv_bias=f"blk.{mamba}.ssm_conv1d.bias" in shapes, mamba_proj_bias=f"blk.{mamba}.ssm_in.bias" in shapes,
        num_local_experts=int(key("expert_count", 0)), num_experts_per_tok=int(key("expert_used_count", 0)),
        shared_intermediate_size=int(key("expert_shared_feed_forward_length", fields["intermediate_size"])),
        position_embedding_type="rope" if key("rope.scaling.finetuned", True) else "nope",
        architectures=["GraniteMoeHybridForCausalLM"])  # fmt: skip


def _smollm3_config(meta: dict[str, Any]) -> Any:
    """SmolLM3: a Llama's fields, RoPE left out of every fourth layer (which llama.cpp assumes and
    its files do not state)."""
    from transformers import SmolLM3Config

    fields = _llama_fields(meta, SMOLLM3)
    layers = fields["num_hidden_layers"]
    return SmolLM3Config(**fields, no_rope_layers=[int((i + 1) % NO_ROPE_EVERY != 0) for i in range(layers)],
                         use_sliding_window=False, architectures=["SmolLM3ForCausalLM"])  # fmt: skip


def _olmo2_config(meta: dict[str, Any]) -> Any:
    """OLMo 2's, or OLMo 3's (llama.cpp writes both as olmo2; OLMo 3's with its sliding layers,
    their own RoPE base, and YaRN on the full ones)."""
    from transformers import Olmo2Config, Olmo3Config

    fields = _llama_fields(meta, OLMO2)
    types = _layer_types(meta, OLMO2)
    if types is None:
        return Olmo2Config(**fields, architectures=["Olmo2ForCausalLM"])
    key = _key(meta, OLMO2)
    sliding = {"rope_type": "default", "rope_theta": float(key("rope.freq_base_swa", key("rope.freq_base", 10000.0)))}
    fields["rope_parameters"] = {"full_attention": fields["rope_parameters"], "sliding_attention": sliding}
    return Olmo3Config(**fields, sliding_window=int(key("attention.sliding_window")), layer_types=types,
                       architectures=["Olmo3ForCausalLM"])  # fmt: skip


def _exaone_config(meta: dict[str, Any]) -> Any:
    """EXAONE 3.0 and 3.5's (and EXAONE Deep's): a Llama, its rows as they are (llama.cpp rotates
    them as GPT-NeoX does), which transformers runs as its Llama class."""
    from transformers import ExaoneConfig

    return ExaoneConfig(**_llama_fields(meta, EXAONE), architectures=["LlamaForCausalLM"])


def _exaone4_config(meta: dict[str, Any]) -> Any:
    """EXAONE 4.0's: its 32B's sliding layers where the file has a window (its 1.2B has none)."""
    from transformers import Exaone4Config

    fields = _llama_fields(meta, EXAONE4)
    types = _layer_types(meta, EXAONE4)
    window = _key(meta, EXAONE4)("attention.sliding_window")
    return Exaone4Config(**fields, sliding_window=int(window) if types else None,
                         layer_types=types or ["full_attention"] * fields["num_hidden_layers"],
                         architectures=["Exaone4ForCausalLM"])  # fmt: skip


def _cohere_config(meta: dict[str, Any]) -> Any:
    """Cohere's Command R and Aya Expanse (command-r), or Command R7B's (cohere2: three sliding
    layers in four, which llama.cpp assumes and its files do not state): LayerNorms without biases
    and the logits' scale."""
    from transformers import Cohere2Config, CohereConfig

    arch = meta["general.architecture"]
    key = _key(meta, arch)
    fields = _llama_fields(meta, arch)
    fields |= {"layer_norm_eps": fields.pop("rms_norm_eps"), "logit_scale": as_float32(key("logit_scale", 1.0))}
    if arch == COMMAND_R:
        return CohereConfig(**fields, use_qk_norm="blk.0.attn_q_norm.weight" in meta["shapes"],
                            architectures=["CohereForCausalLM"])  # fmt: skip
    layers = fields["num_hidden_layers"]
    types = ["full_attention" if (i + 1) % COHERE2_GLOBAL_EVERY == 0 else "sliding_attention" for i in range(layers)]
    return Cohere2Config(**fields, sliding_window=int(key("attention.sliding_window")), layer_types=types,
                         architectures=["Cohere2ForCausalLM"])  # fmt: skip


def _glm4_config(meta: dict[str, Any]) -> Any:
    """GLM-4-0414's and GLM-Z1's: a norm after each sublayer as well as before, its MLP's gate and up
    projections fused (the file's ffn_up), and part of each head rotated (rope.dimension_count)."""
    from transformers import Glm4Config

    return Glm4Config(**_glm_fields(meta, GLM4), architectures=["Glm4ForCausalLM"])


def _chatglm_config(meta: dict[str, Any]) -> Any:
    """GLM-4 9B's and GLM-Edge's: GLM-4-0414's layers without its post norms. The file's context is
    the converter's (a config without ChatGLM's seq_length, as the -hf ones, gets its hidden size),
    and its norms' epsilon (it reads ChatGLM's layernorm_epsilon, or takes 1e-5), as llama.cpp runs
    them."""
    from transformers import GlmConfig

    return GlmConfig(**_glm_fields(meta, CHATGLM), architectures=["GlmForCausalLM"])


def _glm_fields(meta: dict[str, Any], arch: str) -> dict[str, Any]:
    """A GLM file's config fields: a Llama's, each head's width from the queries' rows where no key
    states it (one fused tensor's rows are the queries', keys' and values'), the part of each head
    rotated (rope.dimension_count) and biases where the file has them."""
    fields, shapes = _llama_fields(meta, arch), meta["shapes"]
    heads, kv = fields["num_attention_heads"], fields["num_key_value_heads"]
    fused = shapes.get("blk.0.attn_qkv.weight")
    width = fused[0] // (heads + 2 * kv) if fused else shapes["blk.0.attn_q.weight"][0] // heads
    head = fields.get("head_dim") or width
    fields["rope_parameters"]["partial_rotary_factor"] = int(_key(meta, arch)("rope.dimension_count", head)) / head
    biased = "blk.0.attn_q.bias" in shapes or "blk.0.attn_qkv.bias" in shapes
    return fields | {"head_dim": head, "attention_bias": biased}


def _glm4_moe_config(meta: dict[str, Any], arch: str = GLM4_MOE, whose: str = "GLM-4.5's") -> Any:
    """GLM-4.5's: GLM's fields, per-head query and key norms where the file has them, dense leading
    layers, then experts chosen by sigmoid with a bias for choosing (exp_probs_b), within groups where
    the file has them, mixed by their scores (scaled to sum to 1 where expert_weights_norm) and
    expert_weights_scale, beside shared experts; the layers less the multi-token prediction block
    the converter writes after them. Ling 2.0's files (bailingmoe2, `arch`) are the same model,
    their queries, keys and values one tensor (firmware.toolchain.bailing)."""
    from transformers import Glm4MoeConfig

    key, shapes = _key(meta, arch), meta["shapes"]
    _sigmoid_gated(key, whose)
    fields = _glm_fields(meta, arch) | {"num_hidden_layers": _layer_count(key)}
    return Glm4MoeConfig(**fields, use_qk_norm="blk.0.attn_q_norm.weight" in shapes,
                         first_k_dense_replace=int(key("leading_dense_block_count", 0)),
                         **_deepseek_style_experts(key), num_mtp_layers=0,
                         architectures=["Glm4MoeForCausalLM"])  # fmt: skip


def _deepseek_style_experts(key: Any) -> dict[str, Any]:
    """The experts' fields of a DeepSeek-style config (DeepSeek V2/V3's, GLM-4.5's, Nemotron 3's,
    dots.llm1's):
    how many, how many chosen, their width, the shared ones, the weights' scaling and the groups
    they are chosen in."""
    return {"n_routed_experts": int(key("expert_count")), "num_experts_per_tok": int(key("expert_used_count")),
            "moe_intermediate_size": int(key("expert_feed_forward_length")),
            "n_shared_experts": int(key("expert_shared_count", 1)),
            "norm_topk_prob": bool(key("expert_weights_norm", False)),
            "routed_scaling_factor": as_float32(key("expert_weights_scale", 1.0)),
            "n_group": int(key("expert_group_count", 1)), "topk_group": int(key("expert_group_used_count", 1))}


def _deepseek2_config(meta: dict[str, Any]) -> Any:
    """DeepSeek's latent attention models: its widths from the MLA keys (the file's key heads are the
    converter's one latent head: every query head has its own), low-rank queries where the file has
    them, and experts chosen by sigmoid (a DeepSeek V3 config) or softmax (a DeepSeek V2 one)."""
    from transformers import DeepseekV2Config, DeepseekV3Config, YoutuConfig

    key, shapes = _key(meta, DEEPSEEK2), meta["shapes"]
    fields = _llama_fields(meta, DEEPSEEK2)
    rotated, rank = int(key("rope.dimension_count")), int(key("attention.kv_lora_rank"))
    rope = fields["rope_parameters"]
    if rope["rope_type"] == "yarn" and key("rope.scaling.yarn_log_multiplier") is not None:
        # (The converter writes 0.1 x mscale_all_dim; DeepSeek's published configs have mscale equal to it.)
        scale = round(float(key("rope.scaling.yarn_log_multiplier")) / 0.1, 6)
        rope |= {"mscale": scale, "mscale_all_dim": scale}
    fields |= {"num_hidden_layers": _layer_count(key), "num_key_value_heads": fields["num_attention_heads"],
               "head_dim": rotated, "kv_lora_rank": rank, "q_lora_rank": key("attention.q_lora_rank"),
               "qk_rope_head_dim": rotated, "qk_nope_head_dim": int(key("attention.key_length_mla")) - rotated,
               "v_head_dim": int(key("attention.value_length_mla")),
               "attention_bias": "blk.0.attn_kv_a_mqa.bias" in shapes}
    if key("expert_count") is None:  # Youtu-LLM's: no experts (the converter calls every block a leading dense one)
        return YoutuConfig(**fields, architectures=["YoutuForCausalLM"])
    fields |= {"first_k_dense_replace": int(key("leading_dense_block_count", 0)), **_deepseek_style_experts(key)}
    if _deepseek2_sigmoid(key, fields):
        return DeepseekV3Config(**fields, rope_interleave=True, architectures=["DeepseekV3ForCausalLM"])
    return DeepseekV2Config(**fields, topk_method="greedy", architectures=["DeepseekV2ForCausalLM"])


def _deepseek2_sigmoid(key: Any, fields: dict[str, Any]) -> bool:
    """Whether a deepseek2 file's experts are chosen by sigmoid, as llama.cpp reads it: its gating
    key, or without one GLM-4.7-Flash's layers and vocabulary (DeepSeek V2's older files, softmax)."""
    gating = key("expert_gating_func")
    if gating is not None:
        return int(gating) == SIGMOID_GATING
    return int(key("block_count")) in GLM47_FLASH_LAYERS and fields["vocab_size"] == GLM47_FLASH_VOCABULARY


def _deepseek2_state(take: Any, model_config: Any) -> dict[str, Any]:
    """A deepseek2 file's weights by gguf's table, its rows as they are, but the latent's projection
    to the keys and values (kv_b_proj), which the converter writes as two (attn_k_b, each head's
    rows transposed, and attn_v_b): joined again, head by head."""
    import torch

    def special(hf: str) -> Any:
        if not hf.endswith("kv_b_proj.weight"):
            return moe_weight(take, hf)
        keys = take(f"{_block(hf)}attn_k_b.weight").transpose(1, 2)  # [heads, rank, nope] -> [heads, nope, rank]
        both = torch.cat([keys, take(f"{_block(hf)}attn_v_b.weight")], dim=1)
        return both.reshape(-1, both.shape[-1])

    return _by_name_table(take, model_config, DEEPSEEK2, special)


def _layer_count(key: Any) -> int:
    """The model's layers: the file's blocks less the multi-token prediction blocks (Nemotron 3
    Super's, GLM-4.5's) that the converter writes after them (read as layers, they would run too)."""
    return int(key("block_count")) - int(key("nextn_predict_layers", 0))


def _sigmoid_gated(key: Any, whose: str) -> None:
    """Refuses a file whose experts are not chosen by sigmoid, as `whose` are."""
    gating = key("expert_gating_func")
    if gating is not None and int(gating) != SIGMOID_GATING:
        raise BundleError(f"a file whose experts are not chosen by sigmoid (gating {gating}): {whose} are")


def _fused_qkv_state(found: dict[str, Any], take: Any, model_config: Any, arch: str) -> dict[str, Any]:
    """A chatglm or bailingmoe2 (`arch`) file's weights (`found`: its tensors) by gguf's table, its
    rows as they are (llama.cpp turns neighbouring pairs, as GLM does; Ling 2.0's halves, as
    GLM-4.5), experts by moe_weight; the queries, keys and values one tensor (attn_qkv: all queries,
    then keys, then values: glm-4-9b-chat's own layout, Ling 2.0's), split."""
    width, kv = model_config.head_dim, model_config.num_key_value_heads
    rows = {"q_proj": model_config.num_attention_heads * width, "k_proj": kv * width, "v_proj": kv * width}

    def special(hf: str) -> Any:
        proj, suffix = hf.split(".")[-2:]
        fused = f"{_block(hf)}attn_qkv.{suffix}"
        if proj not in rows or fused not in found:  # (the -hf layout's three: by the table)
            return moe_weight(take, hf)
        return take(fused).split(list(rows.values()))[list(rows).index(proj)]

    return _by_name_table(take, model_config, arch, special)


def _qwen2_moe_config(meta: dict[str, Any]) -> Any:
    """Qwen2-MoE's: Qwen2's attention (biased queries, keys and values), experts in every layer (a
    file states no dense ones) beside a shared expert gated by a sigmoid, the chosen experts' weights
    as the softmax gives them (llama.cpp does not scale them to sum to 1)."""
    from transformers import Qwen2MoeConfig

    key = _key(meta, QWEN2_MOE)
    return Qwen2MoeConfig(**_llama_fields(meta, QWEN2_MOE), **_qwen_experts(key),
                          shared_expert_intermediate_size=int(key("expert_shared_feed_forward_length")),
                          norm_topk_prob=False, architectures=["Qwen2MoeForCausalLM"])  # fmt: skip


def _qwen_experts(key: Any) -> dict[str, Any]:
    """The experts' fields of a Qwen-style config (Qwen2-MoE's, Qwen3-MoE's): how many, how many
    chosen, their width."""
    return {"num_experts": int(key("expert_count")), "num_experts_per_tok": int(key("expert_used_count")),
            "moe_intermediate_size": int(key("expert_feed_forward_length"))}


def _afmoe_config(meta: dict[str, Any]) -> Any:
    """Arcee's Trinity (AFMoE: Trinity Nano, Mini, Large), as llama.cpp runs it: a Llama's fields (its
    rows as they are: its converter, a Llama's, leaves them unpermuted), per-head query and key
    norms, the attention's output gated by a sigmoid (attn_gate), norms before and after each
    sublayer, µP's embedding scale (llama.cpp always applies it), every fourth layer global and
    unrotated, the others sliding (AFMOE_GLOBAL_EVERY), dense leading layers, then experts chosen by
    sigmoid plus the router's bias, their weights scaled to sum to 1 (transformers' AFMoE always
    scales them: a file that says otherwise is refused) and by expert_weights_scale, beside shared
    experts."""
    from transformers import AfmoeConfig

    key = _key(meta, AFMOE)
    _sigmoid_gated(key, "Trinity's")
    if not key("expert_weights_norm", False):
        raise BundleError("an afmoe file whose experts' weights are not scaled to sum to 1 (expert_weights_norm "
                          "false or absent, which llama.cpp runs so): Trinity's always are")  # fmt: skip
    window = key("attention.sliding_window")
    if window is None:
        raise BundleError("an afmoe file without a sliding window (attention.sliding_window): Trinity's layers slide "
                          "but every fourth")  # fmt: skip
    return AfmoeConfig(**_llama_fields(meta, AFMOE), **_qwen_experts(key),
                       num_shared_experts=int(key("expert_shared_count", 0)),
                       num_dense_layers=int(key("leading_dense_block_count", 0)),
                       route_scale=as_float32(key("expert_weights_scale", 1.0)), sliding_window=int(window),
                       global_attn_every_n_layers=AFMOE_GLOBAL_EVERY, mup_enabled=True,
                       architectures=["AfmoeForCausalLM"])  # fmt: skip


def _qwen3_vl_config(meta: dict[str, Any]) -> Any:
    """Qwen3-VL's language model as the Qwen3 (qwen3vl) or Qwen3 mixture of experts (qwen3vlmoe,
    experts in every layer, their weights scaled to sum to 1 as Qwen3-VL's always are) that runs
    its text."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    arch = str(meta["general.architecture"])
    key, fields = _key(meta, arch), _llama_fields(meta, arch)
    if arch == QWEN3VL:
        return Qwen3Config(**fields, architectures=["Qwen3ForCausalLM"])
    return Qwen3MoeConfig(**fields, **_qwen_experts(key), norm_topk_prob=True,
                          architectures=["Qwen3MoeForCausalLM"])  # fmt: skip


def _qwen2_vl_config(meta: dict[str, Any]) -> Any:
    """Qwen2-VL's and Qwen2.5-VL's language model as the Qwen2 that runs its text."""
    from transformers import Qwen2Config

    return Qwen2Config(**_llama_fields(meta, QWEN2VL), architectures=["Qwen2ForCausalLM"])


def _dots1_config(meta: dict[str, Any]) -> Any:
    """dots.llm1's: Qwen3's attention, dense leading layers, then DeepSeek V3's experts (sigmoid, a
    bias for choosing, shared experts); every layer global, as its published configs have them."""
    from transformers import Dots1Config

    key = _key(meta, DOTS1)
    return Dots1Config(**_llama_fields(meta, DOTS1), first_k_dense_replace=int(key("leading_dense_block_count", 0)),
                       **_deepseek_style_experts(key), sliding_window=None,
                       architectures=["Dots1ForCausalLM"])  # fmt: skip


def _gemma_config(meta: dict[str, Any]) -> Any:
    """Gemma's (the first): a Llama's fields (its heads' width from attention.key_length), its
    embeddings scaled and its LM head tied by its class, the tanh GELU."""
    from transformers import GemmaConfig

    return GemmaConfig(**_llama_fields(meta, GEMMA), hidden_act="gelu_pytorch_tanh", architectures=["GemmaForCausalLM"])


def _gemma_state(take: Any, model_config: Any) -> dict[str, Any]:
    """Gemma's weights by gguf's table, its rows as they are, each norm's weight less the one the
    converter added (Gemma scales by one plus the weight; llama.cpp by what it reads)."""
    out = _by_name_table(take, model_config, GEMMA)
    return {k: v - 1 if k.endswith("norm.weight") else v for k, v in out.items()}


def _seed_oss_config(meta: dict[str, Any]) -> Any:
    """ByteDance's Seed-OSS: a Llama with biases where its file has them."""
    from transformers import SeedOssConfig

    shapes = meta["shapes"]
    return SeedOssConfig(**_llama_fields(meta, SEED_OSS), attention_bias="blk.0.attn_q.bias" in shapes,
                         attention_out_bias="blk.0.attn_output.bias" in shapes, mlp_bias="blk.0.ffn_up.bias" in shapes,
                         architectures=["SeedOssForCausalLM"])  # fmt: skip


def _arcee_config(meta: dict[str, Any]) -> Any:
    """Arcee's AFM: a Llama whose MLP is ungated, its activation ReLU squared (ArceeConfig's own)."""
    from transformers import ArceeConfig

    return ArceeConfig(**_llama_fields(meta, ARCEE), architectures=["ArceeForCausalLM"])


def _hunyuan_config(meta: dict[str, Any]) -> Any:
    """Tencent's Hunyuan dense models: per-head query and key norms."""
    from transformers import HunYuanDenseV1Config

    return HunYuanDenseV1Config(**_llama_fields(meta, HUNYUAN_DENSE), architectures=["HunYuanDenseV1ForCausalLM"])


def _olmoe_config(meta: dict[str, Any]) -> Any:
    """OLMoE's: OLMo 2's norms of the whole query and key projections and experts whose chosen
    weights are not scaled to sum to 1 (llama.cpp's olmoe does not)."""
    from transformers import OlmoeConfig

    key = _key(meta, OLMOE)
    return OlmoeConfig(**_llama_fields(meta, OLMOE), num_experts=int(key("expert_count")),
                       num_experts_per_tok=int(key("expert_used_count")), norm_topk_prob=False,
                       architectures=["OlmoeForCausalLM"])  # fmt: skip


def _olmo_config(meta: dict[str, Any]) -> Any:
    """OLMo (1): a Llama with LayerNorms without weights (the file has none) and its queries, keys
    and values clipped where attention.clamp_kqv says."""
    from transformers import OlmoConfig

    clip = _key(meta, OLMO)("attention.clamp_kqv")
    fields = _llama_fields(meta, OLMO)
    del fields["rms_norm_eps"]  # (its LayerNorms' epsilon is OLMo's own, 1e-5)
    return OlmoConfig(**fields, clip_qkv=None if clip is None else float(clip), architectures=["OlmoForCausalLM"])


def _jais2_config(meta: dict[str, Any]) -> Any:
    """G42's Jais 2: a Llama with LayerNorms (biases), biased projections and an ungated ReLU-squared
    MLP (Jais2Config's own)."""
    from transformers import Jais2Config

    fields, shapes = _llama_fields(meta, JAIS2), meta["shapes"]
    fields["layer_norm_eps"] = fields.pop("rms_norm_eps")  # (its norms are LayerNorms)
    return Jais2Config(**fields, attention_bias="blk.0.attn_q.bias" in shapes, mlp_bias="blk.0.ffn_up.bias" in shapes,
                       architectures=["Jais2ForCausalLM"])  # fmt: skip


def _apertus_config(meta: dict[str, Any]) -> Any:
    """Swiss AI's Apertus: a Llama with per-head query and key norms and an ungated MLP whose xIELU
    activation has parameters of its own per layer (ApertusConfig's own)."""
    from transformers import ApertusConfig

    return ApertusConfig(**_llama_fields(meta, APERTUS), architectures=["ApertusForCausalLM"])


def _apertus_state(gguf: Path, meta: dict[str, Any], take: Any, model_config: Any) -> dict[str, Any]:
    """Apertus's weights by gguf's table (its rows as they are), and each layer's xIELU parameters,
    which llama.cpp's converter writes as keys (xielu.alpha_p and the rest: one number a layer),
    not tensors."""
    import torch

    names = ("alpha_p", "alpha_n", "beta", "eps")
    if missing := [n for n in names if f"xielu.{n}" not in meta]:
        raise BundleError(f"{gguf}: an {APERTUS} file without xielu.{missing[0]} (its activation's parameters)")
    per_layer = {n: [float(v) for v in meta[f"xielu.{n}"]] for n in names}

    def special(hf: str) -> Any:
        name = hf.rpartition(".act_fn.")[2]
        if ".act_fn." not in hf or name not in per_layer:
            return None
        value = torch.tensor(per_layer[name][int(hf.split(".")[2])], dtype=torch.float32)
        return value.reshape(1) if name.startswith("alpha") else value  # (alphas are learnt: [1]; the rest scalars)

    return _by_name_table(take, model_config, APERTUS, special)


def _ernie_config(meta: dict[str, Any]) -> Any:
    """Baidu's ERNIE 4.5 dense models (0.3B): a Llama whose RoPE turns adjacent pairs (the
    converter leaves its rows as they are), with biases where its file has them."""
    from transformers import Ernie4_5Config

    return Ernie4_5Config(**_llama_fields(meta, ERNIE4_5), use_bias="blk.0.attn_q.bias" in meta["shapes"],
                          architectures=["Ernie4_5ForCausalLM"])  # fmt: skip


def _ernie_moe_config(meta: dict[str, Any]) -> Any:
    """ERNIE 4.5's mixtures of experts (ERNIE-4.5-21B-A3B): its dense models' layers, dense leading
    layers, then experts every interleave_moe_layer_step layers to the last, chosen by softmax with
    a bias for choosing (exp_probs_b) and mixed scaled to sum to 1, beside shared experts (their
    width from their tensors: the converter writes the MLP's width over the key heads)."""
    from transformers import Ernie4_5_MoeConfig

    key, shapes = _key(meta, ERNIE4_5_MOE), meta["shapes"]
    fields = _llama_fields(meta, ERNIE4_5_MOE)
    return Ernie4_5_MoeConfig(**fields, use_bias="blk.0.attn_q.bias" in shapes,
                              moe_num_experts=int(key("expert_count")), moe_k=int(key("expert_used_count")),
                              moe_intermediate_size=int(key("expert_feed_forward_length")),
                              moe_num_shared_experts=int(key("expert_shared_count", 0)),
                              moe_layer_start_index=int(key("leading_dense_block_count", 0)),
                              moe_layer_interval=int(key("interleave_moe_layer_step", 1)),
                              moe_layer_end_index=fields["num_hidden_layers"] - 1,
                              architectures=["Ernie4_5_MoeForCausalLM"])  # fmt: skip


def _lfm2_moe_config(meta: dict[str, Any]) -> Any:
    """Liquid's LFM2 mixtures of experts (LFM2-8B-A1B): LFM2's short convolutions (the layers with
    no key heads) and attention, dense leading layers, then experts routed by sigmoid with a bias
    for choosing them, the chosen weights normalised (llama.cpp always does)."""
    from transformers import Lfm2MoeConfig

    key, shapes = _key(meta, LFM2_MOE), meta["shapes"]
    _sigmoid_gated(key, f"{LFM2_MOE} files'")
    fields = _llama_fields(meta, LFM2_MOE)
    del fields["rms_norm_eps"]
    return Lfm2MoeConfig(**fields, norm_eps=as_float32(key("attention.layer_norm_rms_epsilon")),
                         layer_types=["full_attention" if h else "conv" for h in _key_heads(meta, LFM2_MOE)],
                         conv_L_cache=int(key("shortconv.l_cache")), conv_bias="blk.0.shortconv.conv.bias" in shapes,
                         moe_intermediate_size=int(key("expert_feed_forward_length")),
                         num_dense_layers=int(key("leading_dense_block_count", 0)),
                         num_experts=int(key("expert_count")), num_experts_per_tok=int(key("expert_used_count")),
                         use_expert_bias=any(name.endswith("exp_probs_b.bias") for name in shapes),
                         norm_topk_prob=True, routed_scaling_factor=float(key("expert_weights_scale", 1.0)) or 1.0,
                         architectures=["Lfm2MoeForCausalLM"])  # fmt: skip


def _lfm2_moe_state(take: Any, model_config: Any) -> dict[str, Any]:
    """LFM2's weights by gguf's table, its convolutions' kernels [hidden, length] given their
    channel dimension back, its experts by moe_weight and their bias for choosing."""

    def special(hf: str) -> Any:
        if hf.endswith("conv.conv.weight"):
            return take(f"{_block(hf)}shortconv.conv.weight").unsqueeze(1)
        if hf.endswith("feed_forward.expert_bias"):
            return take(f"{_block(hf)}exp_probs_b.bias")
        return moe_weight(take, hf)

    return _by_name_table(take, model_config, LFM2_MOE, special)


def _granite_hybrid_state(take: Any, model_config: Any) -> dict[str, Any]:
    """Granite 4.0-H's weights: its attention's as a Granite's (permuted), its Mamba layers' by
    _mamba_weight, its shared MLP's gate and up projections joined again (named as a plain MLP's
    where the model has no experts)."""
    import torch

    plain = not model_config.num_local_experts  # the shared MLP then has a plain MLP's names

    def special(hf: str) -> Any:
        blk = _block(hf)
        if plain and hf.endswith("shared_mlp.input_linear.weight"):
            return torch.cat([take(f"{blk}ffn_gate.weight"), take(f"{blk}ffn_up.weight")], dim=0)
        if plain and hf.endswith("shared_mlp.output_linear.weight"):
            return take(f"{blk}ffn_down.weight")
        return _mamba_or_experts(take, hf)

    return _unpermuted(_by_name_table(take, model_config, GRANITE_HYBRID, special), model_config)


def _nemotron_h_config(meta: dict[str, Any]) -> Any:
    """NVIDIA's Nemotron-H (Nemotron Nano 2, Nemotron-H 4B and 8B; nemotron_h_moe: Nemotron 3's, with
    experts): blocks of one mixer each, told apart by the file's per-layer lists and tensors:
    attention where a layer has key heads, experts where it has their tensors, an MLP (squared ReLU)
    where it has a width, Mamba 2 elsewhere. No RoPE; the converter writes a context of 2^20."""
    from transformers import NemotronHConfig

    arch = str(meta["general.architecture"])
    key, shapes = _key(meta, arch), meta["shapes"]
    layers = _layer_count(key)
    widths, heads = key("feed_forward_length"), _key_heads(meta, arch)[:layers]
    widths = [int(w) for w in widths][:layers] if isinstance(widths, list) else [int(widths)] * layers
    kinds = ["full_attention" if h else "moe" if f"blk.{i}.ffn_up_exps.weight" in shapes else
             "mlp" if w else "linear_attention" for i, (h, w) in enumerate(zip(heads, widths, strict=True))]
    inner, ssm_heads = int(key("ssm.inner_size")), int(key("ssm.time_step_rank"))
    first = {kind: kinds.index(kind) if kind in kinds else 0 for kind in ("linear_attention", "mlp", "full_attention")}
    experts = {} if "moe" not in kinds else _deepseek_style_experts(key) | {
        "moe_shared_expert_intermediate_size": int(key("expert_shared_feed_forward_length")),
        "moe_latent_size": key("moe_latent_size")}

    def has(kind: str, tensor: str) -> bool:
        return f"blk.{first[kind]}.{tensor}" in shapes

    return NemotronHConfig(
        vocab_size=shapes["token_embd.weight"][0], hidden_size=int(key("embedding_length")), layers_block_type=kinds,
        intermediate_size=max(widths), num_attention_heads=int(key("attention.head_count")),
        num_key_value_heads=max(heads), head_dim=int(key("attention.key_length")),
        max_position_embeddings=int(key("context_length")),
        layer_norm_epsilon=as_float32(key("attention.layer_norm_rms_epsilon", key("attention.layer_norm_epsilon"))),
        mamba_num_heads=ssm_heads, mamba_head_dim=inner // ssm_heads, n_groups=int(key("ssm.group_count")),
        ssm_state_size=int(key("ssm.state_size")), conv_kernel=int(key("ssm.conv_kernel")),
        use_conv_bias=has("linear_attention", "ssm_conv1d.bias"),
        mamba_proj_bias=has("linear_attention", "ssm_in.bias"),
        mlp_bias=has("mlp", "ffn_up.bias"), attention_bias=has("full_attention", "attn_q.bias"),
        architectures=["NemotronHForCausalLM"], **experts, **_tokens_and_tying(meta))  # fmt: skip


def _nemotron_h_state(take: Any, model_config: Any) -> dict[str, Any]:
    """Nemotron-H's weights by gguf's table, its attention's permuted as a Granite's (the converter
    is Granite 4.0-H's), its Mamba layers' by _mamba_weight, its experts' by moe_weight."""
    arch = NEMOTRON_H_MOE if "moe" in model_config.layers_block_type else NEMOTRON_H
    out = _by_name_table(take, model_config, arch, lambda hf: _mamba_or_experts(take, hf), prefix="backbone.")
    return _unpermuted(out, model_config)


def _phi2_config(meta: dict[str, Any]) -> Any:
    """Microsoft's Phi-2 (and Phi-1.5): attention and MLP side by side on one LayerNorm, partial
    rotary (rope.dimension_count of each head), biases, an LM head with one. llama.cpp's converter
    writes four times the hidden size as the MLP's width, whatever it is: it is read from the
    tensors."""
    from transformers import PhiConfig

    key, shapes = _key(meta, PHI2), meta["shapes"]
    fields = _partially_rotated_fields(meta, PHI2)
    return PhiConfig(**fields, intermediate_size=shapes["blk.0.ffn_up.weight"][0],
                     num_key_value_heads=int(key("attention.head_count_kv", fields["num_attention_heads"])),
                     architectures=["PhiForCausalLM"])  # fmt: skip


def _partially_rotated_fields(meta: dict[str, Any], arch: str) -> dict[str, Any]:
    """The config fields of a file of LayerNorms and part of each head rotated (rope.dimension_count
    of the hidden size shared out): Phi-2's, GPT-NeoX's."""
    key, shapes = _key(meta, arch), meta["shapes"]
    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    rope = {"rope_type": "default", "rope_theta": float(key("rope.freq_base", 10000.0)),
            "partial_rotary_factor": int(key("rope.dimension_count")) / (hidden // heads)}  # fmt: skip
    return dict(vocab_size=shapes["token_embd.weight"][0], hidden_size=hidden, num_attention_heads=heads,
                num_hidden_layers=int(key("block_count")), max_position_embeddings=int(key("context_length")),
                layer_norm_eps=as_float32(key("attention.layer_norm_epsilon")), rope_parameters=rope,
                **_tokens_and_tying(meta))  # fmt: skip


def _gpt_neox_config(meta: dict[str, Any]) -> Any:
    """EleutherAI's GPT-NeoX (Pythia, Dolly 2, RedPajama-INCITE): LayerNorms, biases, part of each head
    rotated (rope.dimension_count), the attention and the MLP side by side or one after the other
    (use_parallel_residual). The converter writes no RoPE base (every published model's is 10000) nor
    activation: the exact GELU of every published config (llama.cpp runs the tanh one)."""
    from transformers import GPTNeoXConfig

    key = _key(meta, GPT_NEOX)
    return GPTNeoXConfig(**_partially_rotated_fields(meta, GPT_NEOX), intermediate_size=int(key("feed_forward_length")),
                         use_parallel_residual=bool(key("use_parallel_residual", True)), hidden_act="gelu",
                         architectures=["GPTNeoXForCausalLM"])  # fmt: skip


def _gpt_neox_state(take: Any, model_config: Any) -> dict[str, Any]:
    """GPT-NeoX's weights by gguf's table, each layer's fused queries, keys and values put back head by
    head (the converter writes all queries, then keys, then values)."""
    heads = model_config.num_attention_heads

    def special(hf: str) -> Any:
        if ".attention.query_key_value." not in hf:
            return None
        fused = take(f"{_block(hf)}attn_qkv.{hf.rpartition('.')[2]}")
        return fused.reshape(3, heads, -1, *fused.shape[1:]).transpose(0, 1).reshape(fused.shape)

    return _by_name_table(take, model_config, GPT_NEOX, special)


def _mpt_config(meta: dict[str, Any]) -> Any:
    """MosaicML's MPT: ALiBi, LayerNorms without biases, no biases, an MLP 4 times as wide as the
    layer. The converter writes ALiBi's maximum bias (0 for learned positions), the clip of the
    queries, keys and values where there is one, and key-value heads where they are grouped: what
    of these transformers runs otherwise than the model (gpt_families.MPT_OPTIONS) is refused."""
    from transformers import MptConfig

    key, shapes = _key(meta, MPT), meta["shapes"]
    heads, alibi = int(key("attention.head_count")), as_float32(key("attention.max_alibi_bias", 0.0))
    for found, what in ((key("attention.clamp_kqv") is not None, "its queries, keys and values clipped"),
                        (alibi != MPT_ALIBI_BIAS_MAX, f"ALiBi's maximum bias {alibi:g} (read: {MPT_ALIBI_BIAS_MAX})"),
                        (int(key("attention.head_count_kv", heads)) != heads, "grouped key-value heads")):  # fmt: skip
        if found:
            raise BundleError(f"an MPT file with {what} is not supported")
    return MptConfig(vocab_size=shapes["token_embd.weight"][0], d_model=int(key("embedding_length")), n_heads=heads,
                     n_layers=int(key("block_count")), max_seq_len=int(key("context_length")),
                     layer_norm_epsilon=as_float32(key("attention.layer_norm_epsilon")),
                     architectures=["MptForCausalLM"], **_tokens_and_tying(meta))  # fmt: skip


def _starcoder_config(meta: dict[str, Any]) -> Any:
    """BigCode's StarCoder (1), SantaCoder and tiny_starcoder (GPT-BigCode): learned positions, one
    key head (multi-query) or as many as the queries, LayerNorms, biases, a tanh GELU (llama.cpp's;
    the file does not say). Its MLP's width, which the converter writes as four times the hidden
    size, is read from the tensors."""
    from transformers import GPTBigCodeConfig

    key, shapes = _key(meta, STARCODER), meta["shapes"]
    heads = int(key("attention.head_count"))
    return GPTBigCodeConfig(
        vocab_size=shapes["token_embd.weight"][0], n_embd=int(key("embedding_length")),
        n_inner=shapes["blk.0.ffn_up.weight"][0], n_layer=int(key("block_count")), n_head=heads,
        multi_query=int(key("attention.head_count_kv", heads)) == 1, n_positions=shapes["position_embd.weight"][0],
        layer_norm_epsilon=as_float32(key("attention.layer_norm_epsilon")), activation_function="gelu_pytorch_tanh",
        architectures=["GPTBigCodeForCausalLM"], **_tokens_and_tying(meta))  # fmt: skip


def _jamba_config(meta: dict[str, Any]) -> Any:
    """AI21's Jamba (Jamba Reasoning 3B, Jamba Mini): Mamba (1) layers, their time step, B and C
    normed, and attention layers without RoPE; experts in some layers. Its config places both by a
    period and an offset, read back from the file's per-layer key heads and routers."""
    from transformers import JambaConfig

    key, shapes = _key(meta, JAMBA), meta["shapes"]
    fields = _llama_fields(meta, JAMBA)
    layers, hidden, inner = fields["num_hidden_layers"], fields["hidden_size"], int(key("ssm.inner_size"))
    attention = [bool(h) for h in _key_heads(meta, JAMBA)]
    experts = [f"blk.{i}.ffn_gate_inp.weight" in shapes for i in range(layers)]
    (attn_period, attn_offset), (expert_period, expert_offset) = _period(attention), _period(experts)
    if inner % hidden:
        raise BundleError(f"a {JAMBA} file whose Mamba width ({inner}) is not a multiple of its hidden size ({hidden})")
    mamba = attention.index(False) if False in attention else 0
    del fields["rope_parameters"]  # (no RoPE)
    return JambaConfig(
        **fields, attn_layer_period=attn_period, attn_layer_offset=attn_offset, expert_layer_period=expert_period,
        expert_layer_offset=expert_offset, num_experts=int(key("expert_count", 1)),
        num_experts_per_tok=int(key("expert_used_count", 1)), mamba_d_state=int(key("ssm.state_size")),
        mamba_d_conv=int(key("ssm.conv_kernel")), mamba_expand=inner // hidden,
        mamba_dt_rank=int(key("ssm.time_step_rank")), mamba_conv_bias=f"blk.{mamba}.ssm_conv1d.bias" in shapes,
        mamba_proj_bias=f"blk.{mamba}.ssm_in.bias" in shapes, architectures=["JambaForCausalLM"])  # fmt: skip


def _period(flags: list[bool]) -> tuple[int, int]:
    """The smallest (period, offset) with layer i flagged exactly where i % period == offset (a
    config of Jamba's places its layers so); one past the layers where none is."""
    if not any(flags):
        return len(flags) + 1, len(flags)
    offset = flags.index(True)
    for period in range(offset + 1, len(flags) + 1):
        if all(flag == (i % period == offset) for i, flag in enumerate(flags)):
            return period, offset
    raise BundleError(f"a layer pattern no period and offset describes ({''.join('x' if f else '.' for f in flags)}): "
                      "a Jamba config places its layers by one")  # fmt: skip


def _gguf_arch(name: str) -> Any:
    """gguf's enum of the architecture llama.cpp names `name`."""
    from gguf import MODEL_ARCH_NAMES

    return next(arch for arch, arch_name in MODEL_ARCH_NAMES.items() if arch_name == name)


def _falcon_h1_config(meta: dict[str, Any]) -> Any:
    """TII's Falcon-H1: attention and a Mamba 2 mixer side by side in every layer. llama.cpp's
    converter multiplies the µP multipliers into the weights they scale, so the model is read with
    each of them 1; its Mamba norm comes after the gate, as llama.cpp runs it."""
    from transformers import FalconH1Config

    key, shapes = _key(meta, FALCON_H1), meta["shapes"]
    inner, heads = int(key("ssm.inner_size")), int(key("ssm.time_step_rank"))
    ones: dict[str, Any] = dict(
        embedding_multiplier=1.0, lm_head_multiplier=1.0, mlp_multipliers=[1.0, 1.0], key_multiplier=1.0,
        attention_in_multiplier=1.0, attention_out_multiplier=1.0, ssm_multipliers=[1.0] * 5, ssm_in_multiplier=1.0,
        ssm_out_multiplier=1.0)  # fmt: skip
    return FalconH1Config(
        **_llama_fields(meta, FALCON_H1), **ones, mamba_d_ssm=inner, mamba_n_heads=heads, mamba_d_head=inner // heads,
        mamba_n_groups=int(key("ssm.group_count")), mamba_d_state=int(key("ssm.state_size")),
        mamba_d_conv=int(key("ssm.conv_kernel")), mamba_conv_bias="blk.0.ssm_conv1d.bias" in shapes,
        mamba_proj_bias="blk.0.ssm_in.bias" in shapes, mamba_rms_norm="blk.0.ssm_norm.weight" in shapes,
        mamba_norm_before_gate=False, attention_bias="blk.0.attn_q.bias" in shapes,
        mlp_bias="blk.0.ffn_up.bias" in shapes, architectures=["FalconH1ForCausalLM"])  # fmt: skip


def _falcon_h1_state(take: Any, model_config: Any) -> dict[str, Any]:
    """Falcon-H1's weights by gguf's table (its attention's rows as they are: the converter is a
    Mamba 2 one), its Mamba mixer's by _mamba_weight, and its MLP's norm, which the converter
    names without ".weight"."""

    def special(hf: str) -> Any:
        return take(f"{_block(hf)}ffn_norm") if hf.endswith("pre_ff_layernorm.weight") else _mamba_weight(take, hf)

    return _by_name_table(take, model_config, FALCON_H1, special)


def _mamba_weight(take: Any, hf: str) -> Any:
    """A Mamba (1 or 2) mixer's weight named `hf` as llama.cpp's converter reshapes it (A stored as
    -exp(A_log), Mamba 2's A and D given a dimension of 1, the convolution kernels losing one, the
    gated norm split by group), or None for any other weight."""
    import torch

    blk = _block(hf)
    if hf.endswith(".A_log"):  # in float64, so that the float32 exp's rounding is undone exactly
        return torch.log(-take(f"{blk}ssm_a").double()).float().squeeze(-1)
    if hf.endswith(".D"):
        return take(f"{blk}ssm_d").squeeze(-1)
    if hf.endswith(("mamba.norm.weight", "mixer.norm.weight")):  # (a layer's own norm is not the mixer's)
        return take(f"{blk}ssm_norm.weight").reshape(-1)
    if hf.endswith(".conv1d.weight"):
        return take(f"{blk}ssm_conv1d.weight").unsqueeze(1)
    return take(f"{blk}ssm_dt.bias") if hf.endswith(".dt_bias") else None


def _mamba_or_experts(take: Any, hf: str) -> Any:
    """A hybrid's Mamba mixer's weight (_mamba_weight) or its experts' (moe_weight), or None."""
    mamba = _mamba_weight(take, hf)
    return moe_weight(take, hf) if mamba is None else mamba


def moe_weight(take: Any, hf: str) -> Any:
    """A mixture of experts' weight named `hf` (transformers' name) read through `take` (llama.cpp's
    names -> tensors), or None for any other: the experts' gate and up projections, which the
    converter writes apart, joined again (Mixtral, Granite, OLMoE), the rest taken as they are
    (Nemotron 3's experts have no gate, their router a correction bias)."""
    import torch

    blk = _block(hf)
    if hf.endswith("experts.gate_up_proj"):  # [experts, width, hidden] gate and up -> [experts, 2 x width, hidden]
        return torch.cat([take(f"{blk}ffn_gate_exps.weight"), take(f"{blk}ffn_up_exps.weight")], dim=1)
    if hf.endswith("experts.up_proj"):
        return take(f"{blk}ffn_up_exps.weight")
    if hf.endswith(("gate.e_score_correction_bias", "moe_statics.e_score_correction_bias",  # (ERNIE's: [1, experts])
                    "mlp.expert_bias")):  # (AFMoE's: the block's)
        return take(f"{blk}exp_probs_b.bias")
    if hf.endswith("shared_mlp.input_linear.weight"):  # Granite's shared expert: [2 x width, hidden]
        return torch.cat([take(f"{blk}ffn_gate_shexp.weight"), take(f"{blk}ffn_up_shexp.weight")], dim=0)
    if hf.endswith("experts.down_proj"):
        return take(f"{blk}ffn_down_exps.weight")
    if hf.endswith(("block_sparse_moe.router.weight", "mlp.gate.weight", "feed_forward.gate.weight",
                    "feed_forward.router.weight", "mlp.router.gate.weight")):  # the router
        return take(f"{blk}ffn_gate_inp.weight")
    return None


def _block(hf: str) -> str:
    """The prefix of llama.cpp's names of the layer that transformers' weight `hf` is in ("blk.N."
    for "model.layers.N.", "gpt_neox.layers.N."), or "" for a weight of no layer."""
    parts = hf.split(".")
    return f"blk.{parts[2]}." if len(parts) > 3 and parts[1] == "layers" else ""


def _llama_state(take: Any, model_config: Any) -> dict[str, Any]:
    """A Llama's weights by gguf's table, the queries' and keys' rows put back from the order
    llama.cpp's converter permutes them to (each head's two halves interleaved) where it does, as
    transformers' loader does for a "llama" file; experts read by moe_weight."""
    arch, permuted = LLAMA_SHAPED[model_config.model_type]
    out = _by_name_table(take, model_config, arch, lambda hf: moe_weight(take, hf))
    return _unpermuted(out, model_config) if permuted else out


def _unpermuted(state: dict[str, Any], model_config: Any) -> dict[str, Any]:
    """`state` with its queries' and keys' rows put back from llama.cpp's order (each head's two
    halves interleaved)."""
    out = dict(state)
    for name, value in state.items():
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = model_config.num_attention_heads if "q_proj" in name else model_config.num_key_value_heads
            half = value.shape[0] // heads // 2
            out[name] = value.reshape(heads, half, 2, -1).swapaxes(1, 2).reshape(value.shape)
    return out
