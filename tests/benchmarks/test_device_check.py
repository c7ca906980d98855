"""The prepared GPU check cannot run here (no GPU), but it must not rot while the code it drives
moves: its shell parses, the Python it runs compiles and imports names that exist, and its check
(bench/device_check.py) runs end to end on the CPU provider (`--dry-run`), every step passing."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = [REPO / "bench" / "device_check.sh", REPO / "bench" / "device_prepare.sh"]


def python_blocks(script: Path) -> list[str]:
    """The bodies of the script's `python3 - <<'PY' ... PY` heredocs."""
    return re.findall(r"<<'PY'[^\n]*\n(.*?)\nPY\n", script.read_text(), flags=re.S)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_device_scripts_parse(script: Path) -> None:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_device_checks_python_compiles_and_its_imports_exist() -> None:
    blocks = python_blocks(SCRIPTS[0])
    assert blocks  # the CUDA firmware's build
    for block in blocks:
        tree = ast.parse(block)  # a syntax error fails here
        imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
        namespace: dict[str, object] = {}
        exec(compile(ast.Module(body=imports, type_ignores=[]), "device_check.sh", "exec"), namespace)
        for node in imports:
            for alias in node.names:
                assert (alias.asname or alias.name).split(".")[0] in namespace


def test_the_device_check_runs_end_to_end_on_the_cpu(tmp_path: Path) -> None:
    import json
    import sys

    done = subprocess.run([sys.executable, "-m", "bench.device_check", "--dry-run", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "device_check.json").read_text())
    assert summary["ok"] and summary["dry_run"] and summary["device"] == "cpu"
    steps = summary["steps"]
    assert list(steps) == ["providers", "placement", "logits", "decode", "streams", "ttft", "prefix_reuse",
                           "governor", "out_of_memory", "hybrid", "experts"]  # fmt: skip
    assert steps["hybrid"]["answers_as_alone"] and steps["hybrid"]["states"] == 2
    assert steps["placement"]["heavy_nodes"] and not steps["placement"]["heavy_nodes_elsewhere"]
    assert steps["governor"]["placement"] == ["cpu-as-gpu", "cpu", "cpu-as-gpu"]
    assert steps["prefix_reuse"]["reused_tokens"] > 0
    assert steps["out_of_memory"]["skipped"]  # the one step a CPU cannot take, and it says so
