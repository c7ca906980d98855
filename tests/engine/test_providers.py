"""Execution providers: the ones a device asks for, and the refusal when ONNX Runtime drops one or
its options (with this machine's real onnxruntime, which has no CUDA provider: exactly the silent
fallback a GPU box without its CUDA libraries would see)."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import pytest

import firmware
from appliance.engine import ModelSession
from appliance.engine.errors import ProviderError
from appliance.engine.providers import (
    CPU,
    CUDA,
    TENSORRT,
    _probe_model,
    providers_for,
    tensorrt_loadable,
    usable_cuda_devices,
    verify,
)


def test_a_gpu_gets_cuda_with_its_options_and_tensorrt_only_when_asked() -> None:
    assert providers_for("cpu") == [CPU] and providers_for("cpu:1") == [CPU]
    limits = {"gpu_mem_limit": str(8 << 30), "arena_extend_strategy": "kSameAsRequested"}
    assert providers_for("cuda:1", limits) == [(CUDA, {**limits, "device_id": "1"}), CPU]
    assert providers_for("cuda", None) == [(CUDA, {"device_id": "0"}), CPU]
    assert all(p[0] != TENSORRT for p in providers_for("cuda:0", limits) if isinstance(p, tuple))
    if not tensorrt_loadable():  # this machine: asking for TensorRT is refused, not ignored
        with pytest.raises(ProviderError, match="libnvinfer is not installed"):
            providers_for("cuda:0", limits, tensorrt=True)
    for bad in ("gpu", "cuda:x"):
        with pytest.raises(ValueError, match="use 'cpu' or 'cuda:N'"):
            providers_for(bad)


def test_a_session_that_lost_its_provider_is_refused(tiny_bundle_path: Path, trusted_keys: Path) -> None:
    assert CUDA not in ort.get_available_providers()  # what a box without the CUDA libraries sees
    bundle = firmware.load(tiny_bundle_path, trusted_keys)
    for device in ("cuda:0", "cuda:1"):
        with pytest.raises(ProviderError, match=f"{device}: asked ONNX Runtime for CUDAExecutionProvider, "
                                                "CPUExecutionProvider and got CPUExecutionProvider: "
                                                "CUDAExecutionProvider did not load"):  # fmt: skip
            ModelSession(bundle, device)
    assert usable_cuda_devices() == []  # and such a device is never offered


def test_a_session_that_lost_its_options_is_refused() -> None:
    asked = [(CPU, {"arena_extend_strategy": "kSameAsRequested"})]  # ORT keeps no CPU provider options
    session = ort.InferenceSession(_probe_model(), providers=asked)  # type: ignore[arg-type]
    with pytest.raises(ProviderError, match="running without the options it was given: arena_extend_strategy="):
        verify(session, "cpu", asked)  # type: ignore[arg-type]
    verify(ort.InferenceSession(_probe_model(), providers=[CPU]), "cpu", [CPU])  # asked for, got


def test_the_pool_spins_within_a_run_but_not_between_runs(tiny_bundle_path: Path, trusted_keys: Path) -> None:
    # Between runs the worker's Python, the event loop and the clients need the cores.
    session = ModelSession(firmware.load(tiny_bundle_path, trusted_keys), intra_op_threads=2)
    options = session.session.get_session_options()
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    with pytest.raises(RuntimeError, match="does not have configuration"):  # spinning itself: ORT's default, on
        options.get_session_config_entry("session.intra_op.allow_spinning")
