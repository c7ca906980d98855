"""The daemon's plan, pure: config + verified bundle + host facts -> what gets built, every baked
constant's rule in one place."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import firmware
from appliance.config import ConfigError, load_config
from appliance.engine.engine import sessions_on
from appliance.plan import HostFacts, make_plan


@pytest.fixture(scope="module")
def bundle(tiny_bundle_path: Path, trusted_keys: Path) -> firmware.Bundle:
    return firmware.load(tiny_bundle_path, trusted_keys)


def _config(tmp_path: Path, text: str = ""):  # type: ignore[no-untyped-def]
    root = tmp_path / "etc"
    root.mkdir(exist_ok=True)
    (root / "zerolayer.toml").write_text(text)
    return load_config(root, check_paths=False)


def test_config_may_lower_baked_constants_but_every_raise_is_named_at_once(bundle: firmware.Bundle,
                                                                            tmp_path: Path) -> None:  # fmt: skip
    baked_shard = bundle.layer.max_tokens_per_shard
    cpu_only = HostFacts(("cpu",), "none")
    lowered = f"[engine]\nmax_tokens_per_shard = {baked_shard - 1}\n[governor]\nthreshold = 0.5\n"
    low = make_plan(_config(tmp_path, lowered), bundle, cpu_only)
    assert low.engine.max_tokens_per_shard == baked_shard - 1 and low.governor.threshold == 0.5
    with pytest.raises(ConfigError) as info:
        raised = f"[engine]\nmax_tokens_per_shard = {baked_shard + 1}\n[governor]\nthreshold = 0.99\n"
        make_plan(_config(tmp_path, raised), bundle, cpu_only)
    assert len(info.value.problems) == 2
    assert any("engine.max_tokens_per_shard" in p and "may only lower it" in p for p in info.value.problems)
    assert any("governor.threshold = 0.99" in p for p in info.value.problems)


def test_defaults_take_the_baked_values(bundle: firmware.Bundle, tmp_path: Path) -> None:
    plan = make_plan(_config(tmp_path), bundle, HostFacts(("cpu",), "none"))
    assert plan.engine.max_tokens_per_shard == bundle.layer.max_tokens_per_shard
    assert plan.governor.threshold == bundle.layer.fallback_cpu_threshold
    assert plan.devices == ("cpu",) and plan.gpu_device is None and plan.cuda_options is None
    assert plan.notes and "CPU only" in plan.notes[0]


def _cuda_target(bundle: firmware.Bundle) -> firmware.Bundle:
    """The same bundle as if it had been built with --target cuda."""
    manifest = dataclasses.replace(bundle.manifest, source={**bundle.manifest.source, "target": "cuda"})
    return dataclasses.replace(bundle, manifest=manifest)


def test_a_cpu_graph_is_not_run_on_a_gpu(bundle: firmware.Bundle, tmp_path: Path) -> None:
    assert bundle.manifest.source["target"] == "cpu"
    plan = make_plan(_config(tmp_path), bundle, HostFacts(("cpu", "cuda:0"), "nvml", gpu_memory=80 << 30))
    assert plan.devices == ("cpu",) and plan.gpu_device is None and plan.cuda_options is None
    assert plan.notes == ("the firmware has no CUDA graph (built for target cpu): serving on the CPU; build it "
                          "with --cuda-graph to use cuda:0",)  # fmt: skip


def test_a_gpu_host_runs_the_gpu_first_with_its_arena_and_kv_pool_within_the_threshold(
        bundle: firmware.Bundle, tmp_path: Path) -> None:  # fmt: skip
    from appliance.plan import memory_need

    bundle = _cuda_target(bundle)
    plan = make_plan(_config(tmp_path, "[governor]\nthreshold = 0.5\n"), bundle,
                     HostFacts(("cpu", "cuda:0"), "nvml", gpu_memory=80 << 30))  # fmt: skip
    assert plan.devices == ("cuda:0", "cpu") and plan.gpu_device == "cuda:0" and plan.cpu_device == "cpu"
    kv = memory_need(bundle, plan.engine, "cuda:0").kv  # allocated by the IO binding, outside the arena
    assert kv > 0 and plan.cuda_options is not None and plan.cuda_options["gpu_mem_limit"] == str((40 << 30) - kv)
    assert plan.governor.policy == "cpu" and not plan.notes


def test_jetson_sheds_instead_of_moving_work_to_the_cpu(bundle: firmware.Bundle, tmp_path: Path) -> None:
    bundle = _cuda_target(bundle)
    plan = make_plan(_config(tmp_path), bundle, HostFacts(("cpu", "cuda:0"), "jetson", gpu_memory=8 << 30))
    assert plan.governor.policy == "shed"
    cpu = make_plan(_config(tmp_path, '[governor]\npolicy = "cpu"\n'), bundle,
                    HostFacts(("cpu", "cuda:0"), "jetson", gpu_memory=8 << 30))  # fmt: skip
    assert cpu.governor.policy == "cpu"


def test_memory_need_counts_weights_the_kv_budget_and_the_prefix_pool(bundle: firmware.Bundle, tmp_path: Path) -> None:
    from appliance.plan import memory_need

    f = bundle.model
    per_position = 2 * f.num_layers * f.num_kv_heads * f.head_size * 4  # an fp32 KV cache on the CPU
    plan = make_plan(_config(tmp_path, "[limits]\nmax_active_per_device = 3\n"), bundle, HostFacts(("cpu",), "none"))
    need = memory_need(bundle, plan.engine)
    assert need.kv == 3 * f.context_length * per_position  # every slot at the full context
    files = sum(e.size for e in bundle.manifest.files.values())
    assert need.weights == files * sessions_on(plan.engine, "cpu")
    assert need.on("cpu") == need.weights + need.kv + (256 << 20)  # the default prefix pool is host memory
    for threads, sessions in ((1, 1), (2, 2), (3, 3), (4, 3)):  # the halves: one 1-thread session, or two
        split = make_plan(_config(tmp_path, f"[engine]\nthreads = {threads}\n"), bundle, HostFacts(("cpu",), "none"))
        assert memory_need(bundle, split.engine).weights == files * sessions
        assert memory_need(bundle, split.engine, "cuda:0").weights == files  # a GPU session has no lane
    alone = make_plan(_config(tmp_path, "[engine]\nthreads = 4\nprefill_lane = false\n"), bundle,
                      HostFacts(("cpu",), "none"))  # fmt: skip
    assert memory_need(bundle, alone.engine).weights == files
    capped = make_plan(_config(tmp_path, "[engine]\nkv_cache_mb = 1\nprefix_cache_mb = 0\n"), bundle,
                       HostFacts(("cpu",), "none"))  # fmt: skip
    assert memory_need(bundle, capped.engine).kv == (1 << 20) // per_position * per_position
    assert memory_need(bundle, capped.engine, "cuda:0").kv == (1 << 20) // (per_position // 2) * (per_position // 2)


def test_bundles_that_do_not_fit_together_are_refused_naming_each_and_what_it_needs(
        bundle: firmware.Bundle, tmp_path: Path) -> None:  # fmt: skip
    from appliance.plan import memory_need, plan_models

    config = _config(tmp_path, "[engine]\nprefix_cache_mb = 0\n")
    one = memory_need(bundle, make_plan(config, bundle, HostFacts(("cpu",), "none")).engine).on("cpu")
    roomy = HostFacts(("cpu",), "none", host_memory=2 * one)
    plans, governor = plan_models(config, {"a": bundle, "b": bundle}, roomy)
    assert set(plans) == {"a", "b"} and governor.threshold == bundle.layer.fallback_cpu_threshold
    with pytest.raises(ConfigError) as info:
        plan_models(config, {"a": bundle, "b": bundle, "c": bundle}, roomy)
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith("firmware 'c' does not fit on cpu")
    assert f"of {2 * one / (1 << 20):,.0f} MiB available host memory" in info.value.problems[0]
    laned = _config(tmp_path, "[engine]\nprefix_cache_mb = 0\nthreads = 2\n")  # the weights in 2 sessions
    with pytest.raises(ConfigError) as info:
        plan_models(laned, {"a": bundle, "b": bundle, "c": bundle}, roomy)
    assert "in 2 sessions" in info.value.problems[-1] and "engine.prefill_lane = false" in info.value.problems[-1]
    # A GPU's budget is its memory up to the governor's threshold, less what kept engines hold.
    gpu = HostFacts(("cpu", "cuda:0"), "nvml", gpu_memory=10 << 30, host_memory=1 << 40)
    cuda = _cuda_target(bundle)
    need = memory_need(cuda, make_plan(config, cuda, gpu).engine, "cuda:0").on("cuda:0")
    held = int((10 << 30) * cuda.layer.fallback_cpu_threshold) - need + 1
    plans, _ = plan_models(config, {"a": cuda}, gpu, gpu_held=held - 1)
    assert plans["a"].gpu_device == "cuda:0"
    with pytest.raises(ConfigError, match="'a' does not fit on cuda:0"):
        plan_models(config, {"a": cuda}, gpu, gpu_held=held)
