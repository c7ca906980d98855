"""The manifest: its schema, parsing with strict validation, and its canonical bytes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from firmware.errors import BundleError

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.sig"
SPLIT_ALGORITHMS = ("semantic", "fixed")

# Ranges for the baked constants. Outside them a bundle is refused: a shard of 4 tokens or a
# threshold of 1.0 (never fall back) is a build mistake, not a tuning choice.
MAX_TOKENS_PER_SHARD_RANGE = (16, 1 << 20)
FALLBACK_CPU_THRESHOLD_RANGE = (0.05, 0.99)


@dataclass(frozen=True)
class LayerConstants:
    """Decisions baked into the firmware; /etc config may only lower the limits."""

    max_tokens_per_shard: int = 8192
    fallback_cpu_threshold: float = 0.85
    split_algorithm: str = "semantic"

    def validate(self, where: str = "layer") -> None:
        lo, hi = MAX_TOKENS_PER_SHARD_RANGE
        shard = self.max_tokens_per_shard
        if isinstance(shard, bool) or not isinstance(shard, int) or not lo <= shard <= hi:
            raise BundleError(f"{where}.max_tokens_per_shard={shard!r} is out of range: an integer in [{lo}, {hi}]")
        flo, fhi = FALLBACK_CPU_THRESHOLD_RANGE
        thr = self.fallback_cpu_threshold
        if isinstance(thr, bool) or not isinstance(thr, int | float) or not flo <= thr <= fhi:
            raise BundleError(f"{where}.fallback_cpu_threshold={thr!r} is out of range: a number in [{flo}, {fhi}]")
        if self.split_algorithm not in SPLIT_ALGORITHMS:
            raise BundleError(
                f"{where}.split_algorithm={self.split_algorithm!r} is not one of {', '.join(SPLIT_ALGORITHMS)}"
            )


@dataclass(frozen=True)
class Licence:
    """The terms a model is used under, kept in the signed manifest: their name, where they are
    published, the notice to pass on, and the bundle's files that hold their text (each also in
    `files`, so hashed and signed like the model)."""

    name: str
    url: str
    notice: str
    files: tuple[str, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "notice": self.notice, "files": list(self.files)}


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    name: str
    version: str
    chat_template: str
    layer: LayerConstants
    files: Mapping[str, FileEntry]
    source: Mapping[str, str] = field(default_factory=dict)
    format: int = FORMAT_VERSION
    licence: Licence | None = None  # absent from the JSON when None (older manifests' bytes unchanged)
    # The folder's template for requests with tools, where it names one "tool_use" (Hermes 2 Pro's and
    # 3's, Command R's), as transformers picks it; absent when None, as the licence.
    tool_use_template: str | None = None

    def to_json_bytes(self) -> bytes:
        """The canonical bytes that are signed: sorted keys, fixed separators, trailing newline."""
        doc = {
            "format": self.format,
            "name": self.name,
            "version": self.version,
            "source": dict(self.source),
            "chat_template": self.chat_template,
            "layer": {
                "max_tokens_per_shard": self.layer.max_tokens_per_shard,
                "fallback_cpu_threshold": self.layer.fallback_cpu_threshold,
                "split_algorithm": self.layer.split_algorithm,
            },
            "files": {p: {"sha256": e.sha256, "size": e.size} for p, e in sorted(self.files.items())},
        }
        if self.licence is not None:
            doc["licence"] = self.licence.to_doc()
        if self.tool_use_template is not None:
            doc["tool_use_template"] = self.tool_use_template
        return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


_TOP_FIELDS = {"format", "name", "version", "source", "chat_template", "layer", "files", "licence",
               "tool_use_template"}
_LICENCE_FIELDS = {"name", "url", "notice", "files"}
_LAYER_FIELDS = {"max_tokens_per_shard", "fallback_cpu_threshold", "split_algorithm"}
_FILE_FIELDS = {"sha256", "size"}


def _reject_unknown(obj: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(obj) - known)
    if unknown:
        raise BundleError(f"{MANIFEST_NAME}: unknown field {where}{unknown[0]!r}; known fields: {sorted(known)}")


def _require(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise BundleError(f"{MANIFEST_NAME}: missing field {where}{key!r}")
    value = obj[key]
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise BundleError(f"{MANIFEST_NAME}: field {where}{key!r} has the wrong type ({type(value).__name__})")
    return value


def parse_manifest(data: bytes) -> Manifest:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{MANIFEST_NAME}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BundleError(f"{MANIFEST_NAME}: the top level must be an object")
    _reject_unknown(doc, _TOP_FIELDS, "")
    fmt = _require(doc, "format", int, "")
    if fmt != FORMAT_VERSION:
        raise BundleError(f"{MANIFEST_NAME}: format {fmt} is not supported (this build reads {FORMAT_VERSION})")
    layer_doc = _require(doc, "layer", dict, "")
    _reject_unknown(layer_doc, _LAYER_FIELDS, "layer.")
    layer = LayerConstants(
        max_tokens_per_shard=_require(layer_doc, "max_tokens_per_shard", int, "layer."),
        fallback_cpu_threshold=float(_require(layer_doc, "fallback_cpu_threshold", (int, float), "layer.")),
        split_algorithm=_require(layer_doc, "split_algorithm", str, "layer."),
    )
    try:
        layer.validate()
    except BundleError as exc:
        raise BundleError(f"{MANIFEST_NAME}: {exc}") from None
    files: dict[str, FileEntry] = {}
    for rel, entry in _require(doc, "files", dict, "").items():
        where = f"files[{rel!r}]."
        if not isinstance(entry, dict):
            raise BundleError(f"{MANIFEST_NAME}: {where[:-1]} must be an object")
        _reject_unknown(entry, _FILE_FIELDS, where)
        _check_relative_path(rel)
        files[rel] = FileEntry(
            sha256=_require(entry, "sha256", str, where), size=_require(entry, "size", int, where)
        )
    source = _require(doc, "source", dict, "") if "source" in doc else {}
    licence = _parse_licence(_require(doc, "licence", dict, ""), files) if "licence" in doc else None
    return Manifest(
        name=_require(doc, "name", str, ""),
        version=_require(doc, "version", str, ""),
        chat_template=_require(doc, "chat_template", str, ""),
        layer=layer,
        files=files,
        source={str(k): str(v) for k, v in source.items()},
        format=fmt,
        licence=licence,
        tool_use_template=_require(doc, "tool_use_template", str, "") if "tool_use_template" in doc else None,
    )


def _parse_licence(doc: dict[str, Any], files: Mapping[str, FileEntry]) -> Licence:
    _reject_unknown(doc, _LICENCE_FIELDS, "licence.")
    texts = _require(doc, "files", list, "licence.")
    for rel in texts:
        if not isinstance(rel, str) or rel not in files:
            raise BundleError(f"{MANIFEST_NAME}: licence file {rel!r} is not one of the bundle's files")
    return Licence(
        name=_require(doc, "name", str, "licence."),
        url=_require(doc, "url", str, "licence."),
        notice=_require(doc, "notice", str, "licence."),
        files=tuple(texts),
    )


def _check_relative_path(rel: str) -> None:
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or rel in (MANIFEST_NAME, SIGNATURE_NAME) or not rel:
        raise BundleError(f"{MANIFEST_NAME}: file path {rel!r} is not allowed in a bundle")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def list_payload_files(root: Path) -> list[str]:
    """Every file in the bundle directory except the manifest and its signature, as relative paths."""
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() or p.is_symlink():
            rel = p.relative_to(root).as_posix()
            if rel not in (MANIFEST_NAME, SIGNATURE_NAME):
                out.append(rel)
    return out


def describe_files(root: Path) -> dict[str, FileEntry]:
    return {
        rel: FileEntry(sha256=sha256_file(root / rel), size=(root / rel).stat().st_size)
        for rel in list_payload_files(root)
    }
