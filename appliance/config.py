"""Configuration: /etc/zerolayer/zerolayer.toml, then conf.d/*.toml in name order, each overriding
the last. Parsed once into frozen dataclasses; every mistake names the file and key."""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import json
import os
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from firmware.install import SLOT_NAME

DEFAULT_ROOT = Path("/etc/zerolayer")
EX_CONFIG = 78


def setting(default: Any, doc: str) -> Any:
    """A config key: its default and the one line the README's reference shows for it."""
    return field(default=default, metadata={"doc": doc})


class ConfigError(Exception):
    """One or more problems, each naming file:key."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class BundleTable(tuple[tuple[str, Path], ...]):
    """A TOML table of model name -> bundle path ([firmware.bundles]), kept as sorted pairs so the
    config stays frozen and comparable."""



@dataclass(frozen=True)
class FirmwareSection:
    path: Path | None = setting(Path("/usr/lib/zerolayer/firmware/current"),
                                'the bundle to load, served under its manifest name; `""`: only `firmware.bundles`')
    bundles: BundleTable = setting(BundleTable(), 'more bundles served beside it: a table `[firmware.bundles]` of '
                                                  'model name = bundle path; drop-ins add, `name = ""` removes')
    trusted_keys: Path = setting(Path("/etc/zerolayer/trusted-keys"), 'directory of trusted `*.pub` signing keys')


@dataclass(frozen=True)
class ListenSection:
    quic: str = setting("[::]:8443", 'HTTP/3 (UDP) `HOST:PORT`; `""` turns it off')
    tcp: str = setting("[::]:8443", 'HTTPS (HTTP/1.1, HTTP/2) `HOST:PORT`; `""` turns it off')
    unix: str = setting("/run/zerolayer/api.sock", 'Unix socket for local clients (no API key); `""` turns it off')
    unix_mode: str = setting("0660", "the socket's mode, octal")


@dataclass(frozen=True)
class TlsSection:
    cert: Path = setting(Path("/etc/zerolayer/tls/server.crt"), 'server certificate (PEM)')
    key: Path = setting(Path("/etc/zerolayer/tls/server.key"), 'server private key (PEM, 0600)')
    client_ca: Path | None = setting(None, 'require client certificates signed by this CA (mTLS on TCP and QUIC)')


@dataclass(frozen=True)
class AuthSection:
    required: bool = setting(True, 'network clients need an API key; false only for a lab')
    keys_file: Path = setting(Path("/etc/zerolayer/api-keys"), 'hashed API keys (`zerolayer keys add`)')


@dataclass(frozen=True)
class LimitsSection:
    max_body_bytes: int = setting(1 << 20, 'larger request bodies get 413')
    max_queued: int = setting(64, 'requests waiting per device before 429/529')
    max_active_per_device: int = setting(8, 'slots: requests a device decodes together in one batch')
    quic_idle_timeout: float = setting(60.0, 'seconds before an idle QUIC connection is closed')
    quic_max_connections: int = setting(1024, 'QUIC connections at once; more are refused')
    quic_max_streams: int = setting(128, 'concurrent streams per QUIC connection')
    quic_retry: str = setting("auto", 'validate client addresses with a Retry first: "auto" (once a quarter of the '
                                      'handshake budget is in use), "always" or "never"')  # fmt: skip
    quic_max_handshakes: int = setting(64, 'QUIC handshakes in progress at once; more new connections are refused')
    quic_handshake_timeout: float = setting(10.0, 'seconds a QUIC handshake may take before its state is dropped')
    drain_timeout: float = setting(30.0, 'seconds in-flight requests get to finish on SIGTERM')


@dataclass(frozen=True)
class EngineSection:
    max_tokens_per_shard: int = setting(0, "0: the firmware's baked value; config may only lower it")
    prefix_cache_mb: int = setting(256, 'KV prefix pool size in MiB; 0 turns reuse off')
    kv_cache_mb: int = setting(0, "KV cache of the running requests per device, in MiB; admission counts prompt + "
                                  "max_tokens against it; 0: every slot at the model's full context")  # fmt: skip
    threads: int = setting(0, 'ONNX Runtime intra-op threads; 0: one per CPU')
    tensorrt: bool = setting(False, 'run GPU sessions through TensorRT (libnvinfer must be installed); CUDA alone '
                                    'otherwise')  # fmt: skip
    prefill_lane: bool = setting(True, "on the CPU with 2+ threads, a long prompt prefills on half the cores "
                                       "beside the decoding streams on the other half; this holds the weights "
                                       "once more in memory (twice more from 3 threads); false: its chunks run "
                                       "between their steps")  # fmt: skip


@dataclass(frozen=True)
class GovernorSection:
    threshold: float = setting(0.0, "GPU memory ratio that sends new requests to the CPU; 0: the firmware's "
                                    "baked fallback_cpu_threshold; may only lower it")  # fmt: skip
    hysteresis: float = setting(0.05, "back to the GPU only below threshold minus this")
    interval_ms: int = setting(100, "memory sampling interval")
    policy: str = setting("auto", "over the threshold: cpu (run on the CPU) or shed (wait); auto: shed on Jetson")


@dataclass(frozen=True)
class KernelSection:
    mode: str = setting("auto", "required, auto (fall back to userspace, said once) or off")
    interfaces: tuple[str, ...] = setting(("auto",), "where the tc programs attach; auto: those carrying the "
                                                    "bound addresses, loopback included")  # fmt: skip
    allowlist: tuple[str, ...] = setting((), "client prefixes (CIDR, IPv4 and IPv6) allowed to reach the service "
                                             "ports; empty: allow all")  # fmt: skip
    xdp: str = setting("off", "also enforce the allowlist in XDP: off, generic or native")
    flow_idle_seconds: float = setting(600.0, "a flow's digests are forgotten after this long idle")
    pin_dir: str = setting("", "where the eBPF maps are pinned, a directory on bpffs; empty: /run/zerolayer/bpf "
                               "where the systemd unit binds /sys/fs/bpf/zerolayer, else that directory itself")


@dataclass(frozen=True)
class StateSection:
    dir: Path = setting(Path("/var/lib/zerolayer"), 'state: QUIC session tickets')


@dataclass(frozen=True)
class MetricsSection:
    require_auth: bool = setting(True, "/metrics over TCP and HTTP/3 needs an API key (the Unix socket never does)")


@dataclass(frozen=True)
class LogSection:
    level: str = setting("info", 'debug, info, warning or error')


@dataclass(frozen=True)
class Config:
    firmware: FirmwareSection = field(default_factory=FirmwareSection)
    listen: ListenSection = field(default_factory=ListenSection)
    tls: TlsSection = field(default_factory=TlsSection)
    auth: AuthSection = field(default_factory=AuthSection)
    limits: LimitsSection = field(default_factory=LimitsSection)
    engine: EngineSection = field(default_factory=EngineSection)
    governor: GovernorSection = field(default_factory=GovernorSection)
    kernel: KernelSection = field(default_factory=KernelSection)
    state: StateSection = field(default_factory=StateSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    log: LogSection = field(default_factory=LogSection)
    sources: dict[str, str] = field(default_factory=dict, compare=False)  # "section.key" -> file


_RANGES: dict[str, tuple[float, float]] = {
    "limits.max_body_bytes": (1024, 1 << 30),
    "limits.max_queued": (1, 100_000),
    "limits.max_active_per_device": (1, 256),
    "limits.quic_idle_timeout": (1, 3600),
    "limits.quic_max_connections": (1, 1_000_000),
    "limits.quic_max_streams": (1, 10_000),
    "limits.quic_max_handshakes": (1, 1_000_000),
    "limits.quic_handshake_timeout": (0.5, 600),
    "limits.drain_timeout": (0, 3600),
    "engine.max_tokens_per_shard": (0, 1 << 20),
    "engine.prefix_cache_mb": (0, 1 << 20),
    "engine.kv_cache_mb": (0, 1 << 24),
    "engine.threads": (0, 1024),
    "governor.threshold": (0, 0.99),
    "governor.hysteresis": (0, 0.5),
    "governor.interval_ms": (10, 60_000),
}
_LEVELS = ("debug", "info", "warning", "error")
RETRY_MODES = ("auto", "always", "never")


@dataclass(frozen=True)
class Setting:
    section: str
    key: str
    value: Any
    doc: str

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"


def walk(config: Config) -> Iterator[Setting]:
    """Every setting of a config, section by section, in schema order (the one walk the reference
    table, `config check` and the image's commented default config share)."""
    for section in dataclasses.fields(Config):
        if section.name == "sources":
            continue
        values = getattr(config, section.name)
        for f in dataclasses.fields(values):
            yield Setting(section.name, f.name, getattr(values, f.name), f.metadata.get("doc", ""))


def toml_value(value: Any) -> str:
    """A value as TOML a user could paste back (None: the empty string, which turns an option off)."""
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, BundleTable):
        return "{" + ", ".join(f"{json.dumps(k)} = {json.dumps(str(v))}" for k, v in value) + "}"
    if isinstance(value, list | tuple):
        return json.dumps([str(v) for v in value])
    return json.dumps(str(value))


