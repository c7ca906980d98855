"""API keys for network clients: stored hashed, checked in constant time.

The keys file has one line per key: `NAME SHA256-HEX [debug]`. Keys are 256-bit random
tokens, so a plain SHA-256 is a sufficient hash (no password stretching needed), and the
file never holds a usable key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

KEY_PREFIX = "zl-"


@dataclass(frozen=True)
class ApiKey:
    name: str
    digest: bytes
    debug: bool = False


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyStore:
    def __init__(self, keys: list[ApiKey]) -> None:
        self.keys = keys

    @classmethod
    def load(cls, path: Path) -> KeyStore:
        keys = []
        if path.exists():
            for lineno, line in enumerate(path.read_text().splitlines(), 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                parts = line.split()
                if len(parts) not in (2, 3) or len(parts[1]) != 64 or (len(parts) == 3 and parts[2] != "debug"):
                    raise ValueError(f"{path}:{lineno}: expected 'NAME SHA256-HEX [debug]'")
                keys.append(ApiKey(parts[0], bytes.fromhex(parts[1]), len(parts) == 3))
        return cls(keys)

    def check(self, presented: str | None) -> ApiKey | None:
        """The matching key, comparing against every stored digest so timing says nothing."""
        if not presented:
            return None
        digest = _digest(presented)
        found = None
        for key in self.keys:
            if hmac.compare_digest(key.digest, digest):
                found = key
        return found


def add_key(path: Path, name: str, debug: bool = False) -> str:
    """Create a key, store its hash, and return the key (shown once, never stored)."""
    if not name or any(c.isspace() for c in name):
        raise ValueError("a key name must be non-empty and contain no spaces")
    store = KeyStore.load(path)
    if any(k.name == name for k in store.keys):
        raise ValueError(f"a key named {name!r} exists already: revoke it first")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = f"{name} {_digest(key).hex()}{' debug' if debug else ''}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(line)
    return key


def revoke_key(path: Path, name: str) -> bool:
    if not path.exists():
        return False
    lines = path.read_text().splitlines(keepends=True)
    kept = [ln for ln in lines if ln.split()[:1] != [name]]
    if len(kept) == len(lines):
        return False
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.writelines(kept)
    tmp.replace(path)  # atomic: a reader sees the old file or the new one
    return True


def presented_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"x-api-key":
            return value.decode("latin-1")
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return None
