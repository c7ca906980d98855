"""Where build products live on a development machine: one cache, outside the work tree."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$ZEROLAYER_CACHE, else ~/.cache/zerolayer: kept between clones so the demo builds once."""
    root = os.environ.get("ZEROLAYER_CACHE")
    path = Path(root) if root else Path.home() / ".cache" / "zerolayer"
    path.mkdir(parents=True, exist_ok=True)
    return path
