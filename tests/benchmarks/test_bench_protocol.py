"""The protocol benchmark's smoke run: real nginx, Redis, layer service and daemon, the lossy
namespace link, a few requests on every path, so the benchmark cannot rot (it is not run here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NETWORK = ["h3-warm", "tcp-reuse", "layered-reuse", "h3-0rtt", "h3-resumed", "h3-cold", "tcp-new", "layered-new"]


def test_every_path_answers_in_a_smoke_run(tiny_bundle_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.protocol", "--smoke"], cwd=REPO, capture_output=True,
                          text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = {
        "c1": {f"{p}@c1/t{t}" for t in (1, 64) for p in [*NETWORK, "unix", "engine"]} | {"h3-0rtt-get@c1/t1"},
        "conc": {f"{p}@c8/t1" for p in [*NETWORK, "unix", "engine"] if p not in ("h3-0rtt", "h3-resumed")},
        "lossy": {f"{p}@c1/t1" for p in NETWORK},
    }
    for phase, keys in expected.items():
        assert set(summary[phase]) == keys, phase
        for key, (answered, errors, goal) in summary[phase].items():
            assert (answered, errors) == (goal, 0), f"{phase} {key}: {answered} of {goal} answered, {errors} errors"
    for path in [*NETWORK, "h3-0rtt-get"]:
        wire = summary["wire"][path]
        assert wire["requests"] >= 3 and wire["packets"] > 2, (path, wire)
    assert summary["wire"]["layered-new"]["internal_packets"] > 0  # the gateway really asked the layer and Redis
    assert summary["wire"]["tcp-new"]["packets"] > summary["wire"]["tcp-reuse"]["packets"]
