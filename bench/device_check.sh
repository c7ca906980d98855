#!/usr/bin/env bash
# The GPU check, one prepared script for a machine with an NVIDIA GPU (the `device` tool):
# installs onnxruntime-gpu from carried wheels, builds the demo firmware for CUDA, checks NVML
# readings, runs the engine on cuda:0, fills GPU memory past the fallback threshold with a plain
# allocation and checks that new requests go to the CPU, then times decode tokens/s on GPU and CPU.
# Budget: under 8 minutes. Inputs: .device/ from bench/device_prepare.sh (parts joined here).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
OUT=${OUT:-/tmp/device-out}; mkdir -p "$OUT"

say "joining carried parts"
for first in $(find .device -name '*.part-00'); do
    cat "${first%.part-00}".part-* > "${first%.part-00}" && rm "${first%.part-00}".part-*
done
say "installing onnxruntime-gpu and what the image lacks"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD ZEROLAYER_CACHE=/tmp/zl-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"

say "building the demo firmware for CUDA (fp16) from the carried GGUF"
python3 - <<'PY'
from pathlib import Path
from firmware.toolchain.build import BuildOptions, build
from firmware.toolchain.devkit import ensure_bundle
gguf = next(Path(".device").glob("*.gguf"))
print(ensure_bundle("smollm2-cuda", lambda out: build(gguf, out, BuildOptions(precision="fp16", target="cuda",
                                                                           name="smollm2-cuda"))))
PY

say "NVML, the engine on cuda:0, the fallback, decode timing"
timeout 300 python3 - <<'PY' | tee "$OUT/device_check.txt"
import asyncio, time
import numpy as np, onnxruntime as ort
import firmware
from firmware.toolchain.devkit import dev_trusted_keys
from firmware.toolchain.paths import cache_dir
from appliance.engine import Engine, EngineConfig, GenerationRequest, Message, TextDelta
from appliance.governor import Governor, GovernorConfig, NvmlProbe, cuda_memory_limit

assert "CUDAExecutionProvider" in ort.get_available_providers(), ort.get_available_providers()
probe = NvmlProbe()
(reading, *_) = probe.read()
print(f"NVML: {reading.device} {reading.used / 2**30:.1f}/{reading.total / 2**30:.1f} GiB ({reading.ratio:.1%})")
assert reading.total > 0 and 0 <= reading.ratio < 1
bundle = firmware.load(cache_dir() / "firmware" / "smollm2-cuda", dev_trusted_keys())
threshold = bundle.layer.fallback_cpu_threshold
engine = Engine(bundle, EngineConfig(prefix_cache_bytes=0), devices=("cuda:0", "cpu"),
                cuda_options={"gpu_mem_limit": str(cuda_memory_limit(reading.total, threshold))})
assert "CUDAExecutionProvider" in engine.workers["cuda:0"].session.session.get_providers()
governor = Governor(probe, GovernorConfig(threshold=threshold), gpu_device="cuda:0")
ask = GenerationRequest(messages=(Message("user", "What is the capital of France?"),), max_tokens=32, temperature=0.0)

async def run(device):
    text, t = [], time.perf_counter()
    async for e in engine.submit(ask, device):
        if isinstance(e, TextDelta):
            text.append(e.text)
    return "".join(text), time.perf_counter() - t

governor.sample()
device = governor.place()
text, _ = asyncio.run(run(device))
print(f"placed on {device}: {text!r}")
assert device == "cuda:0" and "Paris" in text

# Fill GPU memory past the threshold with plain allocations (cudaMalloc through ORT's allocator).
hog, chunk = [], 1 << 30
while governor.latest.ratio < threshold + 0.02:
    hog.append(ort.OrtValue.ortvalue_from_shape_and_type([chunk // 4], np.float32, "cuda", 0))
    governor.sample()
print(f"filled to {governor.latest.ratio:.1%} with {len(hog)} GiB")
device = governor.place()
text, _ = asyncio.run(run(device))
print(f"over the threshold, placed on {device}: {text!r}")
assert device == "cpu" and "Paris" in text
del hog[:]
time.sleep(0.5)
governor.sample()
print(f"freed: {governor.latest.ratio:.1%}, placement {governor.place()}")

long = GenerationRequest(messages=ask.messages, max_tokens=128, temperature=0.0)
for dev in ("cuda:0", "cpu"):
    async def timed(dev=dev):
        stream = engine.submit(long, dev)
        async for _ in stream:
            pass
        return stream.finished
    done = asyncio.run(timed())
    print(f"decode on {dev}: {1000 / done.trace.ms_per_token:.1f} tokens/s over {done.trace.decode_tokens} tokens, "
          f"prefill {done.trace.prefill_ms:.0f} ms")
engine.close()
PY
say "done"
