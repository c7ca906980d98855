"""Every architecture the firmware build supports, checked as the Llama fixture is
(tests/engine/test_engine.py): a tiny random-weight model made locally from a transformers config, built
to fp32 firmware; our prefill logits against transformers within 1e-4, greedy tokens identical for
32 steps, sharded prefill and a prefix reused from the pool identical to one pass."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import firmware
from appliance.engine import Engine, EngineConfig, GenerationRequest, Message, ModelSession, TextDelta
from appliance.engine.chat import ChatTemplate
from appliance.engine.tokenizer import TextTokenizer
from firmware.toolchain.tiny import ARCHITECTURES, tiny_bundle, tiny_hf_dir

OTHERS = sorted(set(ARCHITECTURES) - {"llama"})  # the Llama fixture has its own module
CONVERSATION = (
    Message("user", "Explain the for statement and how the else clause of a loop works."),
    Message("assistant", "The for statement iterates over the items of any sequence, in order."),
    Message("user", "And what does break do inside a while loop with an else clause?"),
)


@pytest.fixture(scope="module", params=OTHERS)
def arch(request: pytest.FixtureRequest, trusted_keys: Path) -> Iterator[tuple[str, firmware.Bundle, object]]:
    import torch
    from transformers import AutoModelForCausalLM

    name = str(request.param)
    bundle = firmware.load(tiny_bundle(name), trusted_keys)
    hf = AutoModelForCausalLM.from_pretrained(tiny_hf_dir(name), dtype=torch.float32).eval()
    yield name, bundle, hf


def _ids(bundle: firmware.Bundle) -> list[int]:
    tok = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    return ChatTemplate(bundle.chat_template, tok).prompt(CONVERSATION).ids


def _hf_logits(model: object, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()  # type: ignore[operator,no-any-return]


def test_prefill_logits_and_32_greedy_steps_match_transformers(arch: tuple[str, firmware.Bundle, object]) -> None:
    name, bundle, hf = arch
    ids = _ids(bundle)
    ref = _hf_logits(hf, ids)
    session = ModelSession(bundle)
    cache = session.new_cache(len(ids) + 32)
    logits = session.forward(cache, np.array(ids, dtype=np.int64))
    assert np.abs(logits - ref[-1]).max() <= 1e-4, name
    ref_ids, ours = list(ids), []
    for _ in range(32):
        ref_ids.append(int(_hf_logits(hf, ref_ids)[-1].argmax()))
        ours.append(int(logits.argmax()))
        logits = session.forward(cache, np.array([ours[-1]], dtype=np.int64))
    assert ours == ref_ids[len(ids) :], name


def test_sharded_and_prefix_reused_generation_equal_one_pass(arch: tuple[str, firmware.Bundle, object]) -> None:
    name, bundle, _ = arch
    ids = np.array(_ids(bundle), dtype=np.int64)
    session = ModelSession(bundle)
    one = session.forward(session.new_cache(len(ids)), ids)
    cache = session.new_cache(len(ids))
    for start in range(0, len(ids), 7):  # shards of 7
        logits = session.forward(cache, ids[start : start + 7])
    assert np.abs(logits - one).max() <= 1e-4, name

    request = GenerationRequest(CONVERSATION, max_tokens=16, temperature=0.0)
    cold = Engine(bundle, EngineConfig(prefix_cache_bytes=0))
    warm = Engine(bundle, EngineConfig(prefix_cache_bytes=16 << 20, prefix_block_tokens=8))

    async def text(engine: Engine) -> tuple[str, int]:
        stream = engine.submit(request)
        out = "".join([e.text async for e in stream if isinstance(e, TextDelta)])
        assert stream.finished is not None
        return out, stream.finished.trace.reused_tokens

    try:
        expected, _ = asyncio.run(text(cold))
        first, _ = asyncio.run(text(warm))
        again, reused = asyncio.run(text(warm))
    finally:
        cold.close()
        warm.close()
    assert reused > 0 and first == again == expected, name


def test_a_model_with_sliding_window_attention_is_refused_before_export(tmp_path: Path) -> None:
    """The engine attends to every position; a model whose attention slides would answer
    differently past its window, so the build refuses it by name instead of shipping it."""
    import json

    from firmware.errors import BundleError
    from firmware.toolchain.build import BuildOptions, build

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "mistral", "sliding_window": 16,
                                                "max_position_embeddings": 2048}))  # fmt: skip
    with pytest.raises(BundleError, match=r"sliding-window attention \(a window of 16 positions"):
        build(hf, tmp_path / "out", BuildOptions(precision="fp32"))
