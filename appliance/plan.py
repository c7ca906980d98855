"""What the daemon builds, decided once: the config, the verified bundle and the host's facts in,
a frozen plan out. Pure (no I/O), so every rule about the firmware's baked constants lives here,
each with its error, and a bad combination is refused before anything is built."""

from __future__ import annotations

from dataclasses import dataclass

import firmware
from appliance.api import ApiSettings, KeyStore
from appliance.config import Config, ConfigError
from appliance.engine import EngineConfig
from appliance.governor import GovernorConfig, cuda_memory_limit


@dataclass(frozen=True)
class HostFacts:
    """What the daemon found on this machine before planning."""

    devices: tuple[str, ...]  # what this onnxruntime can run on: "cpu", and "cuda:0" with the CUDA provider
    probe: str  # the memory probe: "nvml", "jetson" or "none"
    gpu_memory: int | None = None  # bytes of the first GPU the probe reads (None: no reading)


@dataclass(frozen=True)
class Plan:
    engine: EngineConfig
    devices: tuple[str, ...]  # sessions to build, the GPU first when there is one
    cuda_options: dict[str, str] | None
    governor: GovernorConfig
    gpu_device: str | None
    cpu_device: str
    notes: tuple[str, ...]  # what the operator should be told once at start


def governor_config(config: Config, bundle: firmware.Bundle, probe: str) -> GovernorConfig:
    """The governor's settings; config may lower the firmware's fallback threshold, never raise it."""
    baked = bundle.layer.fallback_cpu_threshold
    threshold = config.governor.threshold or baked
    if threshold > baked:
        where = config.sources.get("governor.threshold", "default")
        raise ConfigError([f"{where}: governor.threshold = {threshold} exceeds the firmware's baked "
                           f"fallback_cpu_threshold {baked}; config may only lower it"])  # fmt: skip
    policy = config.governor.policy
    if policy == "auto":  # on Jetson the CPU shares the GPU's memory: moving work there frees nothing
        policy = "shed" if probe == "jetson" else "cpu"
    return GovernorConfig(threshold, config.governor.hysteresis, config.governor.interval_ms / 1000, policy)


def engine_config(config: Config, bundle: firmware.Bundle) -> EngineConfig:
    """The engine's settings; config may lower the firmware's shard size, never raise it."""
    baked = bundle.layer.max_tokens_per_shard
    shard = config.engine.max_tokens_per_shard
    if shard > baked:
        where = config.sources.get("engine.max_tokens_per_shard", "default")
        raise ConfigError([f"{where}: engine.max_tokens_per_shard = {shard} exceeds the firmware's baked "
                           f"{baked}; config may only lower it"])  # fmt: skip
    return EngineConfig(
        max_tokens_per_shard=shard or baked,
        prefix_cache_bytes=config.engine.prefix_cache_mb << 20,
        max_active_per_device=config.limits.max_active_per_device,
        kv_cache_bytes=config.engine.kv_cache_mb << 20,
        max_queued=config.limits.max_queued,
        intra_op_threads=config.engine.threads,
        tensorrt=config.engine.tensorrt,
    )


def api_settings(config: Config, keys: KeyStore) -> ApiSettings:
    """What the app may change live: built at start and again on every reload."""
    return ApiSettings(keys=keys, auth_required=config.auth.required, max_body_bytes=config.limits.max_body_bytes,
                       metrics_require_auth=config.metrics.require_auth)  # fmt: skip


def make_plan(config: Config, bundle: firmware.Bundle, host: HostFacts) -> Plan:
    """Every problem at once, as one ConfigError naming each file:key."""
    problems: list[str] = []
    engine = governor = None
    try:
        engine = engine_config(config, bundle)
    except ConfigError as exc:
        problems += exc.problems
    try:
        governor = governor_config(config, bundle, host.probe)
    except ConfigError as exc:
        problems += exc.problems
    if problems or engine is None or governor is None:
        raise ConfigError(problems)
    notes = []
    devices = tuple(sorted(host.devices, key=lambda d: d == "cpu"))  # GPU first when there is one
    target = bundle.manifest.source.get("target", "cpu")
    if target != "cuda" and any(d != "cpu" for d in devices):
        # A CPU graph on a GPU runs attention on the CPU provider (CUDA's GroupQueryAttention takes
        # fp16/bf16 only) with the KV cache copied across every step: slower than the CPU alone.
        notes.append(f"the firmware was built for target {target}, not cuda: serving on the CPU; build it with "
                     f"--target cuda to use {', '.join(d for d in devices if d != 'cpu')}")  # fmt: skip
        devices = ("cpu",)
    gpu = next((d for d in devices if d != "cpu"), None)
    if gpu is None and not notes:
        notes.append("no GPU execution provider in this onnxruntime build: serving on the CPU only")
        if host.gpu_memory is not None:
            notes.append(f"{host.probe} reports GPU memory but this onnxruntime has no GPU provider: CPU only")
    cuda_options = None
    if gpu is not None and host.gpu_memory is not None:  # the arena may not grow past the threshold
        cuda_options = {"gpu_mem_limit": str(cuda_memory_limit(host.gpu_memory, governor.threshold)),
                        "arena_extend_strategy": "kSameAsRequested"}  # fmt: skip
    return Plan(engine, devices, cuda_options, governor, gpu, "cpu" if "cpu" in devices else devices[-1],
                tuple(notes))  # fmt: skip
