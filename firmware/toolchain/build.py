"""Build a bundle: convert a source model to an ONNX Runtime GenAI folder, pack it, sign it.

Sources: a GGUF file (what llama.cpp and Ollama users have), a Hugging Face model folder, or an
ONNX Runtime GenAI model folder (packed as it is). Conversion goes through onnxruntime-genai's
model builder, run as a subprocess so its memory is returned when it ends.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from firmware.bundle import CUDA_GRAPH_DIR
from firmware.errors import BundleError
from firmware.manifest import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    LayerConstants,
    Licence,
    Manifest,
    describe_files,
)
from firmware.signing import load_private_key, sign_manifest
from firmware.toolchain import (
    bailing,
    gguf_families,
    gguf_pretokenizers,
    gpt_families,
    minicpm,
    prequantized,
    qwen3_next,
)
from firmware.toolchain.expert_routing import GROUPED_CHOICE_FAMILIES

PRECISIONS = ("fp32", "fp16", "int8", "int4")
QUANTIZED = ("int8", "int4")
BLOCK_SIZES = (16, 32, 64, 128, 256)
DEFAULT_BLOCK_SIZE = 32
TARGETS = ("cpu", "cuda")

Progress = Callable[[str], None]


def _stderr_progress(message: str) -> None:
    print(f"zerolayer: {message}", file=sys.stderr, flush=True)


class _Step:
    """Numbered, timed steps so a long build shows where it is. On a terminal the running step's
    line also shows a spinner and the seconds so far (a step such as the model export says
    nothing for a minute); elsewhere (a log, CI) plain lines only. summary() ends the run with
    the total and each step's time."""

    SPINNER = "|/-\\"

    def __init__(self, total: int, progress: Progress, terminal: TextIO | None = None) -> None:
        self.total, self.n, self.progress = total, 0, progress
        self.began = time.monotonic()
        self.times: list[tuple[str, float]] = []
        self._what = ""
        if terminal is None and progress is _stderr_progress and sys.stderr.isatty():
            terminal = sys.stderr
        self._terminal = terminal
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    def __call__(self, what: str) -> float:
        self.n += 1
        self._what = what
        started = time.monotonic()
        self.progress(f"[{self.n}/{self.total}] {what}")
        if self._terminal is not None:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick, args=(started,), daemon=True)
            self._ticker.start()
        return started

    def _tick(self, started: float) -> None:
        assert self._terminal is not None
        spins = 0
        while not self._stop.wait(0.25):
            spins += 1
            bar = self.SPINNER[spins % len(self.SPINNER)]
            self._terminal.write(f"\r      {bar} {time.monotonic() - started:5.0f} s")
            self._terminal.flush()

    def done(self, started: float) -> None:
        seconds = time.monotonic() - started
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
            self._ticker = None
            assert self._terminal is not None
            self._terminal.write("\r\033[K")  # the spinner's line gives way to the result
        self.times.append((self._what.split(" ")[0], seconds))
        self.progress(f"      done in {seconds:.1f} s")

    def summary(self, what: str, files: list[Path]) -> str:
        """`what`: its files' total size, the time taken, and each step's share."""
        size = sum(f.stat().st_size for f in files if f.is_file())
        steps = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.times)
        return (f"{what}: {len(files)} files, {_human(size)}, in {time.monotonic() - self.began:.1f} s "
                f"({steps})")  # fmt: skip


