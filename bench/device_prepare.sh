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
# The plan of calls: files grouped into carries of at most 60 MiB and 8 paths (the device keeps
# what earlier calls carried while it stays warm); the last call also runs the check.
plan="$out/plan.md"
{
    echo "# Device calls (bench/device_prepare.sh, $(date -u +%F))"
    echo
    echo "Run them back to back (the machine stays warm about 30 s between calls); each carries its files."
    n=0 size=0 group=()
    flush() {
        [[ ${#group[@]} -gt 0 ]] || return 0
        n=$((n + 1))
        printf '\n%d. carry: %s\n   command: `%s`\n' "$n" "${group[*]}" "$1"
        group=() size=0
    }
    while read -r f; do
        s=$(stat -c %s "$f")
        if (( size + s > 60 * 1024 * 1024 || ${#group[@]} >= 8 )); then flush "ls -la .device"; fi  # 8 paths a call
        group+=("$f") size=$((size + s))
    done < <(find "$out" -type f ! -name plan.md | sort)
    flush "bash bench/device_check.sh  # timeout_s 480; then give_back"
} > "$plan"
cat "$plan"
