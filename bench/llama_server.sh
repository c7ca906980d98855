#!/usr/bin/env bash
# Builds llama.cpp's own `llama-server` from the llama-cpp-python sdist (PyPI is the only source
# these machines reach) into ~/.cache/zerolayer/llama.cpp, once; prints the binary's path.
# About 12 minutes on 2 cores. The flags avoid the AMX kernels: these VMs advertise AMX but do
# not allow it, and a -march=native build dies in tinygemm_kernel_amx (../shared/FACTS.md).
# `--source-only`: fetch the source only (its GGUF converter checks tiny_gguf.py) and print its path.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="${ZEROLAYER_CACHE:-$HOME/.cache/zerolayer}/llama.cpp/$VERSION"
BIN="$ROOT/build/bin/llama-server"
if [[ -x "$BIN" && "${1:-}" != "--source-only" ]]; then echo "$BIN"; exit 0; fi
mkdir -p "$ROOT"
if [[ ! -d "$ROOT/src" ]]; then
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$VERSION" >&2
    tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
    mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$ROOT/src"
    rm -rf "$tmp"
fi
if [[ "${1:-}" == "--source-only" ]]; then echo "$ROOT/src"; exit 0; fi
cmake -S "$ROOT/src" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON \
    -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
    -DGGML_AMX_BF16=OFF >&2
cmake --build "$ROOT/build" --target llama-server -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" >&2
echo "$BIN"
