"""The tiny fixtures (tiny.py) written as GGUF files, the way llama.cpp's convert_hf_to_gguf.py writes
each family, so the `--from X.gguf` build path is checked per architecture without a model download
(and, but for the CONVERTED families, without llama.cpp's source). Tensors stay F32, so a bundle
built from the file can be compared with the one built from the Hugging Face folder
(tiny.tiny_bundle) to float32 rounding.

What llama.cpp does per family, and so what is done here (transformers' GGUF loader undoes it):

- llama, mistral: written as architecture "llama" (llama.cpp has no Mistral architecture for these),
  with the query and key rows of each head permuted from the rotate-half order to interleaved
  pairs; the loader permutes them back. llama.cpp writes no sliding window for the llama
  architecture; the window is written here under the GGUF key `llama.attention.sliding_window`,
  which gguf_to_hf reads (see there). Llama 3.1's RoPE scaling, where a model has it, as the
  tensor rope_freqs (each frequency's divisor), llama.cpp's only record of it.
- qwen2, qwen3: tensors as they are; Qwen3's head width as `attention.key_length`.
- mixtral: written as architecture "llama" (llama.cpp converts Mixtral with its Llama class), with
  `expert_count` and `expert_used_count`, the feed-forward length the experts' width; the router
  as ffn_gate_inp and each layer's experts stacked as for qwen3moe (w1, w3 and w2 are the gate, up
  and down projections). transformers' loader reads such a file as a plain Llama and leaves the
  experts out; gguf_to_hf reads them itself.
- qwen3moe: Qwen3's, and the experts: `expert_count`, `expert_used_count` and
  `expert_feed_forward_length`; the router as ffn_gate_inp, and each layer's experts (saved one
  by one) stacked into ffn_gate_exps, ffn_up_exps and ffn_down_exps ([experts, out, in] each).
  (llama.cpp scales the chosen experts' weights to sum to 1, and writes no key for it.)
- phi3: the fused qkv_proj and gate_up_proj as attn_qkv and ffn_up; the rotated width as
  `rope.dimension_count`; LongRoPE's factors as the tensors rope_factors_long/short, with
  `rope.scaling.attn_factor` and `rope.scaling.original_context_length`.
- gemma2: every RMSNorm weight stored plus one (as for gemma3, below); the soft-caps and the
  window as `attn_logit_softcapping`, `final_logit_softcapping` and `attention.sliding_window`; no
  RoPE base (llama.cpp writes none); no LM head (llama.cpp drops it: Gemma 2 ties it to the
  embeddings).
- nemotron: every LayerNorm weight stored plus one (its norm multiplies by 1 + w); the epsilon as
  both `attention.layer_norm_rms_epsilon` and `attention.layer_norm_epsilon`, the rotated width
  as `rope.dimension_count`, and `rope.scaling.type` none, as llama.cpp writes them.
- gemma3: every RMSNorm weight stored plus one (Gemma's norm multiplies by 1 + w; llama.cpp's by
  w); the global layers' RoPE base as `rope.freq_base`, the sliding layers' as
  `rope.freq_base_swa`. llama.cpp's converter writes no layer pattern (llama.cpp assumes Gemma 3's
  five sliding layers to one global); the tiny model's own pattern is written under the GGUF key
  `attention.sliding_window_pattern`, as an array of one flag per layer, which gguf_to_hf reads.
  The global layers' linear RoPE scaling, where a model has it, as `rope.scaling.type` and
  `rope.scaling.factor`.

The tokenizer is written as llama.cpp writes a Hugging Face byte-level BPE ("gpt2"): tokens,
token types (special added tokens as CONTROL), merges, the special ids and the chat template.

Checked against llama.cpp's own converter where its source is cached (bench/llama_server.sh puts it
there): the same tensors bit for bit and the same metadata but for general.* and the two keys named
above (tests/engine/test_gguf_architectures.py). Qwen3.5's and Gemma 4's files (CONVERTED) are that
converter's own: its conversion of them (Qwen3.5's value heads reordered, fused projections split,
decay's exponent negated and norms shifted; Gemma 4's per-layer lists and frequency table) is not
repeated here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from firmware.toolchain.tiny import chat_style

# Fixture architecture -> the GGUF architecture llama.cpp writes it as.
GGUF_ARCHITECTURES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "phi3_longrope": "phi3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "nemotron": "nemotron",
    "llama_rope_llama3": "llama",
    "llama_wide": "llama",  # (DeepSeek-R1-Distill-Llama's heads and tokens: theirs special, as in its files)
    "gemma3_linear": "gemma3",
    "lfm2": "lfm2",
    "qwen3_moe": "qwen3moe",
    "mixtral": "llama",
}
# Fixtures whose GGUF file llama.cpp's own converter writes (llama_cpp_convert), for families whose
# conversion this module does not repeat: Qwen3.5's reorders its linear attention's value heads,
# splits its fused projections, negates the exponent of its decay and shifts its norms; Gemma 4's
# writes per-layer lists, a frequency table for its partial rotation and its per-layer inputs.
CONVERTED = {"qwen3_5": "qwen35", "qwen3_5_moe": "qwen35moe", "gemma4": "gemma4", "gemma4_e": "gemma4",
             "gemma4_text": "gemma4", "gpt2": "gpt2", "falcon": "falcon", "bloom": "bloom", "gpt_oss": "gpt-oss",
             "mpt": "mpt", "gemma3n_text": "gemma3n", "ministral3": "mistral3", "mistral3_vl": "mistral3",
             "granite": "granite", "smollm3": "smollm3", "granitemoe": "granitemoe",
             "granitemoeshared": "granitemoe", "olmo2": "olmo2", "olmo3": "olmo2", "exaone4": "exaone4",
             "exaone4_global": "exaone4", "stablelm": "stablelm", "cohere": "command-r",
             "cohere2": "cohere2", "glm4": "glm4", "seed_oss": "seed_oss", "arcee": "arcee",
             "hunyuan": "hunyuan-dense", "olmoe": "olmoe", "ernie4_5": "ernie4_5", "lfm2_moe": "lfm2moe",
             "granite4": "granite", "granite4_h": "granitehybrid", "granite4_moe": "granitehybrid",
             "nemotron_h": "nemotron_h", "falcon_h1": "falcon-h1", "jamba": "jamba",
             "phi": "phi2", "gpt_bigcode": "starcoder", "internlm3": "llama",
             "llama_rope_linear": "llama", "qwen2_yarn": "qwen2", "nemotron_h_moe": "nemotron_h_moe",
             "exaone": "exaone", "glm4_moe": "glm4moe", "deepseek_v3": "deepseek2", "deepseek_v2": "deepseek2",
             "youtu": "deepseek2", "dots1": "dots1", "solar_open": "glm4moe",
             "ernie4_5_moe": "ernie4_5-moe", "qwen3_vl": "qwen3vl", "qwen3_vl_moe": "qwen3vlmoe",
             "qwen2_vl": "qwen2vl", "qwen2_5_vl": "qwen2vl",
             "olmo": "olmo", "jais2": "jais2", "apertus": "apertus", "gpt_neox": "gptneox", "glm": "chatglm",
             "qwen2_moe": "qwen2moe", "gemma": "gemma", "ling2": "bailingmoe2",
             "afmoe": "afmoe", "minicpm": "minicpm"}
# What the converter is told for them: the published Qwen3.5 models have a multi-token prediction
# layer, which a tiny one lacks.
CONVERT_OPTIONS = {"qwen3_5": ("--no-mtp",), "qwen3_5_moe": ("--no-mtp",)}
GGUF_ARCHITECTURES.update(CONVERTED)
# The names llama.cpp takes from each model card; transformers' loader reads a "llama" file as
# Mistral only when the name is exactly "mistral", which no real Mistral file's is.
MODEL_NAMES = {"mistral": "Tiny Mistral Instruct"}

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4  # gguf.TokenType


def _rope_parameters(config: dict[str, Any], layer_type: str = "full_attention") -> dict[str, Any]:
    rope = config.get("rope_parameters") or {}
    return dict(rope.get(layer_type, rope))


def _permute_for_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rotate-half (Hugging Face) to interleaved pairs (llama.cpp), per head: what the loader undoes."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_divisors(rope: dict[str, Any], rotary_dim: int) -> np.ndarray:
    """Llama 3.1's RoPE scaling as llama.cpp stores it (the tensor rope_freqs): what each rotary
    frequency is divided by; 1 for short wavelengths, `factor` for long ones, a blend between."""
    factor, low, high = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    original = float(rope["original_max_position_embeddings"])
    freqs = 1.0 / float(rope["rope_theta"]) ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    wavelen = 2 * math.pi / freqs
    smooth = (original / wavelen - low) / (high - low)
    blend = 1 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, blend))
    return out.astype(np.float32)


def write_tiny_gguf(hf_dir: Path, out: Path, arch: str) -> None:
    """Write the tiny Hugging Face folder of fixture `arch` (tiny.tiny_hf_dir) as one F32 GGUF file."""
    import gguf
    from safetensors.numpy import load_file

    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"no GGUF form for fixture {arch!r}: choose one of {', '.join(GGUF_ARCHITECTURES)}")
    config = json.loads((hf_dir / "config.json").read_text())
    arch_name = GGUF_ARCHITECTURES[arch]
    model_arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch_name)
    n_layers, n_embd = int(config["num_hidden_layers"]), int(config["hidden_size"])
    n_head, n_head_kv = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    head_dim = int(config.get("head_dim") or n_embd // n_head)
    rope = _rope_parameters(config)
    rope_dims = int(rope.get("partial_rotary_factor", 1.0) * n_embd) // n_head  # as llama.cpp computes it

    w = gguf.GGUFWriter(str(out), arch_name)
    w.add_name(MODEL_NAMES.get(arch, f"tiny {arch}"))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(int(config["max_position_embeddings"]))
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layers)
    tensors = load_file(str(hf_dir / "model.safetensors"))
    if arch_name == "lfm2":  # the MLP's width as its weights have it (the config's is adjusted at load)
        w.add_feed_forward_length(int(tensors["model.layers.0.feed_forward.w1.weight"].shape[0]))
    else:
        w.add_feed_forward_length(int(config["intermediate_size"]))
    w.add_head_count(n_head)
    if arch_name == "lfm2":  # llama.cpp tells its convolution layers by their zero KV heads
        w.add_head_count_kv([n_head_kv if t == "full_attention" else 0 for t in config["layer_types"]])
        w.add_shortconv_l_cache(int(config["conv_L_cache"]))
        w.add_vocab_size(int(config["vocab_size"]))
    else:
        w.add_head_count_kv(n_head_kv)
    eps = float(config.get("rms_norm_eps") or config["norm_eps"])  # Nemotron names it norm_eps
    w.add_layer_norm_rms_eps(eps)
    if arch_name != "gemma2":  # llama.cpp writes no base for Gemma 2 (its models' is the default, 10000)
        w.add_rope_freq_base(float(rope["rope_theta"]))
    if config.get("head_dim"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch_name == "llama" and config.get("num_local_experts"):  # Mixtral's, written as a Llama with experts
        w.add_expert_count(int(config["num_local_experts"]))
        w.add_expert_used_count(int(config["num_experts_per_tok"]))
    if arch_name == "qwen3moe":
        w.add_expert_count(int(config.get("num_experts") or config["num_local_experts"]))  # transformers 5: the latter
        w.add_expert_used_count(int(config["num_experts_per_tok"]))
        w.add_expert_feed_forward_length(int(config["moe_intermediate_size"]))
    if arch_name == "llama":
        w.add_vocab_size(int(config["vocab_size"]))
        w.add_rope_dimension_count(head_dim)
        if config.get("sliding_window"):
            w.add_sliding_window(int(config["sliding_window"]))
    if arch_name == "phi3":
        w.add_rope_dimension_count(rope_dims)
        original = int(rope.get("original_max_position_embeddings") or config["original_max_position_embeddings"])
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_sliding_window(int(config.get("sliding_window") or 0))  # 0: none (as for Phi-4)
    if arch_name == "nemotron":
        w.add_vocab_size(int(config["vocab_size"]))
        w.add_layer_norm_eps(eps)
        w.add_rope_dimension_count(rope_dims)
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    if arch_name == "gemma2":
        w.add_attn_logit_softcapping(float(config["attn_logit_softcapping"]))
        w.add_final_logit_softcapping(float(config["final_logit_softcapping"]))
        w.add_sliding_window(int(config["sliding_window"]))
    if arch_name == "gemma3":
        w.add_sliding_window(int(config["sliding_window"]))
        w.add_rope_freq_base_swa(float(_rope_parameters(config, "sliding_attention")["rope_theta"]))
        w.add_sliding_window_pattern([t == "sliding_attention" for t in config["layer_types"]])
        if rope.get("rope_type") == "linear":  # the global layers' scaling (Gemma 3 4B-27B)
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(rope["factor"]))

    names = gguf.get_tensor_name_map(model_arch, n_layers)
    if arch_name == "qwen3moe" or config.get("num_local_experts"):  # each layer's experts stacked, one
        tensors = _stacked_experts(tensors)  # tensor per projection
    for hf_name in sorted(tensors):
        data = tensors[hf_name].astype(np.float32)
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"{hf_dir}: no GGUF name for tensor {hf_name}")
        if arch_name == "llama" and hf_name.endswith("q_proj.weight"):
            data = _permute_for_rope(data, n_head)
        elif arch_name == "llama" and hf_name.endswith("k_proj.weight"):
            data = _permute_for_rope(data, n_head_kv)
        elif arch_name in ("gemma2", "gemma3", "nemotron") and hf_name.endswith("norm.weight"):
            data = data + np.float32(1.0)
        elif arch_name == "lfm2" and hf_name.endswith("conv.conv.weight"):
            data = data.squeeze(1)  # [hidden, kernel], as llama.cpp writes it
        w.add_tensor(name, data)
    if arch_name == "llama" and rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_divisors(rope, head_dim))
    if arch_name == "phi3" and rope.get("long_factor"):
        original = int(rope["original_max_position_embeddings"])
        scale = int(config["max_position_embeddings"]) / original
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
        for key in ("long", "short"):
            w.add_tensor(f"rope_factors_{key}.weight", np.array(rope[f"{key}_factor"], dtype=np.float32))

    _add_tokenizer(w, hf_dir, arch)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


_EXPERT = re.compile(r"(?P<layer>.*\.(mlp|block_sparse_moe)\.experts)\.(?P<e>\d+)\.(?P<proj>\w+_proj|w[123])\.weight$")


def _stacked_experts(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A checkpoint's experts, saved one by one (experts.E.gate_proj.weight), as llama.cpp's
    converter stacks them: [experts, out, in] per layer and projection."""
    out: dict[str, np.ndarray] = {}
    found: dict[str, dict[int, np.ndarray]] = {}
    for name, data in tensors.items():
        m = _EXPERT.match(name)
        if m is None:
            out[name] = data
        else:
            found.setdefault(f"{m['layer']}.{m['proj']}.weight", {})[int(m["e"])] = data
    for name, experts in found.items():
        out[name] = np.stack([experts[e] for e in sorted(experts)])
    return out


