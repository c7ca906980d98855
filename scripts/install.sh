#!/usr/bin/env bash
# Install Zerolayer on this Debian 12 (or Ubuntu 22.04+) host, as root:
#   scripts/install.sh --firmware BUNDLE --trusted-keys DIR [--wheelhouse DIR] [--no-start]
# The virtualenv /opt/zerolayer (from this checkout, or offline from a wheelhouse such as the image
# build's), then `zerolayer install` for the rest: user, units, /etc/zerolayer, firmware, a first
# API key (printed once), and the service started.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=/opt/zerolayer
wheelhouse=""
args=()
while (($#)); do
    case "$1" in
        --wheelhouse) wheelhouse="$2"; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
[[ $EUID -eq 0 ]] || { echo "install: run it as root (sudo $0 ...)" >&2; exit 77; }
# The daemon's system packages: Python with venv, its systemd bindings, and libbpf; from a
# checkout (no wheelhouse) also what compiles the kernel layer's BPF object.
packages=(python3 python3-venv python3-systemd libbpf1)
[[ -n "$wheelhouse" ]] || packages+=(clang libbpf-dev gcc make)
source scripts/apt.sh
apt_ensure install "${packages[@]}"
[[ -x "$PREFIX/bin/python" ]] || python3 -m venv --system-site-packages "$PREFIX"  # systemd-python from Debian
if [[ -n "$wheelhouse" ]]; then
    "$PREFIX/bin/pip" install -q --no-index --disable-pip-version-check --find-links "$wheelhouse" "zerolayer[cpu]"
else
    make -s -C bpf BUILD="$PWD/appliance/kernel"  # packaged with the rest (pyproject's package-data)
    "$PREFIX/bin/pip" install -q --disable-pip-version-check ".[cpu]"
fi
ZEROLAYER_SOURCE="$PWD" exec "$PREFIX/bin/zerolayer" install "${args[@]}"  # the units come from here
