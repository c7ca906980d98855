"""The daemon's plan, pure: config + verified bundle + host facts -> what gets built, every baked
constant's rule in one place."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import firmware
from appliance.config import ConfigError, load_config
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
    assert plan.notes == ("the firmware was built for target cpu, not cuda: serving on the CPU; build it with "
                          "--target cuda to use cuda:0",)  # fmt: skip


def test_a_gpu_host_runs_the_gpu_first_with_its_arena_capped_at_the_threshold(bundle: firmware.Bundle,
                                                                                tmp_path: Path) -> None:  # fmt: skip
    bundle = _cuda_target(bundle)
    plan = make_plan(_config(tmp_path, "[governor]\nthreshold = 0.5\n"), bundle,
                     HostFacts(("cpu", "cuda:0"), "nvml", gpu_memory=80 << 30))  # fmt: skip
    assert plan.devices == ("cuda:0", "cpu") and plan.gpu_device == "cuda:0" and plan.cpu_device == "cpu"
    assert plan.cuda_options is not None and plan.cuda_options["gpu_mem_limit"] == str(40 << 30)
    assert plan.governor.policy == "cpu" and not plan.notes


def test_jetson_sheds_instead_of_moving_work_to_the_cpu(bundle: firmware.Bundle, tmp_path: Path) -> None:
    bundle = _cuda_target(bundle)
    plan = make_plan(_config(tmp_path), bundle, HostFacts(("cpu", "cuda:0"), "jetson", gpu_memory=8 << 30))
    assert plan.governor.policy == "shed"
    cpu = make_plan(_config(tmp_path, '[governor]\npolicy = "cpu"\n'), bundle,
                    HostFacts(("cpu", "cuda:0"), "jetson", gpu_memory=8 << 30))  # fmt: skip
    assert cpu.governor.policy == "cpu"
