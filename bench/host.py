"""What every benchmark report says about the machine it ran on."""

from __future__ import annotations

import os
import platform


def machine() -> str:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{platform.machine()}, {os.cpu_count()} CPUs ({cpu or 'unknown CPU'}), {mem:.0f} GiB, "
            f"{platform.platform()}, Python {platform.python_version()}")  # fmt: skip


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())
