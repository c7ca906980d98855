"""The `zerolayer` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from appliance import __version__
from firmware import BundleError
from firmware import cli as firmware_cli

DEMO_PROMPT = "What is the capital of France?"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerolayer", description="Zerolayer on-device inference appliance")
    parser.add_argument("--version", action="version", version=f"zerolayer {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING or ERROR")
    sub = parser.add_subparsers(dest="command", required=True)
    firmware_cli.add_parser(sub)

    p = sub.add_parser("generate", help="stream an answer from a firmware bundle to stdout")
    p.add_argument("prompt")
    p.add_argument("--firmware", type=Path, help="bundle directory (default: the demo firmware)")
    p.add_argument("--trusted-keys", type=Path,
                   help="trusted keys directory (default: the development key for the demo)")  # fmt: skip
    p.add_argument("--system", help="system prompt")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (the default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="a stop sequence (repeatable)")
    p.add_argument("--trace", action="store_true", help="print the decision trace to stderr")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("run-demo", help="build the demo firmware once, inspect it, and stream one answer")
    p.set_defaults(func=cmd_run_demo)
    return parser


def _resolve_firmware(firmware: Path | None, trusted: Path | None) -> tuple[Path, Path]:
    if firmware is None:
        from firmware.demo import demo_bundle

        firmware = demo_bundle()
    if trusted is None:
        from firmware.devkit import dev_trusted_keys

        trusted = dev_trusted_keys()
    return firmware, trusted


def cmd_generate(args: argparse.Namespace) -> int:
    from appliance.engine import Engine, GenerationRequest, Message, Prefilled, TextDelta
    from firmware import load

    path, trusted = _resolve_firmware(args.firmware, args.trusted_keys)
    bundle = load(path, trusted)
    request = GenerationRequest(
        messages=(Message("user", args.prompt),), system=args.system, max_tokens=args.max_tokens,
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
        stop_sequences=tuple(args.stop),
    )  # fmt: skip

    async def run() -> int:
        engine = Engine(bundle)
        try:
            stream = engine.submit(request)
            async for event in stream:
                if isinstance(event, TextDelta):
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
                elif isinstance(event, Prefilled) and args.trace:
                    print(event.trace.lines()[0], file=sys.stderr)
            sys.stdout.write("\n")
            done = stream.finished
            assert done is not None
            if args.trace:
                for line in done.trace.lines()[1:]:
                    print(line, file=sys.stderr)
            print(f"[{done.stop_reason}; {done.input_tokens} input tokens, {done.output_tokens} output tokens]",
                  file=sys.stderr)  # fmt: skip
            return 0
        finally:
            engine.close()

    return asyncio.run(run())


def cmd_run_demo(args: argparse.Namespace) -> int:
    path, trusted = _resolve_firmware(None, None)
    print(f"== demo firmware: {path}")
    firmware_cli.cmd_inspect(argparse.Namespace(bundle=path, trusted_keys=trusted, json=False))
    print(f"\n== zerolayer generate {DEMO_PROMPT!r}")
    return cmd_generate(build_parser().parse_args(["generate", DEMO_PROMPT, "--trace"]))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except BundleError as exc:
        print(f"zerolayer: firmware refused: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
