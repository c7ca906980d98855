"""What the daemon builds, decided once: the config, the verified bundle and the host's facts in,
a frozen plan out. Pure (no I/O), so every rule about the firmware's baked constants lives here,
each with its error, and a bad combination is refused before anything is built."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import firmware
from appliance.api import ApiSettings, KeyStore
from appliance.config import Config, ConfigError
from appliance.engine import EngineConfig
from appliance.engine.engine import config_for, kv_positions, sessions_on
from appliance.engine.session import StateSpec
from appliance.governor import GovernorConfig, cuda_memory_limit
from firmware.bundle import CUDA_GRAPH_DIR


@dataclass(frozen=True)
class HostFacts:
    """What the daemon found on this machine before planning."""

    devices: tuple[str, ...]  # what this onnxruntime can run on: "cpu", and "cuda:0" with the CUDA provider
    probe: str  # the memory probe: "nvml", "jetson" or "none"
    gpu_memory: int | None = None  # bytes of the first GPU the probe reads (None: no reading)
    host_memory: int | None = None  # bytes the kernel says are available now (MemAvailable; None: unknown)


@dataclass(frozen=True)
class Plan:
    engine: EngineConfig
    devices: tuple[str, ...]  # sessions to build, the GPU first when there is one
    cuda_options: dict[str, str] | None
    governor: GovernorConfig
    gpu_device: str | None
    cpu_device: str
    notes: tuple[str, ...]  # what the operator should be told once at start


def governor_config(config: Config, bundles: Sequence[firmware.Bundle], probe: str) -> GovernorConfig:
    """The governor's settings; config may lower the firmware's fallback threshold, never raise it.
    Serving several bundles, the lowest baked threshold is the one every bundle can live with."""
    baked = min(b.layer.fallback_cpu_threshold for b in bundles)
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
        prefill_lane=config.engine.prefill_lane,
    )


def api_settings(config: Config, keys: KeyStore) -> ApiSettings:
    """What the app may change live: built at start and again on every reload."""
    return ApiSettings(keys=keys, auth_required=config.auth.required, max_body_bytes=config.limits.max_body_bytes,
                       metrics_require_auth=config.metrics.require_auth)  # fmt: skip


def make_plan(config: Config, bundle: firmware.Bundle, host: HostFacts, gpu_share: int = 1) -> Plan:
    """Every problem at once, as one ConfigError naming each file:key. `gpu_share`: how many
    bundles' sessions share the GPU's budget (each arena gets that share of it)."""
    problems: list[str] = []
    engine = governor = None
    try:
        engine = engine_config(config, bundle)
    except ConfigError as exc:
        problems += exc.problems
    try:
        governor = governor_config(config, [bundle], host.probe)
    except ConfigError as exc:
        problems += exc.problems
    if problems or engine is None or governor is None:
        raise ConfigError(problems)
    notes = []
    devices = tuple(sorted(host.devices, key=lambda d: d == "cpu"))  # GPU first when there is one
    target = bundle.root_target
    if "cuda" not in bundle.targets and any(d != "cpu" for d in devices):
        # A CPU graph on a GPU runs attention on the CPU provider (CUDA's GroupQueryAttention takes
        # fp16/bf16 only) with the KV cache copied across every step: slower than the CPU alone.
        notes.append(f"the firmware has no CUDA graph (built for target {target}): serving on the CPU; build it "
                     f"with --cuda-graph to use {', '.join(d for d in devices if d != 'cpu')}")  # fmt: skip
        devices = ("cpu",)
    gpu = next((d for d in devices if d != "cpu"), None)
    if gpu is None and not notes:
        notes.append("no GPU execution provider in this onnxruntime build: serving on the CPU only")
        if host.gpu_memory is not None:
            notes.append(f"{host.probe} reports GPU memory but this onnxruntime has no GPU provider: CPU only")
    cuda_options = None
    if gpu is not None and host.gpu_memory is not None:  # arena and KV pool within the threshold's budget
        kv = memory_need(bundle, engine, gpu).kv
        limit = cuda_memory_limit(host.gpu_memory, governor.threshold, kv, gpu_share)
        cuda_options = {"gpu_mem_limit": str(limit), "arena_extend_strategy": "kSameAsRequested"}
    return Plan(engine, devices, cuda_options, governor, gpu, "cpu" if "cpu" in devices else devices[-1],
                tuple(notes))  # fmt: skip


@dataclass(frozen=True)
class MemoryNeed:
    """The most memory one bundle's engine can hold on each kind of device, in bytes: its files
    (weights) once per session on every device it runs on (a CPU with a prefill lane has two or
    three), its KV budget per device, and the prefix pool (host memory)."""

    weights: int
    kv: int
    prefix: int

    def on(self, device: str) -> int:
        return self.weights + self.kv + (self.prefix if device == "cpu" else 0)


def memory_need(bundle: firmware.Bundle, engine: EngineConfig, device: str = "cpu") -> MemoryNeed:
    engine = config_for(bundle, engine)
    graph_dir, f = bundle.graph("cuda" if device != "cpu" else "cpu")
    # CUDA graphs keep their KV in fp16; the CPU graphs (int8 and fp32) in fp32.
    itemsize = 2 if device != "cpu" or bundle.manifest.source.get("precision") in ("fp16", "bf16") else 4
    path = graph_dir / f.onnx_file
    stat = path.stat()
    kv_elements, state_bytes = graph_caches(str(path), (stat.st_size, stat.st_mtime_ns), f)
    per_position = 2 * kv_elements * itemsize
    kv = kv_positions(engine, f.context_length, per_position) * per_position
    kv += engine.max_active_per_device * state_bytes  # a hybrid model's states: a fixed size per slot
    # The files of the graph the device runs: those in cuda/ where it runs that one, the others elsewhere.
    in_cuda_dir = graph_dir != bundle.root
    files = sum(entry.size for rel, entry in bundle.manifest.files.items()
                if rel.startswith(f"{CUDA_GRAPH_DIR}/") == in_cuda_dir)  # fmt: skip
    return MemoryNeed(files * sessions_on(engine, device), kv, engine.prefix_cache_bytes)


@functools.lru_cache(maxsize=16)
def graph_caches(onnx_path: str, stamp: tuple[int, int], facts: firmware.ModelFacts) -> tuple[int, int]:
    """(elements of one position's keys in all layers, bytes of recurrent states per slot) of a
    graph, from its inputs (its weights are not read): a hybrid model has keys and values in its
    attention layers only, and layers may differ in heads and head width (ModelFacts.kv_shapes).
    `stamp` (size, mtime) keys the cache to the file as it is."""
    import onnx
    from onnx import helper

    graph = onnx.load(onnx_path, load_external_data=False).graph
    inputs = {i.name: i.type.tensor_type for i in graph.input}
    _, states = facts.caches(inputs)
    # Fixed past the batch (ModelFacts.graph_refusal): each a slot's StateSpec.
    specs = [StateSpec(past, present, tuple(d.dim_value for d in inputs[past].shape.dim[1:]),
                       helper.tensor_dtype_to_np_dtype(inputs[past].elem_type).type)
             for past, present in states]  # fmt: skip
    shapes = {name: [d.dim_value or d.dim_param for d in t.shape.dim] for name, t in inputs.items()}
    return sum(heads * width for heads, width in facts.kv_shapes(shapes)), sum(spec.row_bytes for spec in specs)


def _mib(size: int) -> str:
    return f"{size / (1 << 20):,.0f} MiB"


def check_fit(plans: Mapping[str, Plan], bundles: Mapping[str, firmware.Bundle], host: HostFacts,
              gpu_threshold: float, gpu_held: int = 0) -> None:
    """Refuse, naming each bundle and what it needs, a set of bundles whose engines could together
    outgrow a device's memory: the host's available memory, or the GPU's up to the governor's
    threshold. `gpu_held`: bytes of GPU memory that engines kept across a reload hold (the host's
    available memory excludes what they hold already)."""
    budgets: dict[str, int] = {}
    if host.host_memory is not None:
        budgets["cpu"] = host.host_memory
    if host.gpu_memory is not None:
        budgets["gpu"] = int(host.gpu_memory * gpu_threshold) - gpu_held
    where = {"cpu": "available host memory", "gpu": "GPU memory under the governor's threshold"}
    problems = []
    used = dict.fromkeys(budgets, 0)
    for name, plan in plans.items():
        for device in plan.devices:
            kind = "cpu" if device == "cpu" else "gpu"
            if kind not in budgets:
                continue
            need = memory_need(bundles[name], plan.engine, device)
            used[kind] += need.on(device)
            if used[kind] > budgets[kind]:
                sessions = sessions_on(plan.engine, device)
                parts = f"weights {_mib(need.weights)}" + (f" in {sessions} sessions" if sessions > 1 else "")
                parts += f", KV {_mib(need.kv)}"
                if device == "cpu":
                    parts += f", prefix pool {_mib(need.prefix)}"
                lane = ", set engine.prefill_lane = false" if sessions > 1 else ""
                problems.append(f"firmware {name!r} does not fit on {device}: it needs {_mib(need.on(device))} "
                                f"({parts}), {_mib(used[kind])} with the bundles before it, of {_mib(budgets[kind])} "
                                f"{where[kind]}; lower engine.kv_cache_mb or limits.max_active_per_device{lane}, or "
                                "serve fewer bundles")  # fmt: skip
    if problems:
        raise ConfigError(problems)


def plan_models(config: Config, bundles: Mapping[str, firmware.Bundle], host: HostFacts,
                gpu_held: int = 0) -> tuple[dict[str, Plan], GovernorConfig]:
    """A plan per served bundle and the one governor over them, every problem at once; refused
    whole when they would not fit together (nothing is then built)."""
    plans: dict[str, Plan] = {}
    problems: list[str] = []
    for name, bundle in bundles.items():
        try:
            plans[name] = make_plan(config, bundle, host)
        except ConfigError as exc:
            problems += [f"firmware {name!r}: {p}" for p in exc.problems]
    if problems:
        raise ConfigError(problems)
    gpu_bundles = [name for name, plan in plans.items() if plan.gpu_device is not None]
    if len(gpu_bundles) > 1:  # each GPU session's arena gets its share of the budget, not the whole of it
        for name in gpu_bundles:
            plans[name] = make_plan(config, bundles[name], host, gpu_share=len(gpu_bundles))
    governor = governor_config(config, list(bundles.values()), host.probe)
    check_fit(plans, bundles, host, governor.threshold, gpu_held)
    return plans, governor
