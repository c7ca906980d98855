"""A bundle with a graph per target: the CPU graph at its root and an fp16 CUDA graph of the same
weights in cuda/, both signed. Each device runs its own; the CUDA graph's logits, run here on the
CPU provider, match transformers within fp16's precision."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import firmware
from appliance.engine import Message
from appliance.engine.chat import ChatTemplate
from appliance.engine.engine import sessions_on
from appliance.engine.session import ModelSession
from appliance.engine.tokenizer import TextTokenizer
from appliance.plan import HostFacts, make_plan, memory_need
from firmware import BundleError
from firmware.manifest import LayerConstants
from firmware.toolchain.build import BuildOptions, build
from firmware.toolchain.devkit import ensure_bundle

QUESTION = (Message("user", "Explain the for statement and how the else clause of a loop works."),)


@pytest.fixture(scope="module")
def both(tiny_hf_path: Path, trusted_keys: Path) -> firmware.Bundle:
    def make(out: Path) -> None:
        options = BuildOptions(precision="fp32", target="cpu", name="tiny-llama-cuda-graph",
                               layer=LayerConstants(max_tokens_per_shard=64), cuda_graph=True)  # fmt: skip
        build(tiny_hf_path, out, options)

    return firmware.load(ensure_bundle("tiny-llama-cuda-graph", make), trusted_keys)


def _ids(bundle: firmware.Bundle) -> np.ndarray:
    tok = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    return np.array(ChatTemplate(bundle.chat_template, tok).prompt(QUESTION).ids, dtype=np.int64)


def test_each_target_has_its_own_signed_graph(both: firmware.Bundle) -> None:
    assert both.targets == ("cpu", "cuda") and both.cuda_model is not None
    assert {"cuda/genai_config.json", "cuda/model.onnx"} <= set(both.manifest.files)
    assert both.manifest.source["cuda_graph"] == "cuda/ (fp16)"
    assert ModelSession(both, "cpu").kv_dtype == np.float32  # the CPU runs the root graph
    assert ModelSession(both, "cpu", target="cuda").kv_dtype == np.float16


def test_the_cuda_graph_matches_transformers_within_fp16(both: firmware.Bundle, tiny_hf_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_hf_path, dtype=torch.float32).eval()
    ids = _ids(both)
    with torch.no_grad():
        want = hf(torch.tensor([ids.tolist()])).logits[0, -1].numpy()
    fp32, fp16 = ModelSession(both, "cpu"), ModelSession(both, "cpu", target="cuda")
    exact = fp32.forward(fp32.new_cache(len(ids)), ids)
    half = fp16.forward(fp16.new_cache(len(ids)), ids)
    assert np.abs(exact - want).max() <= 1e-4
    assert np.abs(half - want).max() <= 0.05 and int(half.argmax()) == int(want.argmax())


def test_a_gpu_runs_the_cuda_graph_and_counts_its_files_only(both: firmware.Bundle, tmp_path: Path) -> None:
    from appliance.config import load_config

    (tmp_path / "zerolayer.toml").write_text("")
    config = load_config(tmp_path, check_paths=False)
    plan = make_plan(config, both, HostFacts(("cpu", "cuda:0"), "nvml", gpu_memory=80 << 30))
    assert plan.devices == ("cuda:0", "cpu") and not plan.notes  # no "no CUDA graph" note
    cuda_files = sum(e.size for rel, e in both.manifest.files.items() if rel.startswith("cuda/"))
    assert memory_need(both, plan.engine, "cuda:0").weights == cuda_files
    cpu_files = sum(e.size for e in both.manifest.files.values()) - cuda_files
    assert memory_need(both, plan.engine).weights == cpu_files * sessions_on(plan.engine, "cpu")


def test_a_cuda_graph_needs_a_model_to_export(tiny_bundle_path: Path, tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="--cuda-graph needs a model to export"):
        build(tiny_bundle_path, tmp_path / "x", BuildOptions(precision="fp32", cuda_graph=True))
    with pytest.raises(BundleError, match="already cuda"):
        BuildOptions(precision="fp16", target="cuda", cuda_graph=True).validate()
