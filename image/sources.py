"""The Debian mirror to build from: the one the build machine's own apt sources name. The project
never names a mirror host; a builder behind a proxy or with a local mirror gets that one."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


@dataclass(frozen=True)
class AptSource:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]


def parse_one_line(text: str) -> list[AptSource]:
    """sources.list(5) one-line style: `deb [options] URI SUITE COMPONENT...`."""
    found = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words = words[1:]
        if words and words[0].startswith("["):  # options, possibly spread over several words
            while words and not words[0].endswith("]"):
                words.pop(0)
            words = words[1:]
        if len(words) >= 2:
            found.append(AptSource(words[0], (words[1],), tuple(words[2:])))
    return found


def parse_deb822(text: str) -> list[AptSource]:
    """sources.list(5) deb822 style: stanzas of `Types:`, `URIs:`, `Suites:`, `Components:`."""
    found = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0].isspace() and key:  # a continuation line
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            found.append(AptSource(uri, tuple(fields.get("suites", "").split()),
                                   tuple(fields.get("components", "").split())))  # fmt: skip
    return found


def read_sources(paths: Iterable[Path] = APT_SOURCES) -> list[AptSource]:
    found: list[AptSource] = []
    for path in paths:
        files = sorted(path.iterdir()) if path.is_dir() else [path]
        for f in files:
            if not f.is_file():
                continue
            if f.suffix == ".list" or f.name == "sources.list":
                found += parse_one_line(f.read_text())
            elif f.suffix == ".sources":
                found += parse_deb822(f.read_text())
    return found


def debian_mirror(sources: list[AptSource], suite: str) -> str:
    """The URI of the first source that serves SUITE's main component (not -security or -updates)."""
    for source in sources:
        if suite in source.suites and "main" in source.components:
            return source.uri.rstrip("/")
    named = ", ".join(f"{s.uri} {' '.join(s.suites)}" for s in sources) or "none"
    raise LookupError(f"no apt source of this machine serves Debian {suite} main (found: {named}): "
                      f"add one to /etc/apt/sources.list.d/, or pass --mirror URL")  # fmt: skip
