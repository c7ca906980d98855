"""The `zerolayer` command."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from appliance import __version__
from appliance.client import DaemonUnreachable
from appliance.config import EX_CONFIG, ConfigError
from appliance.kernel import KernelLayerError
from firmware import BundleError
from firmware import cli as firmware_cli

DEMO_PROMPT = "What is the capital of France?"
EX_UNAVAILABLE = 69  # sysexits.h: a service this one needs (here the kernel's eBPF) is unavailable


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

    p = sub.add_parser("serve", help="run the daemon (what systemd runs)")
    p.add_argument("--config", type=Path, help="config root or file (default $ZEROLAYER_CONFIG or /etc/zerolayer)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("config", help="check the configuration")
    csub = p.add_subparsers(dest="config_cmd", required=True)
    c = csub.add_parser("check", help="print the merged config with where each value came from, or the errors")
    c.add_argument("--config", type=Path)
    c.set_defaults(func=cmd_config_check)

    p = sub.add_parser("keys", help="API keys for network clients")
    ksub = p.add_subparsers(dest="keys_cmd", required=True)
    for name, helptext in (("add", "create a key (printed once; only its hash is stored)"),
                           ("list", "list key names"), ("revoke", "remove a key")):  # fmt: skip
        k = ksub.add_parser(name, help=helptext)
        if name != "list":
            k.add_argument("name")
        if name == "add":
            k.add_argument("--debug", action="store_true", help="this key may see decision traces")
        k.add_argument("--file", type=Path, default=Path("/etc/zerolayer/api-keys"))
        k.set_defaults(func=cmd_keys, keys_action=name)

    p = sub.add_parser("tls", help="TLS helpers")
    tsub = p.add_subparsers(dest="tls_cmd", required=True)
    t = tsub.add_parser("dev-cert", help="make a development CA and a server certificate (CA:FALSE leaf)")
    t.add_argument("--out", type=Path, default=Path("/etc/zerolayer/tls"))
    t.add_argument("--host", action="append", help="DNS name or IP for the certificate (repeatable)")
    t.set_defaults(func=cmd_dev_cert)

    p = sub.add_parser("debug", help="send a request and print the decision trace, then the answer")
    p.add_argument("call", choices=["messages.create"])
    p.add_argument("--model", help="default: the model the appliance serves")
    p.add_argument("--prompt", default="What is the capital of France?")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--verbose", action="store_true", help="also print every server-sent event")
    _client_args(p)
    p.set_defaults(func=cmd_debug)

    p = sub.add_parser("status", help="devices and memory, placement, firmware, listeners, streams, kernel")
    _client_args(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("image", help="the appliance image: a Debian root with Zerolayer installed, ext4 and GPT images")
    isub = p.add_subparsers(dest="image_cmd", required=True)
    i = isub.add_parser("build", help="build the root, its tar, ext4 and GPT disk images, manifest and SHA256SUMS")
    i.add_argument("--arch", choices=["amd64", "arm64"], required=True, help="arm64 is for Jetson (L4T)")
    i.add_argument("--firmware", type=Path, required=True, help="the signed bundle the image serves")
    i.add_argument("--out", type=Path, required=True, help="output directory")
    i.add_argument("--trusted-keys", type=Path, help="directory of the *.pub firmware keys the box trusts")
    i.add_argument("--update-ca", type=Path,
                   help="amd64: the CA certificate (PEM) whose code-signing leaves may sign system updates")
    i.add_argument("--dev", action="store_true",
                   help="trust this machine's development firmware key and update CA instead (said in the "
                        "image's manifest and in `zerolayer status`)")  # fmt: skip
    i.add_argument("--version", dest="image_version", default=__version__, help="the image's version")
    i.add_argument("--mirror", help="Debian mirror URL (default: the one this machine's apt sources name)")
    i.set_defaults(func=cmd_image_build)
    i = isub.add_parser("bundle", help="amd64: a signed RAUC system update of a built image's root")
    i.add_argument("--image", type=Path, required=True, help="an `image build` output directory (the newer root)")
    i.add_argument("--out", type=Path, required=True, help="the bundle file to write (NAME.raucb)")
    i.add_argument("--cert", type=Path, help="the signer: a code-signing certificate of the update CA")
    i.add_argument("--key", type=Path, help="the signer's private key")
    i.add_argument("--ca", type=Path, help="the update CA, to check the bundle as the box will")
    i.add_argument("--dev", action="store_true", help="sign with this machine's development update CA")
    i.set_defaults(func=cmd_image_bundle)

    p = sub.add_parser("system", help="on an A/B image: the root slots, system updates (RAUC)")
    ssub = p.add_subparsers(dest="system_cmd", required=True)
    s = ssub.add_parser("status", help="both root slots: which is booted, good or bad, their versions")
    s.add_argument("--json", action="store_true", help="rauc's own status, parsed, as JSON")
    s.set_defaults(func=cmd_system_status)
    s = ssub.add_parser("update", help="install a system update bundle into the inactive slot (rauc install)")
    s.add_argument("bundle", type=Path)
    s.add_argument("--reboot", action="store_true", help="reboot into it once installed")
    s.set_defaults(func=cmd_system_update)
    s = ssub.add_parser("mark-boot", help="mark the booted slot good once the daemon serves, else bad and reboot "
                        "(what zerolayer-slot-health.service runs)")  # fmt: skip
    s.add_argument("--timeout", type=float, default=600, help="seconds to wait for the daemon to serve")
    s.add_argument("--socket", default="/run/zerolayer/api.sock")
    s.set_defaults(func=cmd_system_mark_boot)

    p = sub.add_parser("install", help="lay out and start the appliance on this Debian/Ubuntu host (as root; "
                       "scripts/install.sh makes the virtualenv and runs this)")  # fmt: skip
    p.add_argument("--firmware", type=Path, required=True, help="the signed bundle to serve")
    p.add_argument("--trusted-keys", type=Path, required=True, help="directory of *.pub keys the box trusts")
    p.add_argument("--no-start", action="store_true", help="enable the units, start nothing")
    p.set_defaults(func=cmd_install)

    p = sub.add_parser("run-demo", help="build the demo firmware once, then serve it on localhost")
    p.add_argument("--port", type=int, default=8443)
    p.add_argument("--model", choices=[*DEMO_MODELS, "all"], default="smollm2",
                   help="which demo model to serve (each built once and cached); all: every one, side by side")
    p.set_defaults(func=cmd_run_demo)
    return parser


def _client_args(p: argparse.ArgumentParser) -> None:
    from appliance.client import DEFAULT_SOCKET

    p.add_argument("--socket", help=f"the daemon's Unix socket (default $ZEROLAYER_SOCKET, {DEFAULT_SOCKET}, or the "
                   "development daemon's that `make run` starts)")  # fmt: skip
    p.add_argument("--url", help="https://HOST:PORT: use HTTP/3 instead of the socket")
    p.add_argument("--api-key", default=os.environ.get("ZEROLAYER_API_KEY"),
                   help="for --url (default $ZEROLAYER_API_KEY); the trace needs a key made with --debug")  # fmt: skip
    p.add_argument("--ca", help="CA certificate for --url")


def _client(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from appliance.client import ApplianceClient, find_socket

    return ApplianceClient(find_socket(args.socket), args.url, args.api_key, args.ca)


def cmd_debug(args: argparse.Namespace) -> int:
    client = _client(args)
    model = args.model
    if model is None:
        status, models = client.get_json("/v1/models")
        if status != 200:
            print(f"zerolayer: /v1/models answered {status}: {models}", file=sys.stderr)
            return 1
        model = models["data"][0]["id"]
    body = {"model": model, "max_tokens": args.max_tokens, "stream": True,
            "messages": [{"role": "user", "content": args.prompt}]}  # fmt: skip
    reply = client.request("POST", "/v1/messages", body, {"zerolayer-debug": "1", "anthropic-version": "2023-06-01"})
    if reply.status != 200:
        print(f"zerolayer: the appliance answered {reply.status}: {' '.join(reply.lines)}", file=sys.stderr)
        return 1
    answer, traced = [], False
    for line in reply.lines:
        if args.verbose and line:
            print(f"  {line}", file=sys.stderr)
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        if event.get("type") == "zerolayer_debug":
            traced = True
            for trace_line in event["lines"]:
                print(trace_line)
        elif event.get("type") == "content_block_delta":
            answer.append(event["delta"]["text"])
        elif event.get("type") == "error":
            print(f"zerolayer: generation failed: {event['error']['message']}", file=sys.stderr)
            return 1
    if not traced:
        print("(no trace: the socket is not local, or the API key is not a debug key)", file=sys.stderr)
    print("".join(answer))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    status, info = _client(args).get_json("/status")
    if status != 200:
        print(f"zerolayer: /status answered {status}: {info}", file=sys.stderr)
        return 1
    place = info["placement"]
    for fw in info.get("models") or [{**info["firmware"], "model": info["firmware"]["name"],
                                      "devices": info["devices"]}]:  # fmt: skip
        alias = f" as model {fw['model']}" if fw["model"] != fw["name"] else ""
        print(f"firmware:   {fw['name']} {fw['version']}{alias} (signer {fw['signer']}) at {fw['path']}")
        print("constants:  " + ", ".join(f"{k}={v}" for k, v in fw["constants"].items()))
        for device, d in fw["devices"].items():
            dead = "" if d["alive"] else ", WORKER DEAD"
            print(f"device:     {device}: {d['active']} active, {d['queued']} queued{dead}")
    for m in info["memory"] or [{"device": "gpu", "ratio": None}]:
        shown = "no GPU" if m["ratio"] is None else (
            f"{m['used'] / 2**30:.1f}/{m['total'] / 2**30:.1f} GiB ({m['ratio']:.0%})")  # fmt: skip
        print(f"memory:     {m['device']}: {shown}")
    print(f"placement:  new requests -> {place['now']} (probe {place['probe']}, policy {place['policy']}, "
          f"threshold {place['threshold']}, hysteresis {place['hysteresis']})")  # fmt: skip
    for name, where in info["listeners"].items():
        print(f"listener:   {name}: {where}")
    print(f"streams:    {info['active_streams']} active")
    print(f"kernel:     {info['kernel']}")
    image = info.get("image") or {}
    if image:
        trust = ("DEVELOPMENT image: it trusts development firmware and update keys" if image.get("dev")
                 else "release keys")  # fmt: skip
        print(f"image:      {image.get('version', '?')} {image.get('arch', '')} ({trust})")
    return 0


def _resolve_firmware(firmware: Path | None, trusted: Path | None) -> tuple[Path, Path]:
    if firmware is None:
        from firmware.toolchain.demo import demo_bundle

        firmware = demo_bundle()
    if trusted is None:
        from firmware.toolchain.devkit import dev_trusted_keys

        trusted = dev_trusted_keys()
    return firmware, trusted


def cmd_generate(args: argparse.Namespace) -> int:
    from appliance.engine import Engine, EngineConfig, GenerationRequest, InvalidRequest, Message, Prefilled, TextDelta
    from firmware import load

    path, trusted = _resolve_firmware(args.firmware, args.trusted_keys)
    bundle = load(path, trusted)
    request = GenerationRequest(
        messages=(Message("user", args.prompt),), system=args.system, max_tokens=args.max_tokens,
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
        stop_sequences=tuple(args.stop),
    )  # fmt: skip

    async def run() -> int:
        engine = Engine(bundle, EngineConfig(prefill_lane=False))  # one request: nothing runs beside its prompt
        try:
            try:
                stream = engine.submit(request)
            except InvalidRequest as exc:  # a parameter out of range, or more than the context holds
                print(f"zerolayer generate: {exc}", file=sys.stderr)
                return 2
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


def _load_config(path: Path | None):  # type: ignore[no-untyped-def]
    from appliance.config import load_config

    return load_config(path)


def cmd_serve(args: argparse.Namespace) -> int:
    from appliance.daemon import serve
    from appliance.engine.errors import ProviderError

    try:
        return serve(args.config)
    except ProviderError as exc:  # a GPU session that is not what was asked for: refuse to serve on it
        print(f"zerolayer: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE


def cmd_config_check(args: argparse.Namespace) -> int:
    from appliance.config import toml_value, walk

    config = _load_config(args.config)
    section = None
    for s in walk(config):
        if s.section != section:
            section = s.section
            print(f"[{section}]")
        line = f"{s.key} = {toml_value(s.value)}"
        print(f"{line:<64} # {config.sources.get(s.name, 'default')}")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from appliance.api.auth import KeyStore, add_key, revoke_key

    if args.keys_action == "add":
        key = add_key(args.file, args.name, args.debug)
        print(key)
        print(f"stored the hash of key {args.name!r} in {args.file}; the key is shown only this once", file=sys.stderr)
    elif args.keys_action == "list":
        for k in KeyStore.load(args.file).keys:
            print(f"{k.name}{'  (debug)' if k.debug else ''}")
    elif not revoke_key(args.file, args.name):
        print(f"zerolayer: no key named {args.name!r} in {args.file}", file=sys.stderr)
        return 1
    return 0


def cmd_dev_cert(args: argparse.Namespace) -> int:
    from appliance.tls import DEV_HOSTS, make_dev_cert

    cert = make_dev_cert(args.out, args.host or DEV_HOSTS)
    print(f"CA (give it to clients): {cert.ca_cert}\nserver certificate: {cert.cert}\nserver key: {cert.key}")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    import os

    from appliance.install import install_host

    if os.geteuid() != 0:
        print("zerolayer: install needs root (users, units, /etc/zerolayer): run it with sudo", file=sys.stderr)
        return 77  # EX_NOPERM
    try:
        key = install_host(args.firmware, args.trusted_keys, start=not args.no_start)
    except (RuntimeError, FileNotFoundError, LookupError) as exc:
        print(f"zerolayer: install failed: {exc}", file=sys.stderr)
        return 1
    if key is not None:
        print(f"API key (shown once; `zerolayer keys add NAME` makes more): {key}")
    return 0


def _image_checkout() -> bool:
    # The image builder is a build host's tool: it lives in the checkout (image/), not the package.
    checkout = Path(__file__).resolve().parents[1]
    if not (checkout / "image" / "build.py").is_file():
        print("zerolayer: image build runs from a Zerolayer checkout (make image); this install has no image/",
              file=sys.stderr)  # fmt: skip
        return False
    sys.path.insert(0, str(checkout))
    return True


def cmd_image_build(args: argparse.Namespace) -> int:
    if not _image_checkout():
        return 1
    from firmware.toolchain.paths import cache_dir
    from image.build import build_image
    from image.update import dev_update_signer

    trusted, update_ca = args.trusted_keys, args.update_ca
    if args.dev:
        from firmware.toolchain.devkit import dev_trusted_keys

        trusted = trusted or dev_trusted_keys()
        update_ca = update_ca or (dev_update_signer(cache_dir()).ca if args.arch == "amd64" else None)
        print(f"zerolayer: a development image: it trusts {trusted}" + (f" and the update CA {update_ca}"
              if update_ca else ""), file=sys.stderr)  # fmt: skip
    elif trusted is None or (args.arch == "amd64" and update_ca is None):
        print("zerolayer: image build needs the keys the box will trust: --trusted-keys DIR" +
              (" and --update-ca CA.pem" if args.arch == "amd64" else "") +
              ", or --dev for this machine's development keys", file=sys.stderr)  # fmt: skip
        return 2
    try:
        image = build_image(args.arch, args.firmware, args.out, trusted, update_ca=update_ca, dev=args.dev,
                            version=args.image_version, mirror=args.mirror, cache=cache_dir())  # fmt: skip
    except (PermissionError, FileNotFoundError, LookupError, RuntimeError, ValueError) as exc:
        print(f"zerolayer: image build failed: {exc}", file=sys.stderr)
        return 1
    for path in (image.tar, image.ext4, image.disk, image.manifest, image.sums):
        print(path)
    print(f"root tree: {image.root} (to try it: systemd-nspawn -D {image.root} --boot --volatile=overlay "
          "--private-network; see image/README.md)")  # fmt: skip
    return 0


def cmd_image_bundle(args: argparse.Namespace) -> int:
    if not _image_checkout():
        return 1
    import json

    from firmware.toolchain.paths import cache_dir
    from image.update import UpdateSigner, dev_update_signer, make_bundle

    if args.dev:
        signer = dev_update_signer(cache_dir())
    elif args.cert and args.key and args.ca:
        signer = UpdateSigner(args.ca, args.cert, args.key)
    else:
        print("zerolayer: image bundle needs --cert, --key and --ca (the update CA), or --dev", file=sys.stderr)
        return 2
    try:
        doc = json.loads((args.image / "manifest.json").read_text())
        if doc.get("arch") != "amd64" or doc.get("update_ca") is None:
            raise ValueError(f"{args.image} is not an amd64 A/B image (its manifest names no update CA)")
        root_fs = args.image / f"zerolayer-{doc['version']}-amd64.ext4"
        out = make_bundle(root_fs, doc["version"], signer, args.out)
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        print(f"zerolayer: image bundle failed: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


def cmd_system_status(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from appliance import system

    try:
        status = system.read_status()
    except (OSError, RuntimeError) as exc:
        print(f"zerolayer: {exc} (is this an A/B image?)", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**dataclasses.asdict(status), "image": system.image_info()}, indent=2))
    else:
        print("\n".join(system.render(status, system.image_info())))
    return 0


def cmd_system_update(args: argparse.Namespace) -> int:
    from appliance import system

    try:
        return system.update(args.bundle, args.reboot)
    except (OSError, RuntimeError) as exc:
        print(f"zerolayer: {exc}", file=sys.stderr)
        return 1


def cmd_system_mark_boot(args: argparse.Namespace) -> int:
    from appliance import system

    def log(line: str) -> None:
        print(f"zerolayer system mark-boot: {line}", flush=True)

    try:
        return system.mark_boot(args.timeout, args.socket, log)
    except (OSError, RuntimeError) as exc:
        log(str(exc))
        return 1


def _smollm2() -> Path:
    from firmware.toolchain.demo import demo_bundle

    return demo_bundle()


def _gemma3() -> Path:
    from firmware.toolchain.gemma import gemma_bundle

    return gemma_bundle()


# The demo models `run-demo --model` (and `make run MODEL=`) serves: name -> their cached bundle.
DEMO_MODELS: dict[str, Callable[[], Path]] = {"smollm2": _smollm2, "gemma3": _gemma3}


def cmd_run_demo(args: argparse.Namespace) -> int:
    from appliance.config import load_config
    from appliance.daemon import Daemon
    from appliance.devsetup import write_dev_config
    from firmware import load
    from firmware.toolchain.devkit import dev_trusted_keys
    from firmware.toolchain.paths import cache_dir

    trusted = dev_trusted_keys()
    names = list(DEMO_MODELS) if args.model == "all" else [args.model]
    paths = {}
    for name in names:
        paths[name] = DEMO_MODELS[name]()
        print(f"== demo firmware ({name}): {paths[name]}")
        firmware_cli.cmd_inspect(argparse.Namespace(bundle=paths[name], trusted_keys=trusted, json=False))
    served = {load(path, trusted).name: path for path in paths.values()}  # each under its manifest's name
    first, *others = served
    dev = write_dev_config(cache_dir() / "demo-appliance", served[first], trusted, tcp=f"127.0.0.1:{args.port}",
                           quic=f"127.0.0.1:{args.port}", kernel="auto",
                           bundles={name: served[name] for name in others})  # fmt: skip
    config = load_config(dev.root)
    print(DEMO_USAGE.format(port=args.port, key=dev.api_key, ca=dev.ca_cert, sock=dev.unix_socket,
                            model=first, root=dev.root, bin=Path(sys.executable).parent), flush=True)  # fmt: skip
    if others:
        print(f"== also serving: {', '.join(others)} (ask for it by name in \"model\")", flush=True)
    logging.getLogger().setLevel(logging.INFO)
    daemon = Daemon(config, status=lambda line: print(f"zerolayer: {line}", flush=True), config_root=dev.root)
    return asyncio.run(daemon.run())


DEMO_USAGE = """
== serving the demo firmware (config in {root}); Ctrl-C stops it.
== in another shell, paste these (the README's examples use them):
export KEY={key} CA={ca} SOCK={sock}
export ZEROLAYER_CONFIG={root} ZEROLAYER_SOCKET={sock} PATH={bin}:$PATH
== then, for example: zerolayer status; zerolayer debug messages.create --prompt 'Capital of France?'
API key: {key}
  curl --cacert {ca} https://localhost:{port}/v1/messages -H 'x-api-key: {key}' \\
       -H 'content-type: application/json' \\
       -d '{{"model": "{model}", "max_tokens": 64, "messages": [{{"role": "user", "content": "Capital of France?"}}]}}'
  curl --unix-socket {sock} http://localhost/v1/chat/completions -H 'content-type: application/json' \\
       -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Capital of France?"}}]}}'
  HTTP/3: udp 127.0.0.1:{port} (niquests, or any h3 client trusting {ca})
"""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except BundleError as exc:
        print(f"zerolayer: firmware refused: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print("zerolayer: bad configuration:\n  " + "\n  ".join(exc.problems), file=sys.stderr)
        return EX_CONFIG
    except KernelLayerError as exc:
        print(f"zerolayer: {exc}\nzerolayer: kernel.mode = \"required\" needs CAP_BPF and CAP_NET_ADMIN (or "
              "root) and bpffs; kernel.mode = \"auto\" serves with the userspace flow table instead",
              file=sys.stderr)  # fmt: skip
        return EX_UNAVAILABLE
    except DaemonUnreachable as exc:
        print(f"zerolayer: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a path missing, unwritable or not what it should be: one line, not a traceback
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"zerolayer: {where}{exc.strerror or exc}", file=sys.stderr)
        logging.getLogger(__name__).debug("the error in full", exc_info=exc)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