def _human(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class BuildOptions:
    precision: str = "int8"
    target: str = "cpu"
    layer: LayerConstants = field(default_factory=LayerConstants)
    name: str | None = None
    version: str = "1.0.0"
    # The chat template to ship instead of the source's own (a base model's GGUF carries none).
    chat_template: str | None = None
    # Tokens that also end generation, besides those the export names (a template's end of turn).
    eos_tokens: tuple[str, ...] = ()
    # The terms the model is used under (kept in the signed manifest) and files holding their text,
    # packed under licence/.
    licence: Licence | None = None
    licence_files: tuple[Path, ...] = ()
    # Also export an fp16 CUDA graph of the same weights into cuda/: the GPU runs it, the CPU the
    # root graph (CUDA's attention takes fp16/bf16 only, so a CPU graph on a GPU would run it on
    # the CPU provider with the KV cache copied across every step).
    cuda_graph: bool = False
    # Weights per quantization block (int8/int4): each block has its own scale and zero point. The
    # builder's 32 is the most faithful; larger blocks give the int8 kernel fewer scales to apply.
    block_size: int = DEFAULT_BLOCK_SIZE

    def validate(self) -> None:
        if self.precision not in PRECISIONS:
            raise BundleError(f"--precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if self.target not in TARGETS:
            raise BundleError(f"--target {self.target!r}: choose one of {', '.join(TARGETS)}")
        if self.precision == "fp16" and self.target == "cpu":
            raise BundleError("--precision fp16 needs --target cuda (the model builder has no fp16 CPU export)")
        if self.cuda_graph and self.target == "cuda":
            raise BundleError("--cuda-graph adds a CUDA graph beside a --target cpu one; this build is already cuda")
        if self.block_size not in BLOCK_SIZES:
            raise BundleError(f"--block-size {self.block_size}: choose one of {', '.join(map(str, BLOCK_SIZES))}")
        if self.block_size != DEFAULT_BLOCK_SIZE and self.precision not in QUANTIZED:
            raise BundleError(f"--block-size applies to {' and '.join(QUANTIZED)} weights, not {self.precision}")
        self.layer.validate(where="--layer")


def source_kind(source: Path) -> str:
    if source.is_file() and source.suffix == ".gguf":
        return "gguf"
    if source.is_dir() and (source / "genai_config.json").is_file():
        return "genai"
    if source.is_dir() and (source / "config.json").is_file():
        return "hf"
    raise BundleError(
        f"{source}: not a model source: give a .gguf file, a Hugging Face folder (config.json) "
        "or an ONNX Runtime GenAI folder (genai_config.json)"
    )


def gguf_to_hf(gguf: Path, out_dir: Path) -> None:
    """Dequantize a GGUF checkpoint into a plain float32 Hugging Face folder.

    transformers loads a GGUF but refuses save_pretrained on it, so the weights are moved into a
    fresh model of the same config with the quantization config dropped. What its loader
    leaves out of the config, though the file states it, is put back first (_restore_gguf_config),
    and a byte-level tokenizer is kept byte-level (_keep_byte_level_tokenizer). gpt-oss's files,
    and Gemma 3n's, which that loader does not read, are read by gguf_families.
    """
    import torch
    from transformers import AutoModelForCausalLM

    metadata = _gguf_metadata(gguf)
    gguf_tokenizer(gguf, metadata).save_pretrained(out_dir)
    _keep_byte_level_tokenizer(out_dir, metadata)
    if metadata.get("general.architecture") in gguf_families.ARCHITECTURES:  # transformers' loader reads none of it
        config = gguf_families.config(metadata)
        state = gguf_families.state(gguf, config, metadata)
        by_design = {"lm_head.weight"} if config.tie_word_embeddings else set()
    else:
        config, state, by_design = _read_by_transformers(gguf, metadata)
    # The fresh model is made without weights (on the meta device) and takes the loaded tensors as
    # they are: no second copy of the model, nor a random initialization of one, which a 1B model's
    # build paid in gigabytes and minutes.
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if m not in by_design]
    if missing or unexpected:
        raise BundleError(f"{gguf}: weights do not fit the config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    plain.tie_weights()  # a tied LM head: the embeddings, not a weight left on the meta device
    ends = list(config.eos_token_id) if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    # A file names one end of generation (Gemma's <eos>, GLM-4's <|endoftext|>); the Hugging Face
    # folder's generation_config.json lists the others, which a GGUF file states, if at all, as its
    # end of turn and of message (GLM-4's <|user|> and <|observation|>: llama.cpp stops at both), or
    # its template ends a turn with (Gemma 3's <end_of_turn>): without them, the model writes the
    # next turns itself.
    stated = [metadata.get(f"tokenizer.ggml.{kind}_token_id") for kind in ("eot", "eom")]
    wanted = list(dict.fromkeys(e for e in (*ends, *stated, _template_end_of_turn(out_dir)) if e is not None))
    if wanted and wanted != ends:
        plain.config.eos_token_id = wanted[0] if len(wanted) == 1 else wanted
    plain.save_pretrained(out_dir)


def _read_by_transformers(gguf: Path, metadata: dict[str, Any]) -> tuple[Any, dict[str, Any], set[str]]:
    """(config, state dict, weights absent by design) of a GGUF file transformers' loader reads, with
    what it leaves out put back."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder, name = str(gguf.parent), gguf.name
    with _gguf_reading(metadata):
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        restored = _restore_gguf_config(config, metadata)
        # The weights are read under the file's own model type (a windowed "llama" file becomes a
        # Mistral only after: transformers maps no GGUF names for Mistral).
        as_read = restored if restored.model_type == config.model_type else config
        read: Any = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=as_read, dtype=torch.float32,
                                                         output_loading_info=True)  # fmt: skip
    loaded, info = read
    config = restored
    state = loaded.state_dict()
    experts = _gguf_experts(gguf, config) if config.model_type == "mixtral" else {}
    if experts:  # the loader read a Llama (no MLP): the experts are read from the file here
        state = {k: v for k, v in state.items() if ".mlp." not in k} | experts
    # Gemma 4's layer scales, which the loader maps to no weight.
    scales = {f"model.layers.{i}.layer_scalar": torch.tensor(metadata[f"tensor.blk.{i}.layer_output_scale.weight"])
              for i in range(config.num_hidden_layers) if f"tensor.blk.{i}.layer_output_scale.weight" in metadata}
    state |= scales
    # A file with an output tensor of its own (a Falcon's) is untied, whatever the loader's config
    # says (FalconConfig ties by default): tied, the LM head would become the embeddings.
    head, table = loaded.get_output_embeddings(), loaded.get_input_embeddings()
    if config.tie_word_embeddings and head is not None and not torch.equal(head.weight, table.weight):
        config.tie_word_embeddings = False
    # A tied lm_head is absent from a state dict by design; anything else missing is a broken source.
    by_design = {"lm_head.weight"} if config.tie_word_embeddings else set()
    # The loader fills a weight the file lacks with random values, and says so only here.
    unread = [k for k in info.get("missing_keys", ()) if k not in by_design and k not in scales
              and not (experts and ".mlp." in k)]  # fmt: skip
    if unread:
        raise BundleError(f"{gguf}: the file has no tensors for {', '.join(sorted(unread)[:3])}"
                          f"{f' and {len(unread) - 3} more' if len(unread) > 3 else ''} (a tensor layout this "
                          "build does not read)")  # fmt: skip
    return config, state, by_design


def _template_end_of_turn(hf_dir: Path) -> int | None:
    """The special token the folder's chat template ends an assistant turn with, or None. Harmony's
    (gpt-oss's) messages end with one that does not end generation, so none is given for it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    template = tokenizer.chat_template
    if not isinstance(template, str) or "<|channel|>" in template:
        return None
    probe = "zerolayer probe answer"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"},
                                              {"role": "assistant", "content": probe}], tokenize=False)  # fmt: skip
    except Exception:  # a template that refuses the probe says nothing of its turns
        return None
    after = str(text).partition(probe)[2].lstrip()
    specials = sorted({t.content for t in tokenizer.added_tokens_decoder.values() if t.special}, key=len, reverse=True)
    found = next((t for t in specials if after.startswith(t)), None)
    ids: Any = None if found is None else tokenizer.convert_tokens_to_ids(found)
    return ids if isinstance(ids, int) else None


def _gguf_experts(gguf: Path, config: Any) -> dict[str, Any]:
    """Mixtral's router and experts from a file llama.cpp wrote as a "llama" one (transformers' loader
    reads none of them), dequantized, in transformers' names."""
    found = gguf_families.read_tensors(
        gguf, lambda name: name.startswith("blk.") and name.endswith(("ffn_gate_inp.weight", "_exps.weight")))

    def take(name: str) -> Any:
        if name not in found:
            raise BundleError(f"{gguf}: a file with experts has no {name}")
        return found[name]

    names = [f"model.layers.{i}.mlp.{part}" for i in range(int(config.num_hidden_layers))
             for part in ("gate.weight", "experts.gate_up_proj", "experts.down_proj")]  # fmt: skip
    return {name: gguf_families.moe_weight(take, name) for name in names}


# The GGUF architectures (llama.cpp's names) the build is checked on, each written as llama.cpp writes
# it (tiny_gguf.GGUF_ARCHITECTURES): others may load through transformers' loader, or may not.
GGUF_CHECKED = ("llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3", "nemotron", "lfm2", "qwen35",
                "qwen35moe", "gemma4", "gpt2", "falcon", "bloom", "gpt-oss", "gemma3n", "mistral3",
                "granite", "smollm3", "granitemoe", "olmo2", "exaone4", "stablelm", "command-r", "cohere2", "glm4",
                "seed_oss", "arcee", "hunyuan-dense", "olmoe", "ernie4_5", "lfm2moe",
                "granitehybrid", "nemotron_h", "falcon-h1", "jamba",
                "phi2", "starcoder", "olmo", "jais2",
                "apertus", "gptneox", "chatglm", "qwen2moe", "gemma", "nemotron_h_moe", "exaone", "glm4moe",
                "deepseek2", "ernie4_5-moe", "qwen3vl", "qwen3vlmoe", "dots1", "mpt", "qwen2vl", "bailingmoe2",
                "afmoe", "minicpm")


def _gguf_hint(gguf: Path) -> str:
    """What to tell the user of a GGUF file that could not be read."""
    try:
        from gguf import GGUFReader

        field = GGUFReader(str(gguf)).fields.get("general.architecture")
        arch = str(field.contents()) if field is not None else None
    except Exception:  # not a GGUF file at all, or a truncated one
        return "is it a whole GGUF file?"
    checked = ", ".join(GGUF_CHECKED)
    if arch is None or arch in GGUF_CHECKED:
        return f"is it a whole GGUF file? (the build reads GGUF files of {checked})"
    return (f"its architecture, {arch!r}, is not one the build reads from GGUF ({checked}); build the model from "
            "its Hugging Face folder instead")


def _gguf_metadata(gguf: Path) -> dict[str, Any]:
    """The file's key-value metadata (the token lists left out), its tensors' shapes (`shapes`,
    outermost first, as torch lists them) and its small tensors that transformers' loader maps to no
    weight: LongRoPE's factors, llama.cpp's RoPE frequency tables and Gemma 4's layer scales."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    meta: dict[str, Any] = {
        key: field.contents() for key, field in reader.fields.items()
        if key not in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                       "tokenizer.ggml.scores")
    }  # fmt: skip
    meta["shapes"] = {t.name: [int(d) for d in reversed(t.shape)] for t in reader.tensors}
    for tensor in reader.tensors:
        if tensor.name.startswith(("rope_factors_", "rope_freqs")) or ".layer_output_scale." in tensor.name:
            meta[f"tensor.{tensor.name}"] = [float(x) for x in tensor.data.reshape(-1)]
    return meta


@contextlib.contextmanager
def _gguf_config_read_as(arch: str, config: Any) -> Iterator[None]:
    """transformers reads a GGUF file's config again wherever it is given the file (its tokenizer's
    loader too, which takes no config), from its own table of the architectures it rebuilds a
    config for; meanwhile, `config` is that table's entry for `arch`."""
    from transformers.integrations.gguf import gguf_config_mapping

    table = gguf_config_mapping.GGUF_CONFIG_ARCHS
    before = table.get(arch)
    table[arch] = lambda metadata, tensor_names: config.to_dict()
    try:
        yield
    finally:
        if before is None:
            table.pop(arch, None)
        else:
            table[arch] = before


def _gguf_reading(metadata: dict[str, Any]) -> contextlib.AbstractContextManager[Any]:
    """Where transformers reads the file's config itself (its tokenizer's loader does, given no
    config), the config the build reads from it (Gemma 4's, which transformers cannot)."""
    if metadata.get("general.architecture") == "gemma4":
        return _gguf_config_read_as("gemma4", _gemma4_config(metadata))
    if metadata.get("general.architecture") in gguf_families.ARCHITECTURES:
        return _gguf_config_read_as(metadata["general.architecture"], gguf_families.config(metadata))
    return contextlib.nullcontext()


def gguf_tokenizer(gguf: Path, metadata: dict[str, Any] | None = None) -> Any:
    """The GGUF file's tokenizer, as transformers reads it for the build (`metadata`: the file's, if
    already read), splitting text as llama.cpp does where transformers does not know how."""
    from transformers import AutoTokenizer

    meta = metadata if metadata is not None else _gguf_metadata(gguf)
    with _gguf_reading(meta):
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if meta.get("tokenizer.ggml.model") == "gpt2":
        _added_tokens_whole(tokenizer, gguf)
    return gguf_pretokenizers.split_as_llama_cpp(tokenizer, meta)