def reference_table() -> str:
    """The README's config reference, made from the schema so the two cannot drift."""
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]
    for s in walk(Config()):
        if isinstance(s.value, BundleTable):
            shown = toml_value(s.value)
        elif isinstance(s.value, tuple):
            shown = json.dumps(list(s.value))
        else:
            shown = "none" if s.value is None else str(s.value).lower() if isinstance(s.value, bool) else str(s.value)
        rows.append(f"| `{s.name}` | `{shown}` | {s.doc} |")
    return "\n".join(rows)


def config_files(root: Path) -> list[Path]:
    files = [root / "zerolayer.toml"] if (root / "zerolayer.toml").is_file() else []
    return files + sorted((root / "conf.d").glob("*.toml"))


def parse_address(value: str) -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    return host.strip("[]") or "::", int(port)


def _closest(key: str, known: list[str]) -> str:
    match = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {match[0]!r}?)" if match else f" (known: {', '.join(known)})"


def _coerce(value: Any, kind: Any, where: str) -> Any:
    text = str(kind)
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    if kind is BundleTable:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a table of model name = bundle path, got {value!r}")
        pairs = []
        for name, path in value.items():
            if not SLOT_NAME.fullmatch(name):  # a model's name is also its slot's in the firmware store
                raise ValueError(f"{where}: {name!r} is not a model name (letters, digits, '.', '_', ':', '-')")
            if not isinstance(path, str):
                raise ValueError(f"{where}.{name}: expected a path string, got {path!r}")
            if path:  # "" removes a bundle an earlier file named
                pairs.append((name, Path(path)))
        return BundleTable(sorted(pairs))
    if "tuple" in text:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{where}: expected a list of strings, got {value!r}")
        return tuple(value)
    if "Path" in text:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a path string, got {value!r}")
        if value == "" and "None" in text:
            return None
        return Path(value)
    raise ValueError(f"{where}: unsupported type {text}")


