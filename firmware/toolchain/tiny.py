"""The tiny fixture: a random-weight Llama (hidden 64, 2 layers, 4 heads, 2 KV heads) with a BPE
tokenizer trained on CPython's own pydoc topics. It exports in seconds, so every test can use a
real ONNX Runtime session on a real (if meaningless) model. The same shape is made for the other
architectures the firmware build supports (ARCHITECTURES), each checked against transformers."""

from __future__ import annotations

from pathlib import Path

from firmware.manifest import LayerConstants
from firmware.toolchain.build import BuildOptions, build
from firmware.toolchain.devkit import ensure_bundle

TINY_NAME = "tiny-llama"
# Architecture -> (transformers config class, model class, what differs from the Llama shape).
# Qwen3 adds per-head query/key norms. Phi-3 and Gemma 3 are not here: onnxruntime-genai 0.18's
# builder fails on their transformers 5 configs (KeyError 'multi_cache', KeyError 'rope_type').
ARCHITECTURES: dict[str, tuple[str, str, dict[str, object]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
}
# ChatML, as SmolLM2 uses: rendered by Jinja exactly as Hugging Face renders it.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def make_tiny_hf(out_dir: Path, seed: int = 0, arch: str = "llama") -> None:
    import pydoc_data.topics

    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    config_class, model_class, extra = ARCHITECTURES[arch]

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(sorted(pydoc_data.topics.topics.values()), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
        unk_token="<|endoftext|>", pad_token="<|endoftext|>",
    )  # fmt: skip
    fast.chat_template = TINY_CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=tok.token_to_id("<|im_start|>"), eos_token_id=tok.token_to_id("<|im_end|>"),
        pad_token_id=tok.token_to_id("<|endoftext|>"), tie_word_embeddings=False, **extra,
    )  # fmt: skip
    model = getattr(transformers, model_class)(config)
    # Random init leaves tiny logits; scale the head so greedy decoding is not a sea of near-ties.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(out_dir)


def tiny_hf_dir(arch: str = "llama") -> Path:
    """The Hugging Face folder of the fixture (the reference for correctness tests)."""
    import shutil

    from firmware.toolchain.paths import cache_dir

    d = cache_dir() / ("tiny-hf" if arch == "llama" else f"tiny-hf-{arch}")
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

    return ensure_bundle(name, make)