def _added_tokens_whole(tokenizer: Any, gguf: Path) -> None:
    """transformers spells every token of a byte-level vocabulary in the byte alphabet, but
    llama.cpp writes the added ones (control and user-defined) as their text, and those whose text
    is not in that alphabet transformers leaves out of its added tokens as a mislabel: DeepSeek's
    <｜begin▁of▁sentence｜>, <｜User｜> and tool tokens (R1's distills', V3's), which were then cut into
    bytes, and the beginning and end of a sequence given new ids past the vocabulary. Each keeps
    its own id here, whole, special where the file marks it control, as llama.cpp reads them."""
    from gguf import GGUFReader
    from tokenizers import Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    reader = GGUFReader(str(gguf))
    texts, kinds = reader.fields["tokenizer.ggml.tokens"], reader.fields.get("tokenizer.ggml.token_type")
    if kinds is None:  # (no types: no token is an added one)
        return
    tokens = [bytes(texts.parts[i]).decode("utf-8", "replace") for i in texts.data]
    types = [int(kinds.parts[i][0]) for i in kinds.data]
    alphabet = set(bytes_to_unicode().values())
    whole = {i: (text, kind == 3) for i, (text, kind) in enumerate(zip(tokens, types, strict=True))
             if kind in (3, 4) and not set(text) <= alphabet}  # 3: control, 4: user-defined
    if not whole:
        return
    doc = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = doc["model"]["vocab"]
    merged = {"".join(m.split(" ") if isinstance(m, str) else m) for m in doc["model"]["merges"]}
    for spelled in [s for s, i in vocab.items() if i in whole and s not in merged]:
        del vocab[spelled]  # (its spelling in bytes, which no merge makes)
    vocab.update({text: i for i, (text, _) in whole.items()})
    doc["added_tokens"] = [t for t in doc["added_tokens"] if t["id"] < len(tokens) and t["id"] not in whole] + [
        {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": special} for i, (text, special) in whole.items()]  # fmt: skip
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(doc))


def _gemma4_config(meta: dict[str, Any]) -> Any:
    """Gemma 4's config, from what llama.cpp writes of it. transformers' loader reads none: it takes
    the per-layer lists of key-value heads and MLP widths llama.cpp writes for single numbers, and
    maps none of the layer pattern, the global layers' head width, their partial rotation (a
    frequency table whose unrotated pairs turn at 1e30), the layers that share earlier layers' keys
    and values, or the per-layer inputs."""
    from transformers import Gemma4TextConfig

    def key(name: str) -> Any:
        return meta.get(f"gemma4.{name}")

    if key("expert_count"):
        raise BundleError("a Gemma 4 GGUF file with experts (26B A4B) is not one the build reads; build it from its "
                          "Hugging Face folder instead")  # fmt: skip
    shapes, n = meta["shapes"], int(key("block_count"))

    def per_layer(value: Any) -> list[int]:
        return [int(v) for v in value] if isinstance(value, list) else [int(value)] * n

    types = ["sliding_attention" if s else "full_attention" for s in key("attention.sliding_window_pattern")]
    kv, widths = per_layer(key("attention.head_count_kv")), per_layer(key("feed_forward_length"))
    head_swa, head_full = int(key("attention.key_length_swa")), int(key("attention.key_length"))
    shared = int(key("attention.shared_kv_layers") or 0)
    swa_kv = kv[types.index("sliding_attention")] if "sliding_attention" in types else kv[0]
    per_layer_config = {str(i): {"head_dim": head_full, **({"num_key_value_heads": kv[i]} if kv[i] != swa_kv else {})}
                        for i, t in enumerate(types) if t == "full_attention"}  # fmt: skip
    freqs = meta.get("tensor.rope_freqs.weight") or [1.0] * (head_full // 2)
    rope_swa = {"rope_type": "default", "rope_theta": float(key("rope.freq_base_swa") or 10000.0)}
    if int(key("rope.dimension_count_swa") or head_swa) != head_swa:
        rope_swa["partial_rotary_factor"] = int(key("rope.dimension_count_swa")) / head_swa
    per_input = int(key("embedding_length_per_layer_input") or 0)
    doc: dict[str, Any] = dict(  # (per_layer_config is a keyword the config class takes but does not declare)
        architectures=["Gemma4ForCausalLM"], vocab_size=shapes["token_embd.weight"][0],
        hidden_size=int(key("embedding_length")), intermediate_size=widths[0], num_hidden_layers=n,
        num_attention_heads=int(key("attention.head_count")), num_key_value_heads=swa_kv, head_dim=head_swa,
        per_layer_config=per_layer_config, layer_types=types, sliding_window=int(key("attention.sliding_window")),
        max_position_embeddings=int(key("context_length")),
        rms_norm_eps=gguf_families.as_float32(key("attention.layer_norm_rms_epsilon")),
        final_logit_softcapping=key("final_logit_softcapping"), tie_word_embeddings="output.weight" not in shapes,
        rope_parameters={"sliding_attention": rope_swa, "full_attention": {
            "rope_type": "proportional", "rope_theta": float(key("rope.freq_base")),
            "partial_rotary_factor": 2 * sum(1 for f in freqs if f == 1.0) / head_full}},
        # A global layer without values of its own uses its keys (the last `shared` layers have neither).
        attention_k_eq_v=any(t == "full_attention" and f"blk.{i}.attn_v.weight" not in shapes
                             for i, t in enumerate(types[: n - shared])),
        num_kv_shared_layers=shared, use_double_wide_mlp=any(w != widths[0] for w in widths),
        hidden_size_per_layer_input=per_input,
        vocab_size_per_layer_input=shapes["per_layer_token_embd.weight"][0] if per_input else 262_144,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"), eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )  # fmt: skip
    return Gemma4TextConfig(**doc)


# The layer count of the Gemma models whose queries llama.cpp scales by the width over the heads
# (Gemma 2 27B and Gemma 3 27B), not by the head width.
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def _restore_gguf_config(config: Any, meta: dict[str, Any]) -> Any:
    """Put back what the GGUF states and transformers' loader (5.x) leaves out of the config, each of
    which changes the model's output (tests/engine/test_gguf_architectures.py checks each):

    - Qwen3's head width (attention.key_length): left at Qwen3Config's default of 128, so a model
      whose heads are another width does not load.
    - Qwen3 MoE's expert width (expert_feed_forward_length): left at the default of 768, so no
      other model loads; and the chosen experts' weights, which llama.cpp always scales to sum to
      1 (norm_topk_prob, False by default: every token's experts were mixed otherwise).
    - Phi-3's rotated width (rope.dimension_count): partial rotary, as Phi-4-mini's, came back full.
    - Phi-3's LongRoPE (Phi-3.5-mini, Phi-3-128k): the factors (tensors rope_factors_long/short)
      and the original context (rope.scaling.original_context_length) were dropped, leaving plain RoPE.
    - Phi-3's sliding window (attention.sliding_window; 0 means none), as Phi-3-mini's 2047.
    - Llama 3.1's RoPE scaling (Llama 3.1, 3.2, 3.3): llama.cpp keeps only each frequency's
      divisor (tensor rope_freqs), which the loader drops; see gguf_families.llama3_rope.
    - Linear and YaRN RoPE scaling (rope.scaling.*, as llama.cpp's converter writes any config's:
      DeepSeek Coder's linear factor 4, a Qwen2.5 or Llama file given YaRN for long contexts): the
      loader reads none, which moved every position's rotation.
    - A sliding window on a "llama" file (attention.sliding_window; llama.cpp writes Mistral as
      llama and writes no window, so only a file that states one): the model becomes a Mistral.
    - Experts in a "llama" file (expert_count, expert_used_count: Mixtral, which llama.cpp writes
      as a Llama): the model becomes a Mixtral (its router and experts read by _gguf_experts; the
      loader read a Llama, whose MLP the file does not have).
    - Gemma 3's layer pattern: attention.sliding_window_pattern where the file has it (one flag
      per layer, or N: every Nth layer global), else llama.cpp's fixed five sliding to one global.
    - Gemma 2's and Gemma 3's query scale: the file has none; llama.cpp scales by 1/sqrt(head
      width), or 1/sqrt(width / heads) for the 27B models (46 and 62 layers), and so is
      query_pre_attn_scalar set here (transformers' default of 256 holds only where the head
      width is 256).
    - Gemma 3's sliding layers' RoPE base (rope.freq_base_swa): left at the config's default of
      10000, which Gemma 3's checkpoints use.
    - Gemma 3's linear RoPE scaling of the global layers (rope.scaling.type and factor, as
      Gemma 3 4B, 12B and 27B have): dropped, leaving their positions unscaled.
    - Qwen3.5's layer pattern (attention.recurrent_layers: which layers are linear attention): made
      from `full_attention_interval` instead, which the published models follow (every fourth layer
      full) and a file need not (its tensors were then not found).
    - Falcon's grouped attention (40B, 180B): refused, not restored (see the message).
    - GPT-2's position table (context_length): the loader puts it in `n_ctx`, which GPT2Config does
      not read for the table's rows (`n_positions`): a file of other than 1024 rows did not load.
      (Its MLP's width is GPT-2's four times the hidden size, as llama.cpp writes it whatever the
      model's: a file of another does not load, and says so.)
    """
    from transformers import AutoConfig

    arch = str(meta.get("general.architecture", ""))

    def key(name: str) -> Any:
        return meta.get(f"{arch}.{name}")

    doc = config.to_dict()
    rope = dict(doc.get("rope_parameters") or {})
    changed = False
    if arch == "qwen3" and key("attention.key_length"):
        doc["head_dim"], changed = int(key("attention.key_length")), True
    if arch == "qwen3moe":  # llama.cpp's qwen3moe always scales the chosen experts' weights to sum to 1
        doc["norm_topk_prob"], changed = True, True
        if key("expert_feed_forward_length"):
            doc["moe_intermediate_size"] = int(key("expert_feed_forward_length"))
    if arch == "phi3":
        head_dim = doc["hidden_size"] // doc["num_attention_heads"]
        rope_dims = key("rope.dimension_count")
        if rope_dims and rope_dims != head_dim:
            rope["partial_rotary_factor"] = rope_dims / head_dim
        long, short = meta.get("tensor.rope_factors_long.weight"), meta.get("tensor.rope_factors_short.weight")
        original = key("rope.scaling.original_context_length")
        if long and short and original:
            rope.update(rope_type="longrope", long_factor=long, short_factor=short,
                        original_max_position_embeddings=int(original))  # fmt: skip
            doc["original_max_position_embeddings"] = int(original)
        if key("attention.sliding_window"):
            doc["sliding_window"] = int(key("attention.sliding_window"))
        doc["rope_parameters"], changed = rope, True
    if arch != "gemma3" and (meta.get("tensor.rope_freqs.weight") or key("rope.scaling.type") in ("linear", "yarn")):
        rope.update(gguf_families.rope_parameters(meta, arch))  # (a partial rotation the loader read is kept)
        doc["rope_parameters"], changed = rope, True
    if arch == "llama" and key("attention.sliding_window"):
        doc["model_type"], doc["sliding_window"], changed = "mistral", int(key("attention.sliding_window")), True
        doc["architectures"] = ["MistralForCausalLM"]
    if arch == "llama" and key("expert_count"):  # Mixtral, which llama.cpp writes as a Llama with experts
        doc.update(model_type="mixtral", architectures=["MixtralForCausalLM"],
                   num_local_experts=int(key("expert_count")), num_experts_per_tok=int(key("expert_used_count")))
        changed = True
    if arch in GEMMA_27B_LAYERS:  # the query scale, as llama.cpp applies it
        head_dim = int(doc.get("head_dim") or doc["hidden_size"] // doc["num_attention_heads"])
        big = int(doc["num_hidden_layers"]) == GEMMA_27B_LAYERS[arch]
        doc["query_pre_attn_scalar"] = doc["hidden_size"] // doc["num_attention_heads"] if big else head_dim
        changed = True
    if arch == "gemma3":
        n, pattern = int(doc["num_hidden_layers"]), key("attention.sliding_window_pattern")
        if isinstance(pattern, list):
            sliding = [bool(p) for p in pattern]
        else:
            every = int(pattern or 6)
            sliding = [(i + 1) % every != 0 for i in range(n)]
        doc["layer_types"] = ["sliding_attention" if s else "full_attention" for s in sliding]
        if key("rope.freq_base_swa"):
            local = dict(rope.get("sliding_attention") or {"rope_type": "default"})
            local["rope_theta"] = float(key("rope.freq_base_swa"))
            rope["sliding_attention"], doc["rope_parameters"] = local, rope
        if key("rope.scaling.type") == "linear" and key("rope.scaling.factor"):
            full = dict(rope.get("full_attention") or {})
            full.update(rope_type="linear", factor=float(key("rope.scaling.factor")))
            rope["full_attention"], doc["rope_parameters"] = full, rope
        changed = True
    if arch == "gpt2":
        doc["n_positions"], changed = int(key("context_length")), True
    if arch == "falcon" and int(key("attention.head_count_kv") or 1) > 1:
        raise BundleError("a Falcon GGUF file of key-value groups (Falcon 40B's and 180B's architecture) is not "
                          "read: llama.cpp reorders their fused projections, which transformers' loader does not "
                          "undo; build the model from its Hugging Face folder")  # fmt: skip
    if arch in ("qwen35", "qwen35moe") and isinstance(key("attention.recurrent_layers"), list):
        doc["layer_types"] = ["linear_attention" if r else "full_attention" for r in key("attention.recurrent_layers")]
        changed = True
    if not changed:
        return config
    model_type = doc.pop("model_type")
    for k in ("transformers_version", "_name_or_path"):
        doc.pop(k, None)
    return AutoConfig.for_model(model_type, **doc)


def _keep_byte_level_tokenizer(out_dir: Path, meta: dict[str, Any]) -> None:
    """transformers builds a byte-level BPE tokenizer (tokenizer.ggml.model "gpt2") from the file's
    vocabulary, merges and pre-tokenizer (tokenizer.ggml.pre) rightly, but saves it under the class
    it picks by architecture (GemmaTokenizer, LlamaTokenizer, Qwen2Tokenizer), and reloading the
    folder through that class (as the model builder does) rebuilds the class's own pipeline over
    the vocabulary: Gemma's maps every newline to the unknown token, Qwen2's splits text by its
    own rule whatever the file says. The saved tokenizer.json is the file's tokenizer, so the
    folder names the generic class that keeps it as it is, and drops special tokens the class
    invented that are not in the vocabulary (GemmaTokenizer's <mask>)."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        return
    cfg_file = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    vocab = json.loads((out_dir / "tokenizer.json").read_text())
    known = set(vocab["model"]["vocab"]) | {t["content"] for t in vocab.get("added_tokens", [])}
    cfg["tokenizer_class"] = "TokenizersBackend"
    for k in [k for k, v in cfg.items() if k.endswith("_token") and isinstance(v, str) and v not in known]:
        del cfg[k]
    cfg_file.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def run_model_builder(hf_dir: Path, out_dir: Path, precision: str, target: str, cache_dir: Path,
                      block_size: int = DEFAULT_BLOCK_SIZE) -> None:  # fmt: skip
    cmd = [
        sys.executable, "-m", "firmware.toolchain.builder_shim",
        "-i", str(hf_dir), "-o", str(out_dir), "-p", precision, "-e", target, "-c", str(cache_dir),
    ]  # fmt: skip
    # The engine binds one KV buffer of the whole capacity per layer (appliance/engine/session.py),
    # so sliding-window layers keep full-length caches too; the attention operator masks what
    # lies outside the window (local_window_size). The builder's default, window-sized caches for
    # those layers, would need buffers of another shape that the operator evicts from itself.
    extra = ["windowed_kv_cache=false"]
    if precision in QUANTIZED:
        extra.append(f"block_size={block_size}")
        # Asymmetric (zero-point) weight quantization: on SmolLM2-135M the builder's symmetric
        # default flips greedy answers ("Paris" becomes French nonsense); asymmetric keeps them.
        extra.append("is_symmetric=false")
    if precision == "int4":
        # A model that ties its embedding to its LM head gets them shared through an int4
        # GatherBlockQuantized, whose asymmetric export ONNX Runtime refuses to load (a uint8 output
        # where float is expected): the embedding stays a plain Gather of its own.
        extra.append("shared_embeddings=false")
    cmd += ["--extra_options", *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                       os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if result.returncode != 0 and "model is not currently supported" in result.stdout:
        raise BundleError(f"{architecture(hf_dir) or hf_dir.name}: the ONNX Runtime GenAI model builder cannot export "
                          f"this architecture (checked here: {', '.join(checked_architectures())})")  # fmt: skip
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-20:])
        raise BundleError(f"the ONNX Runtime GenAI model builder failed (exit {result.returncode}):\n{tail}")


def read_chat_template(model_dir: Path) -> str:
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    named = _named_templates(model_dir)
    if named.get("default"):
        return named["default"]
    processor = model_dir / "chat_template.json"  # an image-and-text model's processor's
    if processor.is_file():
        template = json.loads(processor.read_text()).get("chat_template")
        if isinstance(template, str) and template:
            return template
    raise BundleError(f"{model_dir}: no chat template (chat_template.jinja, tokenizer_config.json or "
                      "chat_template.json); give one with "
                      "--chat-template FILE (a base model's folder or GGUF file carries none)")  # fmt: skip


def read_tool_use_template(model_dir: Path) -> str | None:
    """The folder's template named "tool_use", which transformers renders a conversation with tools
    with: additional_chat_templates/tool_use.jinja (as transformers saves it now), or the named
    templates of tokenizer_config.json (as Hermes 2 Pro's and Command R's were published); None where
    it has none."""
    jinja = model_dir / "additional_chat_templates" / "tool_use.jinja"
    if jinja.is_file():
        return jinja.read_text()
    return _named_templates(model_dir).get("tool_use")


def _named_templates(model_dir: Path) -> dict[str, str]:
    """tokenizer_config.json's chat templates by name: its one template as "default", or each of
    the named-templates form (a list of names and templates)."""
    cfg_path = model_dir / "tokenizer_config.json"
    template = json.loads(cfg_path.read_text()).get("chat_template") if cfg_path.is_file() else None
    if isinstance(template, str):
        return {"default": template}
    if isinstance(template, list):
        return {str(t["name"]): str(t["template"]) for t in template if isinstance(t, dict) and "name" in t}
    return {}


def gguf_tool_use_template(gguf: Path) -> str | None:
    """A GGUF file's template named "tool_use": llama.cpp's converter writes a folder's named
    templates as tokenizer.chat_template.NAME (Hermes 3's files carry it)."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf)).fields.get("tokenizer.chat_template.tool_use")
    return None if field is None else str(field.contents())


def require_empty(out_dir: Path) -> None:
    """A bundle is written into a new or empty directory only, never over another."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise BundleError(f"{out_dir}: output directory is not empty")


def pack(model_dir: Path, out_dir: Path, *, name: str, version: str, layer: LayerConstants,
         source: dict[str, str], chat_template: str | None = None, eos_tokens: tuple[str, ...] = (),
         licence: Licence | None = None, licence_files: tuple[Path, ...] = (),
         tool_use_template: str | None = None) -> Manifest:  # fmt: skip
    """Copy an ONNX Runtime GenAI folder into out_dir and write its manifest (unsigned), with the
    options' chat template (and the model's for requests with tools), extra end-of-generation
    tokens and licence where given."""
    layer.validate(where="layer")
    require_empty(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in sorted(model_dir.iterdir()):
        if f.name in (MANIFEST_NAME, SIGNATURE_NAME):
            continue
        if f.is_dir():
            shutil.copytree(f, out_dir / f.name)
        else:
            shutil.copy2(f, out_dir / f.name)
    if eos_tokens:
        add_eos_tokens(out_dir, eos_tokens)
        if (out_dir / CUDA_GRAPH_DIR).is_dir():
            add_eos_tokens(out_dir, eos_tokens, out_dir / CUDA_GRAPH_DIR)
    if licence is not None:
        (out_dir / "licence").mkdir(exist_ok=True)
        for f in licence_files:
            shutil.copy2(f, out_dir / "licence" / f.name)
        licence = Licence(licence.name, licence.url, licence.notice,
                          tuple(f"licence/{f.name}" for f in licence_files))  # fmt: skip
    manifest = Manifest(
        name=name,
        version=version,
        chat_template=chat_template or read_chat_template(out_dir),
        layer=layer,
        files=describe_files(out_dir),
        source=source,
        licence=licence,
        tool_use_template=tool_use_template,
    )
    (out_dir / MANIFEST_NAME).write_bytes(manifest.to_json_bytes())
    return manifest


def add_graph(export_dir: Path, graph_dir: Path) -> None:
    """A second export's graph (its genai_config.json and model files) into a folder of the bundle;
    the tokenizer and template stay the root's, shared by every graph."""
    graph_dir.mkdir(parents=True)
    for f in sorted(export_dir.iterdir()):
        if f.name == "genai_config.json" or ".onnx" in f.name:
            shutil.copy2(f, graph_dir / f.name)


def add_eos_tokens(model_dir: Path, tokens: tuple[str, ...], graph_dir: Path | None = None) -> None:
    """Add these tokens' ids to genai_config.json's eos_token_id (the ids the engine stops on), in
    `graph_dir` (default: the root graph's)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    config_file = (graph_dir or model_dir) / "genai_config.json"
    doc = json.loads(config_file.read_text())
    eos = doc["model"]["eos_token_id"]
    ids = list(eos) if isinstance(eos, list) else [eos]
    for token in tokens:
        tid = tok.token_to_id(token)
        if tid is None:
            raise BundleError(f"end-of-generation token {token!r} is not in the tokenizer")
        if tid not in ids:
            ids.append(tid)
    doc["model"]["eos_token_id"] = ids
    config_file.write_text(json.dumps(doc, indent=4) + "\n")


def sign(bundle_dir: Path, key_path: Path) -> str:
    """Sign the manifest's exact bytes; returns the key id."""
    manifest_bytes = (bundle_dir / MANIFEST_NAME).read_bytes()
    sig = sign_manifest(manifest_bytes, load_private_key(key_path))
    (bundle_dir / SIGNATURE_NAME).write_bytes(sig)
    return str(json.loads(sig)["key_id"])


def build(source: Path, out_dir: Path, options: BuildOptions, key: Path | None = None,
          progress: Progress = _stderr_progress) -> Manifest:  # fmt: skip
    options.validate()
    kind = source_kind(source)
    # What would fail at the end fails first, not after minutes of export.
    if kind == "hf" and (why := prequantized.refusal(prequantized.folder_config(source))):
        raise BundleError(f"{source}: {why}")
    require_empty(out_dir)
    if key:
        load_private_key(key)
    fresh = not out_dir.exists()
    try:
        return _build(source, kind, out_dir, options, key, progress)
    except BaseException:
        # A half-written bundle would refuse the next try ("not empty") and could be mistaken
        # for a bundle: the directory goes back to how it was (absent, or empty).
        if fresh:
            shutil.rmtree(out_dir, ignore_errors=True)
        elif out_dir.is_dir():
            for child in out_dir.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        raise


# Checkpoints of remote code transformers does not ship, read before the export as the family they
# compute (a new folder): their class -> (what they are, that family, what writes the folder).
READ_AS: dict[str, tuple[str, str, Callable[[Path, Path], None]]] = {
    bailing.ARCHITECTURE: ("Ling 2.0", "GLM-4.5", bailing.as_glm4_moe),
    minicpm.ARCHITECTURE: ("MiniCPM", "Granite", minicpm.as_granite)}


def _build(source: Path, kind: str, out_dir: Path, options: BuildOptions, key: Path | None,
           progress: Progress) -> Manifest:  # fmt: skip
    exported = kind in ("gguf", "hf")
    name = options.name or source.stem.lower()
    quantization = prequantized.method(prequantized.folder_config(source)) if kind == "hf" else None
    read_as = READ_AS.get(architecture(source) or "") if kind == "hf" else None
    steps = {"gguf": 4, "hf": 3, "genai": 2}[kind] + (1 if key else 0) + (1 if options.cuda_graph else 0) + \
        (1 if quantization else 0) + (1 if read_as else 0)  # fmt: skip
    step = _Step(steps, progress)
    with tempfile.TemporaryDirectory(prefix="zerolayer-build-") as tmp:
        work = Path(tmp)
        hf_dir = source
        template = options.chat_template
        # (A template given in the options is the one for every request: the source's others are not.)
        tool_template = read_tool_use_template(source) if template is None and source.is_dir() else None
        if kind == "gguf":
            t = step(f"dequantizing {source.name} into a Hugging Face folder")
            hf_dir = work / "hf"
            try:
                gguf_to_hf(source, hf_dir)
            except BundleError:
                raise
            except Exception as exc:  # gguf's reader and transformers' loader raise whatever they hit
                raise BundleError(f"{source.name}: cannot be read as a model ({type(exc).__name__}: {exc}); "
                                  f"{_gguf_hint(source)}") from None  # fmt: skip
            tool_template = gguf_tool_use_template(source) if template is None else None  # (a file read above)
            step.done(t)
        if quantization:
            t = step(f"dequantizing {source.name}'s {quantization} weights into a float32 folder")
            hf_dir = work / "hf"
            prequantized.dequantize_folder(source, hf_dir)
            step.done(t)
        if read_as:
            whose, family, rewrite = read_as
            t = step(f"reading {source.name} ({whose}) as the {family} it computes")
            rewrite(hf_dir, work / "read-as")
            hf_dir = work / "read-as"
            step.done(t)
        if exported:
            refuse_unsupported_attention(hf_dir)
            require_tokenizer_files(hf_dir)
            # What the bundle must ship, checked before minutes of export (and packed as read here:
            # an image-and-text folder's may be in its processor's chat_template.json, which the
            # builder does not copy).
            if template is None:
                template = read_chat_template(hf_dir)
            note_architecture(hf_dir, progress)
            quantized = f", blocks of {options.block_size}" if options.precision in QUANTIZED else ""
            t = step(f"exporting to ONNX ({options.precision}{quantized}, {options.target}) with the model builder")
            genai_dir = work / "onnx"
            run_model_builder(hf_dir, genai_dir, options.precision, options.target, work / "cache", options.block_size)
            step.done(t)
            if options.cuda_graph:
                t = step("exporting the CUDA graph (fp16, cuda) of the same weights")
                run_model_builder(hf_dir, work / "onnx-cuda", "fp16", "cuda", work / "cache")
                add_graph(work / "onnx-cuda", genai_dir / CUDA_GRAPH_DIR)
                step.done(t)
            cap_context_where_the_export_ends(hf_dir, genai_dir, progress)
        else:
            if options.cuda_graph:
                raise BundleError("--cuda-graph needs a model to export (a GGUF file or a Hugging Face folder), "
                                  "not an ONNX Runtime GenAI folder")  # fmt: skip
            refuse_unsupported_attention(source)
            genai_dir = source
            progress(f"{source}: already an ONNX Runtime GenAI folder; --precision/--target/--block-size are taken "
                     "from it")  # fmt: skip
        t = step(f"packing bundle {name} {options.version} into {out_dir}")
        manifest = pack(
            genai_dir, out_dir, name=name, version=options.version, layer=options.layer,
            source={"kind": kind, "file": source.name, "precision": options.precision, "target": options.target,
                    **({"block_size": str(options.block_size)} if exported and options.precision in QUANTIZED else {}),
                    **({"cuda_graph": f"{CUDA_GRAPH_DIR}/ (fp16)"} if options.cuda_graph else {}),
                    **({"dequantized_from": quantization} if quantization else {})},
            chat_template=template, eos_tokens=options.eos_tokens,
            licence=options.licence, licence_files=options.licence_files, tool_use_template=tool_template,
        )  # fmt: skip
        step.done(t)
        t = step("checking the packed model loads in ONNX Runtime and its tokenizer is the model's")
        check_loads(out_dir)
        check_tokenizer(out_dir)
        step.done(t)
        if key:
            t = step(f"signing with {key}")
            sign(out_dir, key)
            step.done(t)
    progress(step.summary(f"bundle {name} {options.version}", sorted(out_dir.iterdir())))
    return manifest


# Attention layer kinds whose export the engine runs as transformers does (checked past the window:
# tests/engine/test_architectures.py). Others (chunked, linear, convolution) are not checked.
ATTENTION_KINDS = ("full_attention", "sliding_attention")
# What transformers 4's configs call full attention (Granite 4's published configs: "attention" or
# "mamba" per layer); transformers 5 reads them as full_attention and linear_attention.
KIND_ALIASES = {"attention": "full_attention", "mamba": "linear_attention"}
# Nemotron-H's published configs give each block's kind as one letter (hybrid_override_pattern).
BLOCK_LETTERS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
# Blocks of a feed-forward layer alone (Nemotron-H's: a norm, the MLP or Nemotron 3's experts, the
# residual), no cache.
FEED_FORWARD_KINDS = {"mlp": ("NemotronHForCausalLM",), "moe": ("NemotronHForCausalLM",)}
# Attention within chunks (Llama 4's rotated layers), served as full attention inside one chunk
# (exact_positions caps the context there).
CHUNKED_KINDS = {"chunked_attention": ("Llama4ForCausalLM", "Llama4ForConditionalGeneration")}
# Recurrent layer kinds, each with the architectures whose export of it was checked against
# transformers (a tiny model in the architecture matrix): their layers carry a fixed-size state per
# request instead of keys and values (session.KVSlots): Qwen3.5's gated delta-net layers, LFM2's
# short convolutions, the Mamba layers of Granite 4.0-H, Nemotron-H, Falcon-H1 and Jamba (builder_shim).
RECURRENT_KINDS = {"linear_attention": ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                                        "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
                                        "GraniteMoeHybridForCausalLM", "NemotronHForCausalLM", "FalconH1ForCausalLM",
                                        "JambaForCausalLM", "Qwen3NextForCausalLM"),
                   "conv": ("Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Lfm2VlForConditionalGeneration",
                            "Lfm3ForCausalLM", "Lfm3VlForConditionalGeneration")}


# RoPE scaling whose export rotates as transformers does, each checked on a tiny model
# (tests/engine/test_architectures.py: llama_rope_*, qwen2_yarn, gemma3_linear, phi3_longrope).
# "ntk_alpha" is HunYuan's NTK scaling with a fixed alpha, which its checkpoints call "dynamic".
# "dynamic" (transformers' dynamic NTK, as InternLM3's) rotates as plain RoPE up to the model's
# max_position_embeddings and only past it grows its base: the context is capped there (exact_positions).
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "ntk_alpha", "dynamic")


def _rope_entries(config: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """(layer type or None for all layers, RoPE settings) of a config.json, in transformers 4's
    `rope_scaling` or 5's `rope_parameters`, flat or one entry per layer type."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        return []
    if not rope or not all(isinstance(v, dict) for v in rope.values()):
        return [(None, rope)]
    return [(str(k), v) for k, v in rope.items()]


GEMMA4_TEXT = ("gemma4_text", "gemma4_unified_text")


def _rope_exported(config: dict[str, Any], layers: str | None, rope_type: str) -> bool:
    """RoPE of a family's own that its builder class (with builder_shim's) computes as transformers
    does: "proportional" on the full-attention layers (the frequencies of the whole head, only part
    of it rotated), a quarter in Gemma 4's and half in LFM3's, checked on their fixtures."""
    return config.get("model_type") in (*GEMMA4_TEXT, "lfm3") and layers == "full_attention" \
        and rope_type == "proportional"


def gemma4_refusal(config: dict[str, Any]) -> str | None:
    """What of a Gemma 4 text config (transformers' gemma4_text) the export would not run as
    transformers does, or None."""
    if config.get("model_type") not in GEMMA4_TEXT:
        return None
    if config.get("enable_moe_block"):
        return ("its mixture-of-experts layers (enable_moe_block, as in Gemma 4 26B A4B) use GeGLU experts, which "
                "ONNX Runtime's CPU MoE operator does not run; not supported")
    return None


def expert_choice_refusal(config: dict[str, Any]) -> str | None:
    """What of a Nemotron 3's, GLM-4.5's, GLM-4.7-Flash's or DeepSeek's experts the export would not
    route as transformers does, or None: it chooses within groups as DeepSeek V3 does (the groups
    ranked by their two best scores; DeepSeek V2's ranking by the best one is not built) and, where
    the choice is by sigmoid, mixes the chosen by their scores scaled to sum to 1 (DeepSeek V2's
    softmax weights go as they are); HunYuan's choose as many of as many experts in every layer."""
    kind = config.get("model_type")
    if kind == "hunyuan_v1_moe":  # (its counts may be given per layer: the export takes one for all)
        for name in ("num_experts", "moe_topk"):
            value = config.get(name)
            if isinstance(value, list) and len(set(value)) > 1:
                return f"its {name} differs by layer ({value}), which the export does not compute; not supported"
    experts = kind in GROUPED_CHOICE_FAMILIES or (
        kind == "nemotron_h" and "moe" in layer_kinds(config))
    if not experts:
        return None
    grouped = int(config.get("topk_group") or 1) < int(config.get("n_group") or 1)
    if grouped and kind == "deepseek_v2" and config.get("topk_method") == "group_limited_greedy":
        return (f"its experts are chosen within the best {config.get('topk_group')} of {config.get('n_group')} "
                "groups by their best score (n_group, topk_group, group_limited_greedy), which the export "
                "does not compute; not supported")
    if config.get("norm_topk_prob") is False and kind != "deepseek_v2":
        return "its experts are mixed by scores not scaled to sum to 1 (norm_topk_prob false); not supported"
    return None


# Options of a family's config that the export leaves out, each of which changes the model's answers:
# (model type, option, what it does, the family as its users know it). Refused before the export.
UNEXPORTED_OPTIONS = (
    ("stablelm", "qk_layernorm", "per-head query and key LayerNorms, as in StableLM 2 12B", "StableLM"),
    ("stablelm", "use_parallel_residual", "attention and the MLP side by side, as in StableLM 2 12B", "StableLM"),
    ("cohere", "use_qk_norm", "per-head query and key LayerNorms, as in Command R+", "Cohere's models"),
    ("phi", "qk_layernorm", "query and key LayerNorms", "Phi"),  # a tiny Phi-2 with them was 0.88 off
    ("lfm2", "conv_bias", "a bias on its short convolutions", "LFM2"),  # a tiny LFM2 with one was 6.2 off
    ("opt", "_remove_final_layer_norm", "no norm after the last layer", "OPT"),
    ("gpt2", "add_cross_attention", "cross-attention (an encoder-decoder's decoder)", "GPT-2"),
    ("falcon", "alibi", "ALiBi position biases, as Falcon-RW's", "Falcon"),
    ("bloom", "apply_residual_connection_post_layernorm", "the residual taken after the input norm", "BLOOM"),
)


def unexported_option(config: dict[str, Any]) -> str | None:
    """What of a config the export would leave out (UNEXPORTED_OPTIONS), or None."""
    found = [f"{option} ({what}) is not exported for {family}" for model_type, option, what, family in
             UNEXPORTED_OPTIONS if config.get("model_type") == model_type and config.get(option)]  # fmt: skip
    return f"{'; '.join(found)}; not supported" if found else None


def _rope_types(config: dict[str, Any]) -> list[tuple[str | None, str]]:
    """(layer type or None for all layers, RoPE type) of a config.json."""
    found = []
    for layers, entry in _rope_entries(config):
        kind = str(entry.get("rope_type") or entry.get("type") or "default")
        if kind == "su":  # Phi-3's first name for LongRoPE, which transformers reads as longrope
            kind = "longrope"
        found.append((layers, "ntk_alpha" if kind == "dynamic" and entry.get("alpha") else kind))
    return found


# Families whose builder class switches LongRoPE's factors by the sequence's length, as transformers
# does (Phi-3's); any other's export rotates by the short factors alone (builder_shim.yarn_as_transformers).
LONGROPE_BY_LENGTH = ("phi3",)


def exact_positions(config: dict[str, Any]) -> tuple[int, str] | None:
    """How many positions the export answers as transformers does, where that may be fewer than
    the model's context, and why (None: all of them). Ministral 3 scales its queries by position
    past its original context (`llama_4_scaling_beta`: 1 + beta * log(1 + position // original));
    the builder leaves the scale out, so its export is exact only inside the original context (a
    tiny one matched transformers within 2.9e-6 there and was 4.9e-4 off past it). Dynamic NTK
    RoPE grows its base past max_position_embeddings as the sequence does, which the export's one
    table of frequencies (builder_shim.dynamic_ntk_as_default) cannot follow. Llama 4 attends within
    chunks in its rotated layers, and scales the queries of the others by position from floor_scale
    on (attn_temperature_tuning), neither of which the export computes: exact before both. LongRoPE
    turns to its long factors past the original context, which only Phi-3's export follows."""
    text = config.get("text_config", config)
    if text.get("model_type") == "llama4_text":
        limits = [(int(text["attention_chunk_size"]), "its rotated layers attend within chunks of this many "
                   "positions (attention_chunk_size), which the export attends across")] if text.get(
            "attention_chunk_size") else []
        if text.get("attn_temperature_tuning", True):
            limits.append((int(text.get("floor_scale", 8192)) - 1, "from floor_scale on, its other layers scale "
                           "their queries by position (attn_temperature_tuning), which the export leaves out"))
        if limits:
            return min(limits)
    for _, entry in _rope_entries(text):
        if entry.get("llama_4_scaling_beta") and entry.get("original_max_position_embeddings"):
            return (int(entry["original_max_position_embeddings"]), "past its original context the model scales its "
                    "queries by position (llama_4_scaling_beta), which the export leaves out")  # fmt: skip
        kind = entry.get("rope_type") or entry.get("type")
        original = entry.get("original_max_position_embeddings") or text.get("original_max_position_embeddings")
        if kind == "longrope" and text.get("model_type") not in LONGROPE_BY_LENGTH and original:
            return (int(original), "past its original context the model's LongRoPE turns to its long factors, "
                    "which the export (its short ones) leaves out")  # fmt: skip
        if kind == "dynamic" and not entry.get("alpha") and text.get("max_position_embeddings"):
            return (int(text["max_position_embeddings"]), "past max_position_embeddings the model's dynamic NTK RoPE "
                    "grows its base with the sequence, which the export's one table of frequencies cannot follow")
    return None


def cap_context_where_the_export_ends(hf_dir: Path, genai_dir: Path, progress: Progress) -> None:
    """Serve no more positions than the export is exact for (exact_positions): each graph's
    genai_config.json context_length, which the engine sizes its slots and refuses prompts by."""
    config_file = hf_dir / "config.json"
    exact = exact_positions(json.loads(config_file.read_text())) if config_file.is_file() else None
    if exact is None:
        return
    limit, why = exact
    for graph_dir in (genai_dir, genai_dir / CUDA_GRAPH_DIR):
        genai_file = graph_dir / "genai_config.json"
        if not genai_file.is_file():
            continue
        doc = json.loads(genai_file.read_text())
        if doc["model"]["context_length"] > limit:
            progress(f"note: context capped at {limit} positions (from {doc['model']['context_length']}): {why}")
            doc["model"]["context_length"] = limit
            genai_file.write_text(json.dumps(doc, indent=4) + "\n")


def layer_kinds(config: dict[str, Any]) -> list[str]:
    """Each layer's kind in transformers 5's names, from a config.json's `layer_types`, its
    `layers_block_type` or its `hybrid_override_pattern` (Nemotron-H's, saved by either)."""
    kinds = config.get("layer_types") or config.get("layers_block_type")
    pattern = config.get("hybrid_override_pattern")
    if not kinds and isinstance(pattern, str):
        kinds = [BLOCK_LETTERS.get(letter, letter) for letter in pattern]
    return [KIND_ALIASES.get(str(k), str(k)) for k in kinds or ()]


def refuse_unsupported_attention(model_dir: Path) -> None:
    """Refuse, before the export or the pack, attention the engine would run differently from the
    model. Sliding-window and interleaved local/global attention are supported: the builder is
    told which layers slide (builder_shim.sliding_window_layers) and keeps full-length caches for
    them (windowed_kv_cache=false), and the attention operator masks what lies outside the window.
    Still refused:

    - layers of another kind than full or sliding attention (`layer_types`), but for the
      recurrent layers of the architectures in RECURRENT_KINDS: not checked;
    - `clip_qkv` (OLMo's clamped queries, keys and values): the builder leaves the clamp out, so
      the export answers differently from the model;
    - Gemma 4's experts (`enable_moe_block`, 26B A4B): ONNX Runtime's CPU MoE operator has no
      GeGLU, which they use (gemma4_refusal);
    - options of a family's config that the export leaves out (UNEXPORTED_OPTIONS): StableLM's
      per-head query and key LayerNorms and parallel residual (StableLM 2 12B's), which the
      builder's Llama class, that builds its other models, does not; Cohere's per-head query and
      key LayerNorms (Command R+'s); Phi's query and key LayerNorms; LFM2's convolution bias;
    - RoPE scaling other than the kinds checked against transformers (ROPE_TYPES), and scaling of
      the sliding layers' RoPE (Gemma 3 scales only its global layers'). transformers' dynamic
      NTK scaling, for one, changes the frequencies as a sequence grows past the original
      context, which the export's one precomputed table cannot follow;
    - an ONNX Runtime GenAI folder built with window-sized caches for its sliding layers
      (genai_config's decoder.sliding_window): the engine binds one buffer of the whole capacity
      per layer, so those layers would read and write the wrong positions. Rebuild it from the
      Hugging Face folder or the GGUF file.
    """
    genai_file = model_dir / "genai_config.json"
    if genai_file.is_file():
        decoder = json.loads(genai_file.read_text()).get("model", {}).get("decoder", {})
        window = decoder.get("sliding_window")
        if window:
            raise BundleError(f"{model_dir.name}: its sliding-window layers {window.get('layers')} keep window-sized "
                              f"caches ({window.get('window_size')} positions); the engine needs full-length caches: "
                              "build it from the Hugging Face folder or GGUF file instead")  # fmt: skip
        return
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        return
    config = json.loads(config_file.read_text())
    config = config.get("text_config", config)  # multimodal configs nest the language model's
    arch = architecture(model_dir)
    supported = {*ATTENTION_KINDS, *(kind for kinds in (RECURRENT_KINDS, FEED_FORWARD_KINDS, CHUNKED_KINDS)
                                     for kind, archs in kinds.items() if arch in archs)}  # fmt: skip
    kinds = sorted(set(layer_kinds(config)) - supported)
    if kinds:
        raise BundleError(f"{model_dir.name}: layers of kind {', '.join(kinds)} are not supported by the engine "
                          f"(supported for {arch or 'this model'}: {', '.join(sorted(supported))})")  # fmt: skip
    refusal = gemma4_refusal(config) or expert_choice_refusal(config) or unexported_option(config) or \
        gpt_families.refusal(config) or qwen3_next.refusal(config)  # fmt: skip
    if refusal:
        raise BundleError(f"{model_dir.name}: {refusal}")
    for layers, rope_type in _rope_types(config):
        if _rope_exported(config, layers, rope_type):
            continue
        if rope_type not in ROPE_TYPES or (rope_type != "default" and layers == "sliding_attention"):
            where = f" on its {layers} layers" if layers else ""
            raise BundleError(f"{model_dir.name}: RoPE scaling {rope_type!r}{where} is not exported as transformers "
                              "computes it (supported: "
                              f"{', '.join(ROPE_TYPES)}, on all layers or the full-attention ones)")  # fmt: skip
    if config.get("clip_qkv"):
        raise BundleError(f"{model_dir.name}: clip_qkv {config['clip_qkv']} (queries, keys and values clamped) is "
                          "left out by the ONNX Runtime GenAI model builder, so the export would answer differently "
                          "from the model; not supported")  # fmt: skip


def checked_architectures() -> tuple[str, ...]:
    """The model classes make test checks against transformers: those of the tiny fixtures
    (tests/engine/test_architectures.py and test_gguf_architectures.py build each)."""
    from firmware.toolchain.tiny import ARCHITECTURES, LAYOUTS_AS_PUBLISHED, PUBLISHED_AS  # (tiny builds through here)

    return tuple(dict.fromkeys([*(model for _, model, _ in ARCHITECTURES.values()), *PUBLISHED_AS.values(),
                                *(name for name, _ in LAYOUTS_AS_PUBLISHED.values())]))


def architecture(hf_dir: Path) -> str | None:
    """config.json's first architecture, if it names one."""
    try:
        names = json.loads((hf_dir / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return None
    return str(names[0]) if names else None


def note_architecture(hf_dir: Path, progress: Progress) -> None:
    """An architecture this project does not check may still export (the builder knows more), but
    the operator is told to compare its answers before serving it."""
    arch, checked = architecture(hf_dir), checked_architectures()
    if arch not in checked:
        progress(f"note: {arch or 'an unnamed architecture'} is not one this build checks against transformers "
                 f"({', '.join(checked)}); compare its answers before serving it")  # fmt: skip


def require_tokenizer_files(hf_dir: Path) -> None:
    """A Hugging Face folder must carry its tokenizer in a form this toolchain reads: tokenizer.json,
    a byte-level BPE's vocab.json and merges.txt, or a SentencePiece tokenizer.model where the
    sentencepiece package is installed (the toolchain does not install it)."""
    if (hf_dir / "tokenizer.json").is_file() or all((hf_dir / f).is_file() for f in ("vocab.json", "merges.txt")):
        return
    sentencepiece = (hf_dir / "tokenizer.model").is_file()
    if sentencepiece and importlib.util.find_spec("sentencepiece") is not None:
        return  # transformers converts it here (and check_tokenizer still checks what it made)
    found = "only a SentencePiece tokenizer.model" if sentencepiece else "no tokenizer files"
    raise BundleError(f"{hf_dir.name}: {found}; the build needs tokenizer.json. Convert it where sentencepiece is "
                      "installed (AutoTokenizer.from_pretrained(folder).save_pretrained(folder)), or install "
                      "sentencepiece into the toolchain's virtualenv")  # fmt: skip


# A tokenizer knowing fewer tokens than this share of the model's embedding rows is not the model's.
# Vocabularies are padded a little (Qwen2.5 0.5B: 151,665 tokens for 151,936 rows; Phi-3: 32,011
# for 32,064), never by half.
MIN_TOKENIZER_COVERAGE = 0.9


def check_tokenizer(bundle_dir: Path) -> None:
    """Refuse a tokenizer that cannot be the model's. transformers makes a near-empty one, and the
    export ships it, from a folder whose tokenizer files it cannot read (no tokenizer.json, say):
    every prompt would then be the unknown token."""
    from tokenizers import Tokenizer

    from firmware.bundle import read_model_facts

    try:
        tokens = Tokenizer.from_file(str(bundle_dir / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    except Exception as exc:  # tokenizers raises its own exception types for a bad file
        raise BundleError(f"tokenizer.json: cannot be loaded: {exc}") from None
    rows = read_model_facts(bundle_dir).vocab_size
    if tokens < MIN_TOKENIZER_COVERAGE * rows:
        raise BundleError(f"tokenizer.json: {tokens} tokens for a model with {rows} embedding rows, so it is not "
                          "this model's tokenizer; give the source its tokenizer as tokenizer.json (the fast "
                          "tokenizer file Hugging Face repositories ship)")  # fmt: skip


def check_loads(bundle_dir: Path) -> None:
    """Refuse to ship a model ONNX Runtime cannot open, or (where it opens on this CPU) cannot run."""
    import onnxruntime as ort

    from firmware.bundle import read_model_facts

    for graph_dir in (bundle_dir, bundle_dir / CUDA_GRAPH_DIR):
        if not (graph_dir / "genai_config.json").is_file():
            continue
        facts = read_model_facts(graph_dir)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            session = ort.InferenceSession(str(graph_dir / facts.onnx_file), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises several unrelated types for a bad model
            if "cuda" in str(exc).lower() or "CUDA" in str(facts):
                continue  # a CUDA-only graph cannot be opened on a CPU builder; the daemon checks it on the box
            raise BundleError(f"{facts.onnx_file}: ONNX Runtime cannot load it: {exc}") from None
        refusal = facts.graph_refusal({i.name: i.shape for i in session.get_inputs()})
        if refusal:
            raise BundleError(f"{facts.onnx_file}: {refusal}")
        if _provider_options(graph_dir):
            continue  # a GPU graph runs where its provider is (the daemon warms it up at start), not here
        try:
            _run_prompt_and_one_token(session, facts)
        except Exception as exc:  # ORT raises its own types; the message names the node that failed
            raise BundleError(f"{facts.onnx_file}: ONNX Runtime opens it but cannot run it: {exc}") from None


def _provider_options(graph_dir: Path) -> list[Any]:
    """The execution providers a graph's genai_config.json asks for (none: the CPU's)."""
    doc = json.loads((graph_dir / "genai_config.json").read_text())
    options = doc.get("model", {}).get("decoder", {}).get("session_options", {}).get("provider_options")
    return [o for o in options or () if not (isinstance(o, dict) and set(o) <= {"cpu"})]


def _run_prompt_and_one_token(session: Any, facts: Any) -> None:
    """A graph can open and still fail at its first run: GroupQueryAttention, for one, refuses a
    rotary table whose width is not a multiple of 8 only when it runs. So a three-token prompt and
    one more token from its cache go through it, with the inputs the engine gives it (past keys
    and values as their own tensors here, not the engine's shared buffers)."""
    import numpy as np

    from firmware.bundle import NUMPY_TYPES

    inputs = {i.name: i for i in session.get_inputs()}
    types = {name: np.dtype(NUMPY_TYPES.get(i.type, "float32")) for name, i in inputs.items()}
    layers, states = facts.caches(inputs)
    kv = [pair for pk, pv, ok, ov in layers for pair in ((pk, ok), (pv, ov))]
    past_names = [p for p, _ in kv + states]
    present_names = [p for _, p in kv + states]
    shapes = facts.kv_shapes({name: i.shape for name, i in inputs.items()})
    past = [np.zeros((1, heads, 0, width), types[name])
            for (name, _), (heads, width) in zip(kv, (s for s in shapes for _ in range(2)), strict=True)]  # fmt: skip
    past += [np.zeros((1, *inputs[name].shape[1:]), types[name]) for name, _ in states]  # a sequence's first state
    done, ids = 0, [1, 2, 3]
    for _ in range(2):
        feed: dict[str, Any] = {"input_ids": np.array([ids], types["input_ids"]),
                                "attention_mask": np.ones((1, done + len(ids)), types["attention_mask"]),
                                **dict(zip(past_names, past, strict=True))}  # fmt: skip
        if "position_ids" in types:  # (three planes of them for multimodal RoPE, as the engine feeds text)
            positions = np.arange(done, done + len(ids), dtype=types["position_ids"])[None]
            planes = len(inputs["position_ids"].shape) == 3
            feed["position_ids"] = np.ascontiguousarray(np.broadcast_to(positions, (3, *positions.shape))) if planes \
                else positions
        logits, *past = session.run(["logits", *present_names], feed)
        if not np.isfinite(logits).all():
            raise ValueError("its logits are not all finite")
        done, ids = done + len(ids), [int(np.asarray(logits)[0, -1].argmax())]