def load_config(root: Path | None = None, check_paths: bool = True) -> Config:
    """Merge the files under root (default $ZEROLAYER_CONFIG or /etc/zerolayer) and validate."""
    root = root or Path(os.environ.get("ZEROLAYER_CONFIG", DEFAULT_ROOT))
    files = [root] if root.is_file() else config_files(root)  # --config may name one file
    merged: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    problems: list[str] = []
    sections = {f.name: f.type for f in dataclasses.fields(Config) if f.name != "sources"}
    for path in files:
        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            problems.append(f"{path}: not UTF-8 text (byte {exc.start}): TOML files must be UTF-8")
            continue
        except (OSError, tomllib.TOMLDecodeError) as exc:
            problems.append(f"{path}: {exc}")
            continue
        for section, table in doc.items():
            if section not in sections:
                problems.append(f"{path}: unknown section [{section}]{_closest(section, list(sections))}")
                continue
            if not isinstance(table, dict):
                problems.append(f"{path}: {section} must be a table ([{section}])")
                continue
            section_type = get_type_hints(Config)[section]
            known = [f.name for f in dataclasses.fields(section_type)]
            for key, value in table.items():
                if key not in known:
                    problems.append(f"{path}: unknown key {section}.{key}{_closest(key, known)}")
                    continue
                table = merged.setdefault(section, {})
                if isinstance(value, dict) and isinstance(table.get(key), dict):
                    value = {**table[key], **value}  # drop-ins add to a table, name by name
                table[key] = value
                sources[f"{section}.{key}"] = str(path)
    built: dict[str, Any] = {}
    for section in sections:
        section_type = get_type_hints(Config)[section]
        hints = get_type_hints(section_type)
        values = {}
        for key, value in merged.get(section, {}).items():
            where = f"{sources[f'{section}.{key}']}: {section}.{key}"
            try:
                values[key] = _coerce(value, hints[key], where)
            except ValueError as exc:
                problems.append(str(exc))
        built[section] = section_type(**values)
    config = Config(**built, sources=sources)
    problems += _validate(config, check_paths)
    if problems:
        raise ConfigError(problems)
    return config


