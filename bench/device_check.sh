#!/usr/bin/env bash
# The GPU check, one prepared script for a machine with an NVIDIA GPU (the `device` tool):
# installs onnxruntime-gpu from carried wheels, builds the demo firmware for CUDA, then runs
# bench/device_check.py on cuda:0 (providers, node placement, logits against the CPU, decode
# against the bandwidth bound, streams, TTFT, prefix reuse, the governor under a memory hog, a
# real out-of-memory continued on the CPU, a hybrid model's recurrent states on the device,
# Nemotron 3's experts on the device's MoE kernel);
# everything lands in $OUT/device_check.json.
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

say "building the demo firmware with a CUDA graph (fp16, cuda/) beside its int8 CPU graph, from the carried GGUF"
bundle=$(python3 - <<'PY' | tail -1
from pathlib import Path
from firmware.toolchain.build import BuildOptions, build
from firmware.toolchain.devkit import ensure_bundle
gguf = next(Path(".device").glob("*.gguf"))
print(ensure_bundle("smollm2-cuda", lambda out: build(gguf, out, BuildOptions(precision="int8", target="cpu",
                                                                           name="smollm2-cuda", cuda_graph=True))))
PY
)

say "the device check (bench/device_check.py; --dry-run runs the same steps on the CPU in make test)"
timeout 420 python3 -m bench.device_check --bundle "$bundle" --out "$OUT" \
    | tee "$OUT/device_check.txt"
say "done"
