"""`zerolayer firmware ...`: keygen, build, sign, verify, inspect; on the box, install and rollback."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from firmware.bundle import verify
from firmware.errors import BundleError
from firmware.install import (
    CURRENT,
    DEFAULT_STORE,
    InstallError,
    Switched,
    install,
    no_restart,
    reload_daemon,
    remove,
    restart_daemon,
    rollback,
    serve_beside,
    slot_links,
)
from firmware.manifest import MANIFEST_NAME, SIGNATURE_NAME, SPLIT_ALGORITHMS, LayerConstants, Licence, parse_manifest
from firmware.signing import generate_keypair
from firmware.toolchain.build import BLOCK_SIZES, DEFAULT_BLOCK_SIZE, PRECISIONS, TARGETS, BuildOptions, build, sign

DEFAULT_TRUSTED_KEYS = Path("/etc/zerolayer/trusted-keys")
DEFAULT_CONFIG = Path("/etc/zerolayer")


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
    p.add_argument("--block-size", type=int, choices=BLOCK_SIZES, default=DEFAULT_BLOCK_SIZE,
                   help="weights per quantization block for int8/int4: larger blocks run faster, smaller ones "
                        f"stay closer to the source (default {DEFAULT_BLOCK_SIZE})")  # fmt: skip
    p.add_argument("--max-tokens-per-shard", type=int, default=defaults.max_tokens_per_shard)
    p.add_argument("--fallback-cpu-threshold", type=float, default=defaults.fallback_cpu_threshold)
    p.add_argument("--split-algorithm", choices=SPLIT_ALGORITHMS, default=defaults.split_algorithm)
    p.add_argument("--name", help="bundle name (default: the source's name)")
    p.add_argument("--version", default="1.0.0", help="bundle version")
    p.add_argument("--key", type=Path, help="sign with this private key after building")
    p.add_argument("--cuda-graph", action="store_true",
                   help="also export an fp16 CUDA graph of the same weights (into cuda/): a GPU runs it, the CPU "
                        "the --target cpu graph")  # fmt: skip
    p.add_argument("--chat-template", type=Path, metavar="FILE",
                   help="a Jinja chat template to ship instead of the source's own (a base model's GGUF has none)")
    p.add_argument("--eos-token", action="append", default=[], metavar="TOKEN",
                   help="a token that also ends generation, such as the template's end of turn (repeatable)")
    p.add_argument("--licence-name", help="the terms the model is used under, kept in the signed manifest")
    p.add_argument("--licence-url", default="", help="where those terms are published")
    p.add_argument("--licence-notice", default="", help="the notice to pass on with the model")
    p.add_argument("--licence-file", action="append", default=[], type=Path, metavar="FILE",
                   help="a file with the terms' text, packed under licence/ and signed (repeatable)")
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
    p = fsub.add_parser("remove", help="stop serving a bundle installed --beside NAME (reloads the daemon)")
    p.add_argument("beside", metavar="NAME")
    _store_args(p, slot_option=False)
    p.set_defaults(func=cmd_remove)


def _store_args(p: argparse.ArgumentParser, slot_option: bool = True) -> None:
    p.add_argument("--trusted-keys", type=Path, default=DEFAULT_TRUSTED_KEYS,
                   help=f"directory of trusted *.pub keys (default {DEFAULT_TRUSTED_KEYS})")  # fmt: skip
    p.add_argument("--store", type=Path, default=DEFAULT_STORE,
                   help=f"where bundles and the current/previous links live (default {DEFAULT_STORE})")  # fmt: skip
    p.add_argument("--no-restart", action="store_true", help="switch only; do not restart zerolayer.service")
    if slot_option:
        p.add_argument("--beside", metavar="NAME", default=CURRENT,
                       help="a slot of its own, served beside the current firmware as model NAME (a config "
                            "drop-in names it; the daemon reloads, others keep serving), not replacing it")  # fmt: skip
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                   help=f"config root whose conf.d serves slots beside current (default {DEFAULT_CONFIG})")  # fmt: skip


def _apply(args: argparse.Namespace) -> Callable[[], str]:
    """Current is applied by a restart (a new engine for the one model); a slot beside it by a
    reload, after the drop-in that serves it is in place."""
    if args.beside == CURRENT:
        return no_restart if args.no_restart else restart_daemon

    def reload() -> str:
        drop_in = serve_beside(args.config, args.beside, args.store)
        if args.no_restart:
            return f"{drop_in} serves it as model {args.beside} once the daemon reloads (--no-restart: not now)"
        return f"{drop_in} serves it as model {args.beside}; {reload_daemon()}"

    return reload


def cmd_install(args: argparse.Namespace) -> int:
    return _switch(args, lambda: install(args.bundle, args.trusted_keys, _apply(args), args.store, args.beside))


def cmd_rollback(args: argparse.Namespace) -> int:
    return _switch(args, lambda: rollback(args.trusted_keys, _apply(args), args.store, args.beside))


def _switch(args: argparse.Namespace, switch: Callable[[], Switched]) -> int:
    """Run an install or a rollback and report the store after it, or the one line that says why not."""
    try:
        done = switch()
    except InstallError as exc:
        print(f"zerolayer: {exc}", file=sys.stderr)
        return 1
    _report(done, args.store, args.beside)
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    drop_in = args.config / "conf.d" / f"60-firmware-{args.beside}.toml"

    def apply() -> str:  # the daemon stops serving it first, so the links may go
        drop_in.unlink(missing_ok=True)
        return no_restart() if args.no_restart else reload_daemon()

    try:
        slot_links(args.beside)
        applied = apply()
        removed = remove(args.beside, lambda: applied, args.store)
    except InstallError as exc:
        print(f"zerolayer: {exc}", file=sys.stderr)
        return 1
    print(f"no longer served: {args.beside} (removed {drop_in})")
    for name in removed:
        print(f"removed:  {args.store / name}")
    print(applied)
    return 0


def _report(done: Switched, store: Path, slot: str = CURRENT) -> None:
    now, before = slot_links(slot)
    print(f"{now}:  {store / done.current}")
    print(f"{before}: {store / done.previous if done.previous else '(none)'}")
    for name in done.removed:
        print(f"removed:  {store / name} (only the bundles some slot's current or previous link names are kept)")
    print(done.applied)


def cmd_keygen(args: argparse.Namespace) -> int:
    pair = generate_keypair(args.out, args.name)
    print(f"private key: {pair.private_path} (keep it off the appliance)")
    print(f"public key:  {pair.public_path} (install into /etc/zerolayer/trusted-keys/)")
    print(f"key id:      {pair.key_id}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    if (args.licence_file or args.licence_url or args.licence_notice) and not args.licence_name:
        raise BundleError("--licence-url, --licence-notice and --licence-file need --licence-name")
    licence = (Licence(args.licence_name, args.licence_url, args.licence_notice,
                       tuple(f"licence/{f.name}" for f in args.licence_file))
               if args.licence_name else None)  # fmt: skip
    try:
        template = args.chat_template.read_text(encoding="utf-8") if args.chat_template else None
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError(f"--chat-template {args.chat_template}: {exc}") from None
    options = BuildOptions(
        precision=args.precision,
        target=args.target,
        layer=LayerConstants(args.max_tokens_per_shard, args.fallback_cpu_threshold, args.split_algorithm),
        name=args.name,
        version=args.version,
        chat_template=template,
        eos_tokens=tuple(args.eos_token),
        licence=licence,
        licence_files=tuple(args.licence_file),
        cuda_graph=args.cuda_graph,
        block_size=args.block_size,
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
    if manifest.tool_use_template is not None:
        print(f"tool-use template: {len(manifest.tool_use_template)} characters (for requests with tools)")
    if manifest.licence is not None:
        terms = manifest.licence
        print(f"licence:     {terms.name}" + (f" ({terms.url})" if terms.url else ""))
        if terms.notice:
            print(f"  notice:    {terms.notice}")
        for rel in terms.files:
            print(f"  text:      {rel}")
    print("files:")
    for rel, entry in sorted(manifest.files.items()):
        print(f"  {entry.size:>12}  {entry.sha256[:16]}  {rel}")
    return 0