def _where(config: Config, key: str) -> str:
    section_key = ".".join(key.split(".")[:2])  # firmware.bundles.NAME comes from firmware.bundles' file
    return f"{config.sources.get(section_key, 'default')}: {key}"


def _validate(config: Config, check_paths: bool) -> list[str]:
    problems = []
    for key, (lo, hi) in _RANGES.items():
        section, name = key.split(".")
        value = getattr(getattr(config, section), name)
        if not lo <= value <= hi:
            problems.append(f"{_where(config, key)}: {value} is out of range [{lo:g}, {hi:g}]")
    for name in ("quic", "tcp"):
        value = getattr(config.listen, name)
        if value:
            try:
                parse_address(value)
            except ValueError as exc:
                problems.append(f"{_where(config, f'listen.{name}')}: {exc}")
    try:
        int(config.listen.unix_mode, 8)
    except ValueError:
        problems.append(f"{_where(config, 'listen.unix_mode')}: {config.listen.unix_mode!r} is not an octal mode")
    if config.governor.policy not in ("auto", "cpu", "shed"):
        problems.append(f"{_where(config, 'governor.policy')}: {config.governor.policy!r} is not auto, cpu or shed")
    if config.kernel.mode not in ("required", "auto", "off"):
        problems.append(f"{_where(config, 'kernel.mode')}: {config.kernel.mode!r} is not required, auto or off")
    if config.kernel.xdp not in ("off", "generic", "native"):
        problems.append(f"{_where(config, 'kernel.xdp')}: {config.kernel.xdp!r} is not off, generic or native")
    for cidr in config.kernel.allowlist:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            problems.append(f"{_where(config, 'kernel.allowlist')}: {cidr!r} is not an IPv4 or IPv6 prefix")
    if config.limits.quic_retry not in RETRY_MODES:
        problems.append(f"{_where(config, 'limits.quic_retry')}: {config.limits.quic_retry!r} is not one of "
                        f"{', '.join(RETRY_MODES)}")  # fmt: skip
    if config.log.level.lower() not in _LEVELS:
        problems.append(f"{_where(config, 'log.level')}: {config.log.level!r} is not one of {', '.join(_LEVELS)}")
    if config.firmware.path is None and not config.firmware.bundles:
        problems.append(f"{_where(config, 'firmware.path')}: no firmware to serve: set firmware.path or "
                        "[firmware.bundles]")
    if check_paths:
        needed = [("firmware.trusted_keys", config.firmware.trusted_keys)]
        if config.firmware.path is not None:
            needed.append(("firmware.path", config.firmware.path))
        needed += [(f"firmware.bundles.{name}", path) for name, path in config.firmware.bundles]
        if config.listen.quic or config.listen.tcp:
            needed += [("tls.cert", config.tls.cert), ("tls.key", config.tls.key)]
        if config.tls.client_ca is not None:
            needed.append(("tls.client_ca", config.tls.client_ca))
        for key, path in needed:
            if not path.exists():
                problems.append(f"{_where(config, key)}: {path} does not exist")
    return problems
