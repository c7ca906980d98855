"""The device governor: probes, hysteresis, placement while requests stream, the OOM fallback,
and Jetson's shed policy.

This machine has no GPU. Where a test needs a GPU session, a second CPU session ("cpu:1")
stands in for it, and a probe whose readings the test sets stands in for NVML: the same
interface, the same placement code, the same engine workers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import RuntimeException

import firmware
from appliance.config import load_config
from appliance.engine import Engine, EngineBusy, EngineConfig, GenerationRequest, Message
from appliance.governor import (
    Governor,
    GovernorConfig,
    Hysteresis,
    JetsonProbe,
    MemoryReading,
    NoGpuProbe,
    detect_probe,
    is_allocation_failure,
    is_jetson,
)
from appliance.plan import governor_config

GPU = "cpu:1"  # the stand-in GPU session
QUESTION = (Message("user", "Explain how the while statement and its else clause work."),)


class SetProbe:
    """A probe whose reading the test sets."""

    kind = "test"

    def __init__(self, ratio: float = 0.5) -> None:
        self.ratio = ratio

    def read(self) -> list[MemoryReading]:
        return [MemoryReading(GPU, int(self.ratio * 1000), 1000)]


def test_hysteresis_does_not_flap() -> None:
    h = Hysteresis(0.85, 0.05)
    seen = [h.update(r) for r in (0.5, 0.84, 0.85, 0.84, 0.81, 0.86, 0.80, 0.79, 0.84)]
    assert seen == [False, False, True, True, True, True, True, False, False]


def test_no_driver_means_no_gpu_said_once(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    caplog.set_level("INFO")
    probe = detect_probe(tmp_path)  # no device tree, no tegra release, no NVIDIA driver here
    assert isinstance(probe, NoGpuProbe) and probe.read() == []
    assert sum("no GPU: NVML unavailable (NVMLError_LibraryNotFound)" in r.message for r in caplog.records) == 1


def _fake_jetson(root: Path, total_kb: int, available_kb: int) -> None:
    (root / "proc" / "device-tree").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "device-tree" / "compatible").write_bytes(b"nvidia,p3768-0000+p3767-0005\0nvidia,tegra234\0")
    (root / "proc" / "meminfo").write_text(
        f"MemTotal:       {total_kb} kB\nMemFree:          1000 kB\nMemAvailable:   {available_kb} kB\n"
    )


def test_jetson_is_detected_and_read_from_meminfo(tmp_path: Path) -> None:
    assert not is_jetson(tmp_path)
    _fake_jetson(tmp_path, 8_000_000, 2_000_000)
    assert is_jetson(tmp_path)
    probe = detect_probe(tmp_path)
    assert isinstance(probe, JetsonProbe)
    (reading,) = probe.read()
    assert reading.total == 8_000_000 * 1024 and reading.ratio == pytest.approx(0.75)


def test_allocation_failures_are_recognised() -> None:
    assert is_allocation_failure(RuntimeException("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status "
                                                  "code returned while running MatMul node. Failed to allocate "
                                                  "memory for requested buffer of size 1048576"))  # fmt: skip
    assert not is_allocation_failure(RuntimeException("shape mismatch"))


@pytest.fixture(scope="module")
def bundle(tiny_bundle_path: Path, trusted_keys: Path) -> firmware.Bundle:
    return firmware.load(tiny_bundle_path, trusted_keys)


def _greedy(max_tokens: int = 40) -> GenerationRequest:
    return GenerationRequest(messages=QUESTION, max_tokens=max_tokens, temperature=0.0)


def test_placement_follows_memory_with_hysteresis_while_requests_stream(bundle: firmware.Bundle) -> None:
    engine = Engine(bundle, EngineConfig(prefix_cache_bytes=0), devices=(GPU, "cpu"))
    probe = SetProbe(0.5)
    fallbacks: list[str] = []
    governor = Governor(probe, GovernorConfig(threshold=0.85, hysteresis=0.05, interval=0.02), gpu_device=GPU,
                        on_fallback=lambda: fallbacks.append("vram_threshold"))  # fmt: skip

    async def until(condition: Callable[[], bool], limit: float = 2.0) -> None:
        """A few sampling intervals; generous so a loaded CI machine does not fail it."""
        deadline = time.monotonic() + limit
        while not condition():
            assert time.monotonic() < deadline, "the governor did not react"
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        sampler = asyncio.create_task(governor.run())
        await until(lambda: governor.latest is not None)
        assert governor.place() == GPU
        in_flight = asyncio.create_task(engine.complete(_greedy(200), governor.place()))
        await asyncio.sleep(0.05)
        probe.ratio = 0.9  # GPU memory crosses the threshold while a request streams
        await until(lambda: governor.state.over)
        moved = [await engine.complete(_greedy(8), governor.place()) for _ in range(3)]
        assert all(done.trace.device == "cpu" for _, done in moved)
        probe.ratio = 0.83  # under the threshold but not under threshold - hysteresis: stays on the CPU
        await until(lambda: governor.latest is not None and abs(governor.latest.ratio - 0.83) < 0.002)
        assert governor.place() == "cpu"
        probe.ratio = 0.70
        await until(lambda: not governor.state.over)
        back = await engine.complete(_greedy(8), governor.place())
        assert back[1].trace.device == GPU
        text, done = await in_flight  # it finished where it started
        assert done.trace.device == GPU and done.stop_reason in ("max_tokens", "end_turn") and text
        sampler.cancel()

    try:
        asyncio.run(scenario())
    finally:
        engine.close()
    assert fallbacks == ["vram_threshold"] * 4  # three requests plus the one placement asked at 0.83


def test_oom_on_the_gpu_continues_on_the_cpu_with_an_identical_stream(bundle: firmware.Bundle) -> None:
    engine = Engine(bundle, EngineConfig(prefix_cache_bytes=0), devices=(GPU, "cpu"),
                    on_fallback=lambda reason: reasons.append(reason))  # fmt: skip
    reasons: list[str] = []
    try:
        expected, plain = asyncio.run(engine.complete(_greedy(), GPU))
        assert plain.output_tokens > 10
        session = engine.workers[GPU].session
        real_decode = session.decode
        calls = {"n": 0}

        def decode_that_runs_out(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            if calls["n"] == 6:  # decode step 6 (the first token came from the prefill)
                raise RuntimeException("Non-zero status code returned while running GroupQueryAttention node. "
                                       "Failed to allocate memory for requested buffer of size 65536")  # fmt: skip
            return real_decode(*args, **kwargs)

        session.decode = decode_that_runs_out  # type: ignore[method-assign]
        text, done = asyncio.run(engine.complete(_greedy(), GPU))
        session.decode = real_decode  # type: ignore[method-assign]
    finally:
        engine.close()
    assert text == expected  # no gap, no repeat
    assert done.output_tokens == plain.output_tokens and done.stop_reason == plain.stop_reason
    assert reasons == ["oom"]
    assert done.trace.device == f"{GPU}->cpu"
    assert any(n.startswith(f"Fallback: {GPU} out of memory; re-run on cpu") for n in done.trace.notes)


def test_jetson_sheds_new_requests_over_the_threshold(bundle: firmware.Bundle, tmp_path: Path) -> None:
    _fake_jetson(tmp_path, 8_000_000, 4_000_000)  # 50% used
    probe = JetsonProbe(tmp_path)
    (tmp_path / "etc").mkdir()
    config = load_config(tmp_path / "etc", check_paths=False)
    gov_cfg = governor_config(config, [bundle], probe.kind)
    assert gov_cfg.policy == "shed" and gov_cfg.threshold == bundle.layer.fallback_cpu_threshold
    governor = Governor(probe, gov_cfg, gpu_device=GPU)
    engine = Engine(bundle, EngineConfig(prefix_cache_bytes=0, max_queued=2), devices=(GPU, "cpu"),
                    admitting=governor.admits)  # fmt: skip

    async def scenario() -> None:
        governor.sample()
        assert not governor.shedding
        _fake_jetson(tmp_path, 8_000_000, 400_000)  # 95% used
        governor.sample()
        assert governor.shedding and governor.place() == GPU  # shed: the request waits, it does not move
        waiting = [asyncio.create_task(engine.complete(_greedy(4), governor.place())) for _ in range(2)]
        await asyncio.sleep(0.3)
        assert not any(t.done() for t in waiting) and engine.workers[GPU].queued == 2
        with pytest.raises(EngineBusy):  # the queue is full: the API answers 529/429
            engine.submit(_greedy(4), governor.place())
        _fake_jetson(tmp_path, 8_000_000, 4_000_000)
        governor.sample()
        results = await asyncio.gather(*waiting)
        assert all(done.trace.device == GPU for _, done in results)

    try:
        asyncio.run(scenario())
    finally:
        engine.close()


def test_debug_and_status_against_a_running_daemon(tiny_bundle_path: Path, trusted_keys: Path, tmp_path: Path) -> None:
    """`zerolayer debug` prints the three kinds of line and the answer; an ordinary API key over
    HTTP/3 gets no trace even when it asks; `zerolayer status` reads the live state."""
    import subprocess
    import sys

    from daemon_thread import RunningDaemon

    from appliance.api.auth import add_key
    from appliance.devsetup import write_dev_config

    setup = write_dev_config(tmp_path / "etc", tiny_bundle_path, trusted_keys)
    plain_key = add_key(setup.root / "api-keys", "plain")
    running = RunningDaemon(setup.root).start()

    def zl(*args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
        import os

        env = {**os.environ, **({"ZEROLAYER_API_KEY": key} if key else {})}
        return subprocess.run([sys.executable, "-m", "appliance.cli", *args], capture_output=True, text=True,
                              timeout=120, env=env)  # fmt: skip

    try:
        local = zl("debug", "messages.create", "--prompt", "Tell me about lists.", "--socket", str(setup.unix_socket))
        assert local.returncode == 0, local.stderr
        lines = local.stdout.splitlines()
        assert lines[0].startswith("[DEBUG] Shard decision: input_tokens=")
        assert lines[1].startswith("[DEBUG] Cache lookup: found 0/0 digests")
        assert any(line.startswith("[DEBUG] Placement: no GPU reading -> cpu") for line in lines)
        assert any(line.startswith("[DEBUG] Engine run: device=cpu, prefill ") for line in lines)
        assert not lines[-1].startswith("[DEBUG]")  # then the answer
        url = f"https://localhost:{running.port('http3')}"
        debug_key = zl("debug", "messages.create", "--url", url, "--ca", str(setup.ca_cert), key=setup.api_key)
        assert debug_key.returncode == 0 and "[DEBUG] Engine run: device=cpu" in debug_key.stdout, debug_key.stderr
        ordinary = zl("debug", "messages.create", "--url", url, "--ca", str(setup.ca_cert), key=plain_key)
        assert ordinary.returncode == 0, ordinary.stderr
        assert "[DEBUG]" not in ordinary.stdout and "no trace" in ordinary.stderr
        status = zl("status", "--socket", str(setup.unix_socket))
        assert status.returncode == 0, status.stderr
        for expected in ("firmware:   tiny-llama 0.1.0", "max_tokens_per_shard=64", "device:     cpu: 0 active",
                         "memory:     gpu: no GPU", "placement:  new requests -> cpu (probe none",
                         "listener:   http3", "streams:    0 active", "kernel:"):  # fmt: skip
            assert expected in status.stdout, status.stdout
    finally:
        running.stop()


def test_cuda_ordinals_map_to_nvml_indexes_through_cuda_visible_devices() -> None:
    from appliance.governor import cuda_to_nvml

    uuids = ["GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-cccc-3333"]
    assert cuda_to_nvml(None, uuids) == [0, 1, 2]
    assert cuda_to_nvml("2,0", uuids) == [2, 0]  # cuda:0 is NVML's GPU 2
    assert cuda_to_nvml("GPU-bbbb", uuids) == [1]  # a unique UUID prefix
    assert cuda_to_nvml("1,7,0", uuids) == [1]  # CUDA stops at the first entry that names no GPU
    assert cuda_to_nvml("GPU-", uuids) == [] and cuda_to_nvml("", uuids) == []  # ambiguous, empty
    assert cuda_to_nvml("0,0", uuids) == [0]  # a repeat ends the list too


def test_every_form_of_device_out_of_memory_is_recognised() -> None:
    from appliance.governor import is_allocation_failure

    recorded = [  # as ONNX Runtime has raised them at the run boundary
        "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running MatMul node. "
        "Name:'/model/layers.0/attn/MatMul' Status Message: /onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:"
        "376 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*, bool, "
        "onnxruntime::WaitNotificationFn) Failed to allocate memory for requested buffer of size 1073741824",
        "CUDA failure 2: out of memory ; GPU=0 ; hostname=box ; file=cuda_allocator.cc ; line=47",
        "CUBLAS failure 3: CUBLAS_STATUS_ALLOC_FAILED ; GPU=0",
        "CUDNN failure 2: CUDNN_STATUS_ALLOC_FAILED ; GPU=0",
        "std::bad_alloc",
        "Available memory of 0 is smaller than requested bytes of 4194304",
    ]  # fmt: skip
    assert all(is_allocation_failure(RuntimeError(m)) for m in recorded)
    assert is_allocation_failure(MemoryError())
    assert not is_allocation_failure(RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : wrong shape"))


class RecordedProbe:
    """NVML readings as recorded on a GPU box, replayed one per sample."""

    kind = "nvml"

    def __init__(self, readings: list[MemoryReading]) -> None:
        self.readings = list(readings)

    def read(self) -> list[MemoryReading]:
        return [self.readings.pop(0)]


GIB = 1 << 30


def test_our_cached_arena_does_not_latch_placement_but_another_process_moves_it_and_back() -> None:
    """The arena and the KV pool never give memory back, so NVML's used stays high once our
    engines have been busy: placed by it, requests stayed on the CPU until a restart. Placed by
    the pressure (others' use plus what ours may hold), they follow the other processes only."""
    total, reserved = 80 * GIB, 20 * GIB  # weights and KV pool; the arena may cache up to 68 GiB in all
    recorded = [
        MemoryReading("cuda:0", 21 * GIB, total, own=21 * GIB),  # just us, warm
        MemoryReading("cuda:0", 71 * GIB, total, own=21 * GIB),  # another process took 50 GiB
        MemoryReading("cuda:0", 66 * GIB, total, own=21 * GIB),  # it freed 5: still over, within the margin
        MemoryReading("cuda:0", 21 * GIB, total, own=21 * GIB),  # it exited
        MemoryReading("cuda:0", 68 * GIB, total, own=68 * GIB),  # our arena cached a long prefill's blocks
        MemoryReading("cuda:0", 68 * GIB, total, own=68 * GIB),  # and keeps them: arenas never give back
    ]
    governor = Governor(RecordedProbe(recorded), GovernorConfig(threshold=0.85, hysteresis=0.05), gpu_device="cuda:0")
    governor.reserved = reserved
    placed = []
    for _ in recorded:
        governor.sample()
        placed.append(governor.place())
    assert placed == ["cuda:0", "cpu", "cpu", "cuda:0", "cuda:0", "cuda:0"]
    plain = Hysteresis(0.85, 0.05)  # the old rule, on NVML's ratio: over once our arena is full, for good
    assert [plain.update(r.ratio) for r in recorded] == [False, True, True, False, True, True]
    assert "(85%), pressure 25%" in governor.describe()  # NVML's 68/80, and (68 - 68 + 20) / 80


def test_where_nvml_does_not_say_what_we_hold_the_plain_ratio_places() -> None:
    unknown = MemoryReading("cuda:0", 70 * GIB, 80 * GIB)  # a container's PID namespace, or Jetson
    assert unknown.pressure(20 * GIB) == unknown.ratio == 0.875
    assert MemoryReading("cuda:0", 70 * GIB, 80 * GIB, own=60 * GIB).pressure(20 * GIB) == 0.375
    assert MemoryReading("cuda:0", 70 * GIB, 80 * GIB, own=60 * GIB).pressure(0) == 0.875  # nothing reserved


def test_the_arena_cap_leaves_the_kv_pool_inside_the_budget_shared_by_bundles(
        tiny_bundle_path: Path, trusted_keys: Path, tmp_path: Path) -> None:  # fmt: skip
    import dataclasses as dc

    from appliance.plan import HostFacts, memory_need, plan_models

    bundle = firmware.load(tiny_bundle_path, trusted_keys)
    cuda = dc.replace(bundle, manifest=dc.replace(bundle.manifest, source={**bundle.manifest.source, "target": "cuda"}))
    (tmp_path / "zerolayer.toml").write_text("")
    config = load_config(tmp_path, check_paths=False)
    host = HostFacts(("cpu", "cuda:0"), "nvml", gpu_memory=80 * GIB, host_memory=1 << 40)
    threshold = cuda.layer.fallback_cpu_threshold
    for bundles in ({"a": cuda}, {"a": cuda, "b": cuda}):
        plans, _ = plan_models(config, bundles, host)
        for plan in plans.values():
            kv = memory_need(cuda, plan.engine, "cuda:0").kv
            arena = int(plan.cuda_options["gpu_mem_limit"])  # type: ignore[index]
            assert arena + kv == int(80 * GIB * threshold) // len(bundles)  # the two within its share
