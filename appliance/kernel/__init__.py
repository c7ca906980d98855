"""Zerolayer's kernel layer: the eBPF flow table and allowlist (bpf/zerolayer.bpf.c), loaded
through libbpf and attached with pyroute2, with a userspace stand-in of the same interface."""

from appliance.kernel.libbpf import BpfError
from appliance.kernel.loader import (
    FlowLayer,
    FlowRecord,
    KernelLayer,
    KernelLayerError,
    UserspaceFlows,
    build_object,
    ensure_bpffs,
    open_kernel_layer,
    pin_dir,
    resolve_interfaces,
)
from appliance.kernel.maps import FLOW_DIGESTS, FlowKey, FlowValue, LpmKey

__all__ = [
    "FLOW_DIGESTS",
    "BpfError",
    "FlowKey",
    "FlowLayer",
    "FlowRecord",
    "FlowValue",
    "KernelLayer",
    "KernelLayerError",
    "LpmKey",
    "UserspaceFlows",
    "build_object",
    "ensure_bpffs",
    "open_kernel_layer",
    "pin_dir",
    "resolve_interfaces",
]
