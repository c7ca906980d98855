"""The `--from X.gguf` build for every architecture the firmware build supports: each tiny fixture
(tiny.py) written as llama.cpp writes that family's GGUF (tiny_gguf.py: F32 tensors, llama.cpp's
per-family transforms and metadata, the tokenizer and chat template), built to fp32 firmware, and
checked against the bundle built from the Hugging Face folder (itself checked against transformers
in test_architectures.py): the same chat-prompt token ids, prefill logits within 1e-4 and the same
16 greedy tokens. The conversation runs past Mistral's and Gemma 3's 16-position windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import firmware
from appliance.engine import Message, ModelSession
from appliance.engine.chat import ChatTemplate
from appliance.engine.tokenizer import TextTokenizer
from firmware.toolchain.build import read_chat_template
from firmware.toolchain.tiny import ARCHITECTURES, tiny_bundle, tiny_hf_dir
from firmware.toolchain.tiny_gguf import GGUF_ARCHITECTURES, tiny_gguf, tiny_gguf_bundle

CONVERSATION = (
    Message("user", "Explain the for statement and how the else clause of a loop works."),
    Message("assistant", "The for statement iterates over the items of any sequence, in order."),
    Message("user", "And what does break do inside a while loop with an else clause?\n\n  Twice  spaced."),
)
SYSTEM = "You answer in one short sentence."


@pytest.fixture(scope="module", params=sorted(GGUF_ARCHITECTURES))
def arch(request: pytest.FixtureRequest, trusted_keys: Path) -> tuple[str, firmware.Bundle, firmware.Bundle]:
    name = str(request.param)
    return (name, firmware.load(tiny_gguf_bundle(name), trusted_keys),
            firmware.load(tiny_bundle(name), trusted_keys))  # fmt: skip


def test_every_fixture_architecture_has_a_gguf_form() -> None:
    assert set(GGUF_ARCHITECTURES) == set(ARCHITECTURES)


def _ids(bundle: firmware.Bundle, system: str | None = None) -> list[int]:
    tok = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    return ChatTemplate(bundle.chat_template, tok).prompt(CONVERSATION, system=system).ids


def _hf_chat_ids(tokenizer: Any, system: str | None) -> list[int]:
    docs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": m.role, "content": m.content} for m in CONVERSATION
    ]
    out = tokenizer.apply_chat_template(docs, tokenize=True, add_generation_prompt=True)
    if not isinstance(out, list):  # transformers 5 returns the encoding
        out = out["input_ids"]
    return [int(i) for i in out]


@pytest.mark.parametrize("system", [None, SYSTEM])
def test_the_gguf_tokenizer_and_template_give_the_folder_s_token_ids(
    arch: tuple[str, firmware.Bundle, firmware.Bundle], system: str | None
) -> None:
    """The bundle built from the GGUF renders and tokenizes a chat as the one built from the folder
    does, and transformers reads from the GGUF the tokenizer of the folder's tokenizer.json.

    Except for Qwen2, both bundles also give the folder's own ids: the model builder re-saves a
    tokenizer by model type, and Qwen2Tokenizer splits text by Qwen2's rule, which this fixture's
    BPE (trained with GPT-2's) was not made with; the doubled spaces here split differently. It
    does so from either source; a real Qwen2 vocabulary is made with that rule."""
    from transformers import AutoTokenizer

    name, from_gguf, from_folder = arch
    ids = _ids(from_gguf, system)
    assert ids == _ids(from_folder, system), name
    assert from_gguf.chat_template == from_folder.chat_template, name
    folder = tiny_hf_dir(name)
    tok = TextTokenizer(folder / "tokenizer.json", folder / "tokenizer_config.json")
    own = ChatTemplate(read_chat_template(folder), tok).prompt(CONVERSATION, system=system).ids
    path = tiny_gguf(name)
    assert _hf_chat_ids(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name), system) == own, name
    assert (ids == own) == (name != "qwen2"), name


def test_prefill_logits_and_16_greedy_steps_match_the_folder_s_bundle(
    arch: tuple[str, firmware.Bundle, firmware.Bundle],
) -> None:
    name, from_gguf, from_folder = arch
    ids = np.array(_ids(from_folder), dtype=np.int64)
    assert len(ids) > 4 * 16  # past the sliding windows
    ours, ref = ModelSession(from_gguf), ModelSession(from_folder)
    cache, ref_cache = ours.new_cache(len(ids) + 16), ref.new_cache(len(ids) + 16)
    logits, ref_logits = ours.forward(cache, ids), ref.forward(ref_cache, ids)
    assert np.abs(logits - ref_logits).max() <= 1e-4, name
    tokens, ref_tokens = [], []
    for _ in range(16):
        tokens.append(int(logits.argmax()))
        ref_tokens.append(int(ref_logits.argmax()))
        logits = ours.forward(cache, np.array(tokens[-1:], dtype=np.int64))
        ref_logits = ref.forward(ref_cache, np.array(ref_tokens[-1:], dtype=np.int64))
    assert tokens == ref_tokens, name


# What transformers' GGUF loader leaves out of the config and gguf_to_hf puts back, per fixture.
RESTORED = {
    "qwen3": {"head_dim": 16},
    "phi3": {"rope_parameters.partial_rotary_factor": 0.5},
    "phi3_longrope": {"rope_parameters.rope_type": "longrope",
                      "rope_parameters.original_max_position_embeddings": 1024},
    "mistral": {"model_type": "mistral", "sliding_window": 16},
    "gemma3": {"layer_types": ["sliding_attention", "full_attention"], "query_pre_attn_scalar": 16},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(RESTORED))
def test_the_dequantized_folder_keeps_what_the_gguf_states(name: str, tmp_path: Path) -> None:
    """Each of these the loader drops (and the model's output changes): checked on the folder
    gguf_to_hf writes, against the fixture's own config."""
    import json

    from firmware.toolchain.build import gguf_to_hf

    gguf_to_hf(tiny_gguf(name), tmp_path / "hf")
    ours = json.loads((tmp_path / "hf" / "config.json").read_text())
    theirs = json.loads((tiny_hf_dir(name) / "config.json").read_text())
    for key, value in RESTORED[name].items():
        got, want = ours, theirs
        for part in key.split("."):
            got, want = got[part], want[part]
        assert got == want == value, (name, key)
    if name == "phi3_longrope":
        for key in ("short_factor", "long_factor"):
            assert np.allclose(ours["rope_parameters"][key], theirs["rope_parameters"][key]), key
