"""Ed25519 keys and signatures over the manifest's exact bytes."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from firmware.errors import BundleError
from firmware.manifest import SIGNATURE_NAME


def key_id(public_key: Ed25519PublicKey) -> str:
    """A short, stable name for a key: the first 16 hex digits of sha256 over its raw bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public_path: Path
    key_id: str


def generate_keypair(out_dir: Path, name: str = "signing") -> KeyPair:
    """Write NAME.key (PKCS#8 PEM, mode 0600, never world-readable even briefly) and NAME.pub."""
    out_dir.mkdir(parents=True, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    private_path = out_dir / f"{name}.key"
    public_path = out_dir / f"{name}.pub"
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public = private.public_key()
    public_path.write_bytes(
        public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return KeyPair(private_path, public_path, key_id(public))


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except OSError as exc:
        raise BundleError(f"{path}: cannot read the signing key ({exc.strerror or exc})") from None
    except (ValueError, TypeError) as exc:  # not PEM, or a passphrase-protected key
        raise BundleError(f"{path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BundleError(f"{path}: not an Ed25519 private key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise BundleError(f"{path}: cannot read the public key ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise BundleError(f"{path}: not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise BundleError(f"{path}: not an Ed25519 public key")
    return key


def load_trusted_keys(source: Path | list[Path]) -> dict[str, Ed25519PublicKey]:
    """The trusted set: every *.pub in a directory, or the given key files, by key id."""
    if isinstance(source, Path):
        if not source.is_dir():
            raise BundleError(f"trusted keys directory {source} does not exist")
        paths = sorted(source.glob("*.pub"))
    else:
        paths = list(source)
    keys = {}
    for p in paths:
        k = load_public_key(p)
        keys[key_id(k)] = k
    return keys


def sign_manifest(manifest_bytes: bytes, private_key: Ed25519PrivateKey) -> bytes:
    """The manifest.sig document: which key signed, and the signature, as JSON."""
    doc = {
        "algorithm": "ed25519",
        "key_id": key_id(private_key.public_key()),
        "signature": base64.b64encode(private_key.sign(manifest_bytes)).decode(),
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def verify_signature(manifest_bytes: bytes, sig_bytes: bytes, trusted: dict[str, Ed25519PublicKey]) -> str:
    """Return the signer's key id, or raise naming manifest.sig and why."""
    try:
        doc = json.loads(sig_bytes)
        algorithm, kid, sig = doc["algorithm"], doc["key_id"], base64.b64decode(doc["signature"], validate=True)
    except KeyError as exc:
        raise BundleError(f"{SIGNATURE_NAME}: the signature file is malformed: it has no {exc} field") from None
    except (ValueError, TypeError) as exc:
        raise BundleError(f"{SIGNATURE_NAME}: the signature file is malformed ({exc}); re-sign the bundle") from None
    if algorithm != "ed25519":
        raise BundleError(f"{SIGNATURE_NAME}: algorithm {algorithm!r} is not supported (ed25519 only)")
    key = trusted.get(kid)
    if key is None:
        raise BundleError(f"{SIGNATURE_NAME}: signed by key {kid}, which is not in the trusted set")
    try:
        key.verify(sig, manifest_bytes)
    except InvalidSignature:
        raise BundleError(
            f"{SIGNATURE_NAME}: the signature does not match manifest.json (the manifest was edited)"
        ) from None
    return str(kid)
