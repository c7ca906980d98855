"""A smoke run of bench/kernel.py (a few requests per side), so the benchmark cannot rot; the
numbers themselves are the benchmark's business, not a test's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_kernel_bench_quick_run_measures_both_sides() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "kernel.py"), "--quick"], capture_output=True,
                          text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    row = re.search(r"\| requests/s: tc programs attached / detached \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x", proc.stdout)
    assert row is not None, proc.stdout
    attached, detached, ratio = map(float, row.groups())
    assert attached > 0 and detached > 0 and ratio > 0
    packets = re.search(r"the programs counted ([\d.]+) packets per request", proc.stdout)
    assert packets is not None and float(packets.group(1)) >= 4  # the attached rounds really ran through tc
