"""The prepared GPU check cannot run here (no GPU), but it must not rot while the code it drives
moves: its shell parses, and the Python it runs compiles and imports names that exist."""

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
    assert len(blocks) >= 2  # the firmware build and the check itself
    for block in blocks:
        tree = ast.parse(block)  # a syntax error fails here
        imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
        namespace: dict[str, object] = {}
        exec(compile(ast.Module(body=imports, type_ignores=[]), "device_check.sh", "exec"), namespace)
        for node in imports:
            for alias in node.names:
                assert (alias.asname or alias.name).split(".")[0] in namespace
