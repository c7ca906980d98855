"""`zerolayer firmware ...`: keygen, build, sign, verify, inspect; on the box, install and rollback."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from firmware.bundle import verify
from firmware.errors import BundleError
from firmware.install import DEFAULT_STORE, InstallError, Switched, install, no_restart, restart_daemon, rollback
from firmware.manifest import MANIFEST_NAME, SIGNATURE_NAME, SPLIT_ALGORITHMS, LayerConstants, parse_manifest
from firmware.signing import generate_keypair
from firmware.toolchain.build import PRECISIONS, TARGETS, BuildOptions, build, sign

DEFAULT_TRUSTED_KEYS = Path("/etc/zerolayer/trusted-keys")


def add_parser(sub: argparse._SubParsersAction) -> None:
    fw = sub.add_parser("firmware", help="build, sign, verify and inspect firmware bundles")
    fsub = fw.add_subparsers(dest="firmware_cmd", required=True)

    p = fsub.add_parser("keygen", help="make an Ed25519 signing key pair (private key mode 0600)")
    p.add_argument("--out", type=Path, required=True, help="directory for NAME.key and NAME.pub")
    p.add_argument("--name", default="signing")
    p.set_defaults(func=cmd_keygen)

    defaults = LayerConstants()
    p = fsub.add_parser("build", help="convert a GGUF, Hugging Face or ONNX Runtime GenAI model into a bundle")
    p.add_argument("--from", dest="source", type=Path, required=True, metavar="SOURCE")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--precision", choices=PRECISIONS, default="int8")
    p.add_argument("--target", choices=TARGETS, default="cpu")
    p.add_argument("--max-tokens-per-shard", type=int, default=defaults.max_tokens_per_shard)
    p.add_argument("--fallback-cpu-threshold", type=float, default=defaults.fallback_cpu_threshold)
    p.add_argument("--split-algorithm", choices=SPLIT_ALGORITHMS, default=defaults.split_algorithm)
    p.add_argument("--name", help="bundle name (default: the source's name)")
    p.add_argument("--version", default="1.0.0", help="bundle version")
    p.add_argument("--key", type=Path, help="sign with this private key after building")
    p.set_defaults(func=cmd_build)

    p = fsub.add_parser("sign", help="sign a bundle's manifest")
    p.add_argument("bundle", type=Path)
    p.add_argument("--key", type=Path, required=True)
    p.set_defaults(func=cmd_sign)

    for name, func, helptext in (
        ("verify", cmd_verify, "verify signature, every file and the constants"),
        ("inspect", cmd_inspect, "show name, version, files, constants and signer"),
    ):
        p = fsub.add_parser(name, help=helptext)
        p.add_argument("bundle", type=Path)
        p.add_argument("--trusted-keys", type=Path, default=DEFAULT_TRUSTED_KEYS,
                       help=f"directory of trusted *.pub keys (default {DEFAULT_TRUSTED_KEYS})")  # fmt: skip
        if name == "inspect":
            p.add_argument("--json", action="store_true", help="print the manifest as JSON")
        p.set_defaults(func=func)

    p = fsub.add_parser("install", help="verify a bundle, copy it into the store, make it current, restart the daemon")
    p.add_argument("bundle", type=Path)
    _store_args(p)
    p.set_defaults(func=cmd_install)
    p = fsub.add_parser("rollback", help="make the previous bundle current again and restart the daemon")
    _store_args(p)
    p.set_defaults(func=cmd_rollback)


def _store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trusted-keys", type=Path, default=DEFAULT_TRUSTED_KEYS,
                   help=f"directory of trusted *.pub keys (default {DEFAULT_TRUSTED_KEYS})")  # fmt: skip
    p.add_argument("--store", type=Path, default=DEFAULT_STORE,
                   help=f"where bundles and the current/previous links live (default {DEFAULT_STORE})")  # fmt: skip
    p.add_argument("--no-restart", action="store_true", help="switch only; do not restart zerolayer.service")


def cmd_install(args: argparse.Namespace) -> int:
    try:
        done = install(args.bundle, args.trusted_keys, no_restart if args.no_restart else restart_daemon, args.store)
    except InstallError as exc:
        print(f"zerolayer: {exc}", file=sys.stderr)
        return 1
    _report(done, args.store)
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    try:
        done = rollback(args.trusted_keys, no_restart if args.no_restart else restart_daemon, args.store)
    except InstallError as exc:
        print(f"zerolayer: {exc}", file=sys.stderr)
        return 1
    _report(done, args.store)
    return 0


def _report(done: Switched, store: Path) -> None:
    print(f"current:  {store / done.current}")
    print(f"previous: {store / done.previous if done.previous else '(none)'}")
    for name in done.removed:
        print(f"removed:  {store / name} (only current and previous are kept)")
    print(done.applied)


def cmd_keygen(args: argparse.Namespace) -> int:
    pair = generate_keypair(args.out, args.name)
    print(f"private key: {pair.private_path} (keep it off the appliance)")
    print(f"public key:  {pair.public_path} (install into /etc/zerolayer/trusted-keys/)")
    print(f"key id:      {pair.key_id}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    options = BuildOptions(
        precision=args.precision,
        target=args.target,
        layer=LayerConstants(args.max_tokens_per_shard, args.fallback_cpu_threshold, args.split_algorithm),
        name=args.name,
        version=args.version,
    )
    manifest = build(args.source, args.out, options, key=args.key)
    state = "signed" if args.key else "unsigned: run `zerolayer firmware sign`"
    print(f"built {manifest.name} {manifest.version} in {args.out} ({state})")
    return 0


def cmd_sign(args: argparse.Namespace) -> int:
    kid = sign(args.bundle, args.key)
    print(f"signed {args.bundle} with key {kid}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    manifest, signer = verify(args.bundle, args.trusted_keys)
    print(f"OK: {manifest.name} {manifest.version}, {len(manifest.files)} files, signed by key {signer}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    root: Path = args.bundle
    manifest_path = root / MANIFEST_NAME
    if not manifest_path.is_file():
        raise BundleError(f"{MANIFEST_NAME}: missing from {root}")
    manifest = parse_manifest(manifest_path.read_bytes())
    if args.json:
        sys.stdout.write(manifest_path.read_text())
        return 0
    try:
        signer = json.loads((root / SIGNATURE_NAME).read_bytes())["key_id"]
    except (OSError, ValueError, KeyError):
        signer = None
    try:
        verify(root, args.trusted_keys)
        status = "verified against the trusted keys"
    except BundleError as exc:
        status = f"NOT verified: {exc}"
    layer = manifest.layer
    print(f"name:        {manifest.name}")
    print(f"version:     {manifest.version}")
    print(f"source:      {', '.join(f'{k}={v}' for k, v in sorted(manifest.source.items())) or '-'}")
    print(f"signer:      {signer or 'unsigned'} ({status})")
    print("constants:")
    print(f"  max_tokens_per_shard   = {layer.max_tokens_per_shard}")
    print(f"  fallback_cpu_threshold = {layer.fallback_cpu_threshold}")
    print(f"  split_algorithm        = {layer.split_algorithm}")
    print(f"chat template: {len(manifest.chat_template)} characters")
    print("files:")
    for rel, entry in sorted(manifest.files.items()):
        print(f"  {entry.size:>12}  {entry.sha256[:16]}  {rel}")
    return 0
