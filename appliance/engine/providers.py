"""Which ONNX Runtime execution providers a device gets, and proof, once the session exists, that
it got them.

ONNX Runtime does not fail when a provider cannot load: it logs an error and builds the session
from the providers that are left, without the options we gave the lost one. The PyPI
onnxruntime-gpu wheel lists TensorRT whether or not libnvinfer is installed; a CUDA session
without the CUDA libraries quietly runs on the CPU; and a rebuilt session forgets `device_id`
(cuda:1 on GPU 0) and `gpu_mem_limit`. So TensorRT is used only when asked for and loadable,
CUDA is proven usable before a device is offered, and every session is checked after it is
made: what we asked for is what we got, or the daemon does not start.
"""

from __future__ import annotations

import ctypes.util
import logging
import os
from typing import Any

import onnxruntime as ort

from appliance.engine.errors import ProviderError

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
CPU = "CPUExecutionProvider"
Providers = list[str | tuple[str, dict[str, str]]]


def tensorrt_loadable() -> bool:
    return ctypes.util.find_library("nvinfer") is not None


def providers_for(device: str, cuda_options: dict[str, str] | None = None, tensorrt: bool = False) -> Providers:
    """The providers for 'cpu', 'cpu:N' (another CPU session) or 'cuda:N'. The CPU provider comes
    last on a GPU: nodes no GPU kernel takes run there (placement is logged, see verify)."""
    if device == "cpu" or device.startswith("cpu:"):
        return [CPU]
    if not device.startswith("cuda"):
        raise ValueError(f"unknown device {device!r}: use 'cpu' or 'cuda:N'")
    index = device.partition(":")[2] or "0"
    if not index.isdigit():
        raise ValueError(f"unknown device {device!r}: use 'cpu' or 'cuda:N'")
    providers: Providers = [(CUDA, {**(cuda_options or {}), "device_id": index}), CPU]
    if tensorrt:
        if not tensorrt_loadable():
            raise ProviderError(f"{device}: TensorRT was asked for (engine.tensorrt) but libnvinfer is not "
                                "installed; install TensorRT or set engine.tensorrt = false")  # fmt: skip
        providers.insert(0, (TENSORRT, {"device_id": index, "trt_engine_cache_enable": "True"}))
    return providers


def verify(session: Any, device: str, asked: Providers) -> None:
    """Refuse a session that lost a provider, or the options we gave one, on the way."""
    got = list(session.get_providers())
    wanted = [p if isinstance(p, str) else p[0] for p in asked]
    if got[: len(wanted)] != wanted:
        missing = [p for p in wanted if p not in got]
        why = f"{', '.join(missing)} did not load" if missing else f"the order is {', '.join(got)}"
        raise ProviderError(f"{device}: asked ONNX Runtime for {', '.join(wanted)} and got {', '.join(got)}: "
                            f"{why} (onnxruntime {ort.__version__}; see its log for the reason)")  # fmt: skip
    options = session.get_provider_options()
    for entry in asked:
        if isinstance(entry, str):
            continue
        name, sent = entry
        kept = options.get(name, {})
        lost = {k: v for k, v in sent.items() if str(kept.get(k)) != str(v)}
        if lost:
            shown = ", ".join(f"{k}={v!r} (now {kept.get(k)!r})" for k, v in sorted(lost.items()))
            raise ProviderError(f"{device}: {name} is running without the options it was given: {shown}")


def usable_cuda_devices() -> list[str]:
    """'cuda:N' for each GPU a CUDA session can really be made on: the provider being listed is not
    enough (the wheel lists it without the CUDA libraries). Loads the CUDA libraries that the
    nvidia-* wheels install, where this ONNX Runtime can (onnxruntime.preload_dlls)."""
    if CUDA not in ort.get_available_providers():
        return []
    # CUDA's ordinals in PCI bus order, as NVML numbers GPUs: the governor reads the GPU it places on.
    order = os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if order != "PCI_BUS_ID":
        log.warning("CUDA_DEVICE_ORDER=%s: GPU memory readings may name another GPU than cuda:N", order)
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception as exc:  # a missing library is reported by the probe below, with ORT's reason
            log.debug("onnxruntime.preload_dlls: %s", exc)
    try:
        session = ort.InferenceSession(_probe_model(), providers=[(CUDA, {"device_id": "0"}), CPU])
        verify(session, "cuda:0", [(CUDA, {"device_id": "0"}), CPU])
    except (ProviderError, RuntimeError, ValueError) as exc:
        log.warning("the CUDA provider is listed but unusable, serving on the CPU only: %s", exc)
        return []
    return ["cuda:0"]


def _probe_model() -> bytes:
    """A one-node model (Identity), enough to make a session on a provider."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)  # any ORT reads IR 8
    return bytes(model.SerializeToString())
