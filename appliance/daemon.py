"""The daemon: config -> verified firmware -> warm engine -> bound listeners -> ready.

Start-up order matters: nothing is served until the firmware is verified, the engine has run a
forward pass and every listener is bound; `ready` (and later systemd's READY=1) means all three.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

import firmware
from appliance.api import ApiApp, ApiSettings, KeyStore, Metrics
from appliance.config import Config, parse_address
from appliance.engine import Engine, EngineConfig, available_devices
from appliance.transport.http3 import Http3Server, serve_http3
from appliance.transport.tcp import HypercornListener, bind_tcp, bind_unix

log = logging.getLogger(__name__)


def engine_config(config: Config) -> EngineConfig:
    return EngineConfig(
        max_tokens_per_shard=config.engine.max_tokens_per_shard or None,
        prefix_cache_bytes=config.engine.prefix_cache_mb << 20,
        max_active_per_device=config.limits.max_active_per_device,
        max_queued=config.limits.max_queued,
        intra_op_threads=config.engine.threads,
    )


@dataclass
class Listeners:
    http3: Http3Server | None = None
    tcp: HypercornListener | None = None
    unix: HypercornListener | None = None
    addresses: dict[str, str] = field(default_factory=dict)


class Daemon:
    def __init__(self, config: Config, status: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.status = status or (lambda line: log.info("%s", line))
        self.metrics = Metrics()
        self.engine: Engine | None = None
        self.app: ApiApp | None = None
        self.listeners = Listeners()

    async def start(self) -> None:
        cfg = self.config
        self.status(f"verifying firmware {cfg.firmware.path}")
        bundle = await asyncio.to_thread(firmware.load, cfg.firmware.path, cfg.firmware.trusted_keys)
        devices = available_devices()
        if devices == ["cpu"]:
            log.warning("no GPU execution provider in this onnxruntime build: serving on the CPU only")
        devices = sorted(devices, key=lambda d: d == "cpu")  # GPU first when there is one
        self.status(f"warming engine for {bundle.name} {bundle.version} on {', '.join(devices)}")
        engine = await asyncio.to_thread(Engine, bundle, engine_config(cfg), tuple(devices))
        await asyncio.to_thread(engine.warm)
        self.engine = engine
        settings = ApiSettings(
            keys=KeyStore.load(cfg.auth.keys_file),
            auth_required=cfg.auth.required,
            max_body_bytes=cfg.limits.max_body_bytes,
        )
        if cfg.auth.required and not settings.keys.keys:
            log.warning("auth is required but %s holds no keys: network clients will get 401", cfg.auth.keys_file)
        self.app = ApiApp(engine, settings, self.metrics)
        await self._bind()
        self.app.ready = True
        self.status(f"serving {bundle.name} {bundle.version}: " + ", ".join(
            f"{k} {v}" for k, v in self.listeners.addresses.items()))  # fmt: skip

    async def _bind(self) -> None:
        cfg, app, ls = self.config, self.app, self.listeners
        assert app is not None
        quic_port = None
        if cfg.listen.quic:
            host, port = parse_address(cfg.listen.quic)
            ls.http3 = await serve_http3(
                app, host=host, port=port, certfile=cfg.tls.cert, keyfile=cfg.tls.key,
                ticket_key_path=cfg.state.dir / "quic-tickets", idle_timeout=cfg.limits.quic_idle_timeout,
                max_connections=cfg.limits.quic_max_connections,
                max_streams_per_connection=cfg.limits.quic_max_streams, ca_certs=cfg.tls.client_ca,
                max_body_bytes=cfg.limits.max_body_bytes, on_handshake=self.metrics.count_handshake,
            )  # fmt: skip
            quic_port = ls.http3.port
            ls.addresses["http3"] = f"udp {host}:{quic_port}"
        if cfg.listen.tcp:
            host, port = parse_address(cfg.listen.tcp)
            ls.tcp = HypercornListener(
                app, bind_tcp(host, port), "tcp", certfile=cfg.tls.cert, keyfile=cfg.tls.key,
                client_ca=cfg.tls.client_ca, alt_svc_port=quic_port,
            )  # fmt: skip
            ls.tcp.start()
            ls.addresses["tcp"] = f"https {ls.tcp.address}"
        if cfg.listen.unix:
            from pathlib import Path

            ls.unix = HypercornListener(app, bind_unix(Path(cfg.listen.unix), int(cfg.listen.unix_mode, 8)), "unix")
            ls.unix.start()
            ls.addresses["unix"] = cfg.listen.unix
        await asyncio.sleep(0)  # let Hypercorn start accepting on the sockets we bound

    async def stop(self, drain_timeout: float = 10.0) -> None:
        self.status("stopping: draining in-flight requests")
        if self.app is not None:
            self.app.ready = False
        ls = self.listeners
        closers = [x.close() for x in (ls.tcp, ls.unix) if x is not None]
        if ls.http3 is not None:
            closers.append(ls.http3.close(drain_timeout))
        await asyncio.gather(*closers, return_exceptions=True)
        if self.engine is not None:
            await asyncio.to_thread(self.engine.close)

    async def run(self) -> int:
        """Serve until SIGTERM or SIGINT; a second signal stops at once."""
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _exit_now)
        await self.stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):
                loop.remove_signal_handler(sig)
        return 0


def _exit_now() -> None:
    log.warning("second signal: stopping at once")
    raise SystemExit(1)
