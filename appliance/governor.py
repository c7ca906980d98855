"""The device governor: samples device memory in the background and places each new request on
the GPU or the CPU, with hysteresis, so a box that runs short of GPU memory keeps serving.

Probes share one interface (`read() -> list[MemoryReading]`): NVML on discrete GPUs, /proc/meminfo
on Jetson (its GPU shares system memory), none on CPU-only machines. Placement is a pure state
machine over the latest reading; nothing on the request path waits for a probe.

What is compared with the threshold is the pressure, not NVML's "used": neither ONNX Runtime's
arena nor the KV buffers give memory back, so "used" counts our cached-but-free blocks, and once
over the threshold placement would stay on the CPU until a restart (a latch). Where NVML says what
this process holds, the pressure is the other processes' use plus what our engines may hold
(`reserved`: their weights and KV pool, fixed at start), so it moves only with the others.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryReading:
    device: str  # "cuda:0", or "jetson:0" for shared memory
    used: int
    total: int
    own: int | None = None  # what this process holds there (NVML's process list); None: not known

    @property
    def ratio(self) -> float:
        return self.used / self.total if self.total else 0.0

    def pressure(self, reserved: int) -> float:
        """The share of the device that other processes use plus what ours may hold (`reserved`);
        NVML's plain ratio where this process's share is not known (Jetson) or nothing is reserved."""
        if self.own is None or reserved <= 0 or not self.total:
            return self.ratio
        return (max(0, self.used - self.own) + reserved) / self.total


class MemoryProbe(Protocol):
    kind: str

    def read(self) -> list[MemoryReading]: ...


class NoGpuProbe:
    kind = "none"

    def read(self) -> list[MemoryReading]:
        return []


def cuda_to_nvml(visible: str | None, uuids: list[str]) -> list[int]:
    """NVML's index for each CUDA ordinal. NVML numbers GPUs in PCI bus order and ignores
    CUDA_VISIBLE_DEVICES; CUDA numbers the visible ones, in PCI bus order once CUDA_DEVICE_ORDER is
    PCI_BUS_ID (the daemon sets it before CUDA starts; CUDA's own default puts the fastest first).
    `uuids`: NVML's GPU UUIDs by index. An entry that names no GPU ends the list, as it ends CUDA's."""
    if visible is None:
        return list(range(len(uuids)))
    out: list[int] = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit():
            index = int(entry)
            if index >= len(uuids):
                break
        else:  # a UUID, or a unique prefix of one ("GPU-5b3e"); MIG instances are not mapped
            found = [i for i, uuid in enumerate(uuids) if entry and uuid.startswith(entry)]
            if len(found) != 1:
                break
            index = found[0]
        if index in out:
            break
        out.append(index)
    return out


class NvmlProbe:
    """Used/total per GPU through nvidia-ml-py, named by the CUDA ordinal the engine uses."""

    kind = "nvml"

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()  # raises NVMLError_LibraryNotFound where there is no driver
        self._nvml = pynvml
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        uuids = [str(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        self._handles = [handles[i] for i in cuda_to_nvml(os.environ.get("CUDA_VISIBLE_DEVICES"), uuids)]

    def read(self) -> list[MemoryReading]:
        out = []
        for ordinal, h in enumerate(self._handles):
            info = self._nvml.nvmlDeviceGetMemoryInfo(h)
            out.append(MemoryReading(f"cuda:{ordinal}", int(info.used), int(info.total), self._own(h)))
        return out

    def _own(self, handle: object) -> int | None:
        """What this process holds on the GPU, or None where NVML will not say (no permission,
        a container's PID namespace hiding us, a MIG instance)."""
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:  # pynvml raises NVMLError_* subclasses
            return None
        mine = [p for p in processes if p.pid == os.getpid()]
        if not mine or any(p.usedGpuMemory is None for p in mine):
            return None
        return sum(int(p.usedGpuMemory) for p in mine)


class JetsonProbe:
    """Jetson's GPU allocates from system memory: MemTotal - MemAvailable is what it competes for."""

    kind = "jetson"

    def __init__(self, root: Path = Path("/")) -> None:
        self.meminfo = root / "proc" / "meminfo"

    def read(self) -> list[MemoryReading]:
        fields = {}
        for line in self.meminfo.read_text().splitlines():
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[name] = int(parts[0]) * 1024
        total, available = fields.get("MemTotal", 0), fields.get("MemAvailable", 0)
        return [MemoryReading("cuda:0", total - available, total)]


def is_jetson(root: Path = Path("/")) -> bool:
    compatible = root / "proc" / "device-tree" / "compatible"
    try:
        if b"nvidia,tegra" in compatible.read_bytes():
            return True
    except OSError:
        pass
    return (root / "etc" / "nv_tegra_release").exists()


def detect_probe(root: Path = Path("/")) -> MemoryProbe:
    """Jetson, else NVML, else none; said once in the log."""
    if is_jetson(root):
        log.info("Jetson detected: GPU memory is shared system memory, read from /proc/meminfo")
        return JetsonProbe(root)
    try:
        probe = NvmlProbe()
    except Exception as exc:  # pynvml raises NVMLError_* subclasses, and ImportError without the package
        log.info("no GPU: NVML unavailable (%s); serving on the CPU", type(exc).__name__)
        return NoGpuProbe()
    log.info("NVML: %d GPU(s)", len(probe.read()))
    return probe


class Hysteresis:
    """Over once the ratio reaches `threshold`; back only below `threshold - margin`: no flapping."""

    def __init__(self, threshold: float, margin: float) -> None:
        self.threshold, self.margin = threshold, margin
        self.over = False

    def update(self, ratio: float) -> bool:
        if not self.over and ratio >= self.threshold:
            self.over = True
        elif self.over and ratio < self.threshold - self.margin:
            self.over = False
        return self.over


@dataclass(frozen=True)
class GovernorConfig:
    threshold: float  # the firmware's fallback_cpu_threshold, or lower from config
    hysteresis: float = 0.05
    interval: float = 0.1
    policy: str = "cpu"  # "cpu": move new requests to the CPU; "shed": make them wait


class Governor:
    def __init__(self, probe: MemoryProbe, config: GovernorConfig, gpu_device: str | None,
                 cpu_device: str = "cpu", on_reading: Callable[[MemoryReading], None] | None = None,
                 on_fallback: Callable[[], None] | None = None) -> None:  # fmt: skip
        self.probe = probe
        self.config = config
        self.gpu_device = gpu_device
        self.cpu_device = cpu_device
        self.state = Hysteresis(config.threshold, config.hysteresis)
        self.latest: MemoryReading | None = None
        self.reserved = 0  # bytes our engines may hold on the GPU: weights and KV pools (set by the daemon)
        self._on_reading = on_reading
        self._on_fallback = on_fallback

    def sample(self) -> None:
        """One reading of the GPU that serves; updates the placement state."""
        readings = self.probe.read()
        reading = next((r for r in readings if r.device == self.gpu_device), readings[0] if readings else None)
        if reading is None:
            return
        was_over = self.state.over
        pressure = reading.pressure(self.reserved)
        over = self.state.update(pressure)
        self.latest = reading
        if self._on_reading:
            self._on_reading(reading)
        if over != was_over:
            verb = "above" if over else "back below"
            action = ("new requests go to the CPU" if self.config.policy == "cpu" else "new requests wait")
            log.warning("%s memory pressure %.0f%% is %s the threshold %.0f%%: %s", reading.device, pressure * 100,
                        verb, self.config.threshold * 100, action if over else "new requests use the GPU")  # fmt: skip

    async def run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.sample)
            except Exception:  # a failing probe must not end sampling; say why and keep going
                log.exception("memory probe %s failed", self.probe.kind)
            await asyncio.sleep(self.config.interval)

    def reconfigure(self, config: GovernorConfig) -> None:
        """New thresholds (a reload); the current over/under state carries over."""
        over = self.state.over
        self.config = config
        self.state = Hysteresis(config.threshold, config.hysteresis)
        self.state.over = over

    def place_preview(self) -> str:
        """Where a new request would go now, without counting it."""
        if self.gpu_device is None or (self.state.over and self.config.policy == "cpu"):
            return self.cpu_device
        return self.gpu_device + (" (shedding: new requests wait)" if self.shedding else "")

    def admits(self, device: str) -> bool:
        """Whether new requests for `device` may start now (under `shed`, the GPU's wait)."""
        return not (self.shedding and device == self.gpu_device)

    def snapshot(self) -> dict[str, object]:
        """Where new requests go and why, for `zerolayer status`."""
        return {"probe": self.probe.kind, "now": self.place_preview(), "threshold": self.config.threshold,
                "hysteresis": self.config.hysteresis, "policy": self.config.policy, "state": self.describe()}

    @property
    def shedding(self) -> bool:
        return self.gpu_device is not None and self.config.policy == "shed" and self.state.over

    def place(self) -> str:
        """The device for a new request (under `shed`, the GPU: its queue holds the request)."""
        if self.gpu_device is None:
            return self.cpu_device
        if self.state.over and self.config.policy == "cpu":
            if self._on_fallback:
                self._on_fallback()
            return self.cpu_device
        return self.gpu_device

    def describe(self) -> str:
        r = self.latest
        if r is None:
            return "no GPU reading"
        pressure = r.pressure(self.reserved)
        ours = "" if pressure == r.ratio else f", pressure {pressure:.0%} (others' use + ours reserved)"
        return (f"{r.device} memory {r.used / 2**30:.1f}/{r.total / 2**30:.1f} GiB ({r.ratio:.0%}){ours}, "
                f"threshold {self.config.threshold:.0%}, {'over' if self.state.over else 'under'}")  # fmt: skip


def available_host_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Bytes the kernel could give a new allocation without swapping (MemAvailable), or None."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cuda_memory_limit(total_bytes: int, threshold: float, kv_bytes: int = 0, share: int = 1) -> int:
    """A GPU session's arena cap: its share of the memory under the fallback threshold, less the KV
    pool, which the IO binding allocates outside the arena. Arena and pool together then stay
    within the budget, so the engine runs out of memory (and continues on the CPU) only past it."""
    return int(total_bytes * threshold) // max(1, share) - kv_bytes


# How running out of device memory reads at ONNX Runtime's run boundary: its arena, the CUDA
# runtime (error 2 is cudaErrorMemoryAllocation), cuBLAS and cuDNN workspaces, and the host side.
_ALLOCATION_FAILURES = (
    "failed to allocate memory", "out of memory", "bfcarena", "cudaerrormemoryallocation",
    "cuda failure 2:", "cublas_status_alloc_failed", "cudnn_status_alloc_failed", "std::bad_alloc",
    "available memory of", "memory allocation failed",
)  # fmt: skip


def is_allocation_failure(exc: BaseException) -> bool:
    """ONNX Runtime's out-of-memory, as it surfaces at the run boundary."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return any(sign in text for sign in _ALLOCATION_FAILURES)
