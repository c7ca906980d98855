"""The README's Architecture map names every module the packages ship, so it cannot drift."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _named_in_map() -> set[str]:
    """Paths the map's first column names: `dir/a.py`, `b.py` means dir/a.py and dir/b.py; `dir/` all of dir."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    for row in section.splitlines():
        if not row.startswith("| `"):
            continue
        names = re.findall(r"`([^`]+)`", row.split("|")[1])
        folder = str(Path(names[0]).parent)
        for name in names:
            named.add(name if "/" in name else f"{folder}/{name}")
    return named


def test_the_architecture_map_names_every_module() -> None:
    named = _named_in_map()
    missing = []
    for package in ("appliance", "firmware"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if path.name == "__init__.py" or "__pycache__" in rel:
                continue
            if rel not in named and not any(n.endswith("/") and rel.startswith(n) for n in named):
                missing.append(rel)
    assert not missing, f"README Architecture map lacks: {', '.join(missing)}"
