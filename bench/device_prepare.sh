#!/usr/bin/env bash
# Run HERE (the development machine) before bench/device_check.sh: gathers what the GPU machine
# lacks into .device/ (git-ignored) in pieces of at most 60 MiB, since one device call carries
# at most 64 MiB. Its image has Python 3.12, onnxruntime (CPU), onnx, transformers, torch,
# tokenizers, jinja2, numpy and nvidia-ml-py; it lacks onnxruntime-gpu, cryptography and the
# demo model's GGUF file.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.device
mkdir -p "$out/whl"
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64)
for pkg in onnxruntime-gpu cryptography cffi pycparser; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d "$out/whl" "$pkg"
done
cp "$(.venv/bin/python -c 'from firmware.toolchain.demo import demo_gguf; print(demo_gguf())')" "$out/"
# Split everything over 60 MiB; device_check.sh joins the parts (the machine stays warm between calls).
find "$out" -type f -size +60M ! -name '*.part-*' | while read -r f; do
    split -b 60M -d "$f" "$f.part-" && rm "$f"
done
du -ah "$out" | sort -h | tail -20
echo "carry one group of files of at most 64 MiB per call (e.g. one .part- each), then run bench/device_check.sh"