def _token_type(token: str, added: dict[str, bool]) -> int:
    """A token's type as llama.cpp's converter writes it: an added token control where it is special
    or looks it (<|...|>, DeepSeek's <｜...｜>), else user-defined (`<think>`); any other normal."""
    if token not in added:
        return TOKEN_NORMAL
    looks = any(token.startswith(a) and token.endswith(b) for a, b in (("<|", "|>"), ("<｜", "｜>")))
    return TOKEN_CONTROL if added[token] or looks else TOKEN_USER_DEFINED


def _add_tokenizer(w: Any, hf_dir: Path, arch: str) -> None:
    from firmware.toolchain.build import read_chat_template

    doc = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = dict(doc["model"]["vocab"])
    added = {t["content"]: bool(t.get("special")) for t in doc.get("added_tokens", [])}
    for t in doc.get("added_tokens", []):
        vocab[t["content"]] = int(t["id"])
    tokens = [""] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    style = chat_style(arch)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([_token_type(t, added) for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab[style.bos])
    w.add_eos_token_id(vocab[style.eos])
    w.add_unk_token_id(vocab[style.specials[0]])
    w.add_pad_token_id(vocab[style.specials[0]])
    w.add_chat_template(read_chat_template(hf_dir))


def _fingerprint(arch: str) -> str:
    """What the file and its bundle are made from: the tiny folder (its name carries its own
    fingerprint), this writer, and gguf_to_hf's reading of it (gguf_families' whole module only for
    the families it reads, so that adding one rebuilds no other fixture)."""
    import hashlib
    import inspect

    from firmware.toolchain import build as build_module
    from firmware.toolchain import gguf_families
    from firmware.toolchain.tiny import tiny_hf_dir

    parts = [tiny_hf_dir(arch).name, Path(__file__).read_text()]
    parts += [inspect.getsource(getattr(build_module, f)) for f in
              ("gguf_to_hf", "_read_by_transformers", "_gguf_metadata", "_restore_gguf_config",
               "_keep_byte_level_tokenizer", "_gguf_experts", "_gemma4_config", "gguf_tokenizer",
               "_template_end_of_turn")]  # fmt: skip
    if GGUF_ARCHITECTURES[arch] in gguf_families.ARCHITECTURES:
        parts.append(inspect.getsource(gguf_families))
    else:  # the helpers the build's own readers take from it
        parts += [inspect.getsource(f) for f in (gguf_families.read_tensors, gguf_families.as_float32,
                                                    gguf_families.moe_weight)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8]


# llama.cpp's own converter, run on the fixture's folder as a user would, with three stand-ins for
# what a tiny fixture lacks: its BPE is in no table of known pre-tokenizers (llama.cpp hashes real
# vocabularies; "gpt-2" is the split it was trained with), it has no SentencePiece model to try
# first, and a Phi-3, a Gemma (1, 2 or 4), a Nemotron, a GLM-4, a GLM, an ERNIE 4.5, a Jamba, a
# MiniCPM and an InternLM3 are read as BPE (as llama.cpp does for Phi-4-mini, whose config names
# GPT2Tokenizer; its Gemma, Nemotron, ERNIE, Jamba, MiniCPM and InternLM3 converters know only
# SentencePiece, Llama's BPE or Gemma 4's own tokenizer, its GLM ones only GLM's own special tokens).
# And one for the transformers here, 5, where llama.cpp pins 4: a Nemotron-H's, a GPT-NeoX's, an
# EXAONE 3.5's and a MiniCPM's config are read as their config.json has them, as transformers 4 reads
# them (5 adds the keys of experts to a Nemotron-H, which make the converter write a nemotron_h_moe
# file, and lists its layers in words whose MLPs it misses; it reads a GPT-NeoX's rotary_pct into
# keys of its own, and the converter fails without it; it renames EXAONE's activation_function,
# which the converter asserts on; it reads MiniCPM's config, whose class it lacks, as a generic one,
# which fails on its LongRoPE, and its tokenizer not at all).
_CONVERT = """
import json
from pathlib import Path
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/gguf-py"]
import convert_hf_to_gguf
import transformers
import conversion.base as base
import conversion.gemma as gemma
import conversion.nemotron as nemotron
import conversion.glm as glm
import conversion.phi as phi
import conversion.ernie as ernie
import conversion.jamba as jamba
import conversion.gptneox as gptneox
import conversion.chatglm as chatglm
import conversion.internlm as internlm
import conversion.exaone as exaone
import conversion.minicpm as minicpm

def no_sentencepiece(self):
    raise FileNotFoundError("tokenizer.model")

base.TextModel._create_vocab_sentencepiece = no_sentencepiece
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
for model_class in (phi.Phi3MiniModel, gemma.GemmaModel, gemma.Gemma2Model, gemma.Gemma4Model,
                    nemotron.NemotronModel, glm.Glm4Model, chatglm.ChatGLMModel, ernie.Ernie4_5Model,
                    jamba.JambaModel, internlm.InternLM3Model, minicpm.MiniCPMModel):
    model_class.set_vocab = lambda self: self._set_vocab_gpt2()


def as_transformers_4(model_class):
    init = model_class.__init__

    def read_as_published(self, *args, **kwargs):
        if kwargs.get("hparams") is None:
            kwargs["hparams"] = json.loads((Path(args[0]) / "config.json").read_text())
        init(self, *args, **kwargs)

    model_class.__init__ = read_as_published


as_transformers_4(nemotron.NemotronHModel)
as_transformers_4(gptneox.GPTNeoXModel)
as_transformers_4(exaone.ExaoneModel)
as_transformers_4(minicpm.MiniCPMModel)
auto_tokenizer = transformers.AutoTokenizer.from_pretrained


def tokenizer_of_a_model_type_without_a_class(path, *args, **kwargs):
    try:
        return auto_tokenizer(path, *args, **kwargs)
    except (ValueError, AttributeError):  # (5 reads MiniCPM's config as a generic one, which fails)
        return transformers.PreTrainedTokenizerFast.from_pretrained(path, *args, **kwargs)


transformers.AutoTokenizer.from_pretrained = tokenizer_of_a_model_type_without_a_class
for folder, out, options in json.loads(sys.argv[2]):  # one process for many: its start is most of the time
    sys.argv = ["convert_hf_to_gguf.py", *options, "--outtype", "f32", "--outfile", out, folder]
    convert_hf_to_gguf.main()
"""


def llama_cpp_source() -> Path:
    """llama.cpp's source, as bench/llama_server.sh fetches it (from the llama-cpp-python sdist on
    PyPI) and caches it; fetched here the first time."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "bench" / "llama_server.sh"
    done = subprocess.run(["bash", str(script), "--source-only"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp's source could not be fetched: {done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def llama_cpp_convert(hf_dir: Path, out: Path, *options: str) -> None:
    """`hf_dir` written as an F32 GGUF file by llama.cpp's convert_hf_to_gguf.py, as a user would
    run it, with its `options`."""
    llama_cpp_convert_many([(hf_dir, out, options)])


def llama_cpp_convert_many(jobs: Sequence[tuple[Path, Path, Sequence[str]]]) -> None:
    """Each (folder, file, options) of `jobs` converted as llama_cpp_convert does, in one process."""
    import subprocess
    import sys

    listed = json.dumps([[str(folder), str(out), list(options)] for folder, out, options in jobs])
    run = subprocess.run([sys.executable, "-c", _CONVERT, str(llama_cpp_source()), listed], capture_output=True,
                         text=True)  # fmt: skip
    if run.returncode != 0:
        raise RuntimeError(f"llama.cpp's converter failed on {[str(j[0]) for j in jobs]}: {run.stderr[-2000:]}")


def tiny_gguf(arch: str = "llama") -> Path:
    """The GGUF file of the tiny fixture `arch`, written once and cached."""
    import os

    from firmware.toolchain.paths import cache_dir
    from firmware.toolchain.tiny import tiny_hf_dir

    d = cache_dir() / "tiny-gguf"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"tiny-{arch}-{_fingerprint(arch)}.gguf"
    if not path.is_file():
        tmp = d / f".{path.name}.{os.getpid()}.tmp"
        if arch in CONVERTED:
            llama_cpp_convert(tiny_hf_dir(arch), tmp, *CONVERT_OPTIONS.get(arch, ()))
        else:
            write_tiny_gguf(tiny_hf_dir(arch), tmp, arch)
        tmp.rename(path)
    return path


def tiny_gguf_bundle(arch: str = "llama") -> Path:
    """The tiny fixture `arch` built from its GGUF file, as `zerolayer firmware build --from
    X.gguf` builds it (fp32, CPU): the counterpart of tiny.tiny_bundle, built from the folder."""
    from firmware.manifest import LayerConstants
    from firmware.toolchain.build import BuildOptions, build
    from firmware.toolchain.devkit import ensure_bundle

    name = f"tiny-gguf-{arch}"

    def make(out: Path) -> None:
        build(tiny_gguf(arch), out, BuildOptions(
            precision="fp32", target="cpu", name=name, version="0.1.0",
            layer=LayerConstants(max_tokens_per_shard=64),
        ))  # fmt: skip

    return ensure_bundle(f"{name}-{_fingerprint(arch)}", make)
