"""The daemon: config -> verified firmware -> warm engine -> bound listeners -> ready.

Start-up order matters: nothing is served until the firmware is verified, the engine has run a
forward pass and every listener is bound; `ready` (and later systemd's READY=1) means all three.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import firmware
from appliance.api import ApiApp, ApiSettings, KeyStore, Metrics
from appliance.config import Config, ConfigError, load_config, parse_address
from appliance.engine import Engine, EngineConfig, available_devices
from appliance.flows import LayerDigests
from appliance.governor import Governor, GovernorConfig, JetsonProbe, MemoryProbe, cuda_memory_limit, detect_probe
from appliance.kernel import KernelLayer, UserspaceFlows, open_kernel_layer
from appliance.systemd import ActivatedSockets, Notifier, configure_logging, listen_fds, run_watchdog, watchdog_interval
from appliance.transport.http3 import Http3Server, serve_http3
from appliance.transport.tcp import HypercornListener, bind_tcp, bind_unix

log = logging.getLogger(__name__)


def engine_config(config: Config, bundle: firmware.Bundle) -> EngineConfig:
    baked = bundle.layer.max_tokens_per_shard
    if config.engine.max_tokens_per_shard > baked:
        where = config.sources.get("engine.max_tokens_per_shard", "default")
        raise ConfigError([f"{where}: engine.max_tokens_per_shard = {config.engine.max_tokens_per_shard} exceeds "
                           f"the firmware's baked {baked}; config may only lower it"])  # fmt: skip
    return EngineConfig(
        max_tokens_per_shard=config.engine.max_tokens_per_shard or None,
        prefix_cache_bytes=config.engine.prefix_cache_mb << 20,
        kv_cache_bytes=config.engine.kv_cache_mb << 20,
        max_active_per_device=config.limits.max_active_per_device,
        max_queued=config.limits.max_queued,
        intra_op_threads=config.engine.threads,
    )


def governor_config(config: Config, bundle: firmware.Bundle, probe: MemoryProbe) -> GovernorConfig:
    baked = bundle.layer.fallback_cpu_threshold
    threshold = config.governor.threshold or baked
    if threshold > baked:
        where = config.sources.get("governor.threshold", "default")
        raise ConfigError([f"{where}: governor.threshold = {threshold} exceeds the firmware's baked "
                           f"fallback_cpu_threshold {baked}; config may only lower it"])  # fmt: skip
    policy = config.governor.policy
    if policy == "auto":  # on Jetson the CPU shares the GPU's memory: moving work there frees nothing
        policy = "shed" if isinstance(probe, JetsonProbe) else "cpu"
    return GovernorConfig(threshold, config.governor.hysteresis, config.governor.interval_ms / 1000, policy)


@dataclass
class Listeners:
    http3: Http3Server | None = None
    tcp: HypercornListener | None = None
    unix: HypercornListener | None = None
    addresses: dict[str, str] = field(default_factory=dict)


class Daemon:
    def __init__(self, config: Config, status: Callable[[str], None] | None = None,
                 notifier: Notifier | None = None, config_root: Path | None = None) -> None:  # fmt: skip
        self.config = config
        self.config_root = config_root
        self.notifier = notifier or Notifier("")
        self._echo = status
        self.metrics = Metrics()
        self.engine: Engine | None = None
        self.app: ApiApp | None = None
        self.listeners = Listeners()
        self.activated = ActivatedSockets({})
        self.kernel: KernelLayer | UserspaceFlows | None = None
        self.governor: Governor | None = None
        self.probe: MemoryProbe | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def status(self, line: str) -> None:
        """One line for `systemctl status` and the log."""
        self.notifier.status(line)
        if self._echo is not None:
            self._echo(line)
        else:
            log.info("%s", line)

    async def start(self) -> None:
        cfg = self.config
        self.status(f"verifying firmware {cfg.firmware.path}")
        self.notifier.extend_timeout(120)  # hashing a large bundle can outlast TimeoutStartSec's default
        bundle = await asyncio.to_thread(firmware.load, cfg.firmware.path, cfg.firmware.trusted_keys)
        self.status(f"verified firmware {bundle.name} {bundle.version} (signed by key {bundle.signer_key_id})")
        if self.probe is None:  # tests set a probe whose readings they control
            self.probe = await asyncio.to_thread(detect_probe)
        probe = self.probe
        gov_cfg = governor_config(cfg, bundle, probe)
        readings = probe.read()
        devices = available_devices()
        if devices == ["cpu"]:
            log.warning("no GPU execution provider in this onnxruntime build: serving on the CPU only")
        devices = sorted(devices, key=lambda d: d == "cpu")  # GPU first when there is one
        cuda_options = None
        if readings:  # the arena may not grow past the threshold: past it, work goes to the CPU
            cuda_options = {"gpu_mem_limit": str(cuda_memory_limit(readings[0].total, gov_cfg.threshold)),
                            "arena_extend_strategy": "kSameAsRequested"}  # fmt: skip
        self.status(f"warming engine on {', '.join(devices)}")
        self.notifier.extend_timeout(300)
        engine = await asyncio.to_thread(
            Engine, bundle, engine_config(cfg, bundle), tuple(devices), cuda_options,
            lambda reason: self.metrics.fallback.labels(reason).inc(),
        )  # fmt: skip
        await asyncio.to_thread(engine.warm)
        self.engine = engine
        self.governor = self._make_governor(gov_cfg, engine, probe)
        settings = ApiSettings(
            keys=KeyStore.load(cfg.auth.keys_file),
            auth_required=cfg.auth.required,
            max_body_bytes=cfg.limits.max_body_bytes,
        )
        if cfg.auth.required and not settings.keys.keys:
            log.warning("auth is required but %s holds no keys: network clients will get 401", cfg.auth.keys_file)
        self.app = ApiApp(engine, settings, self.metrics, governor=self.governor, status_info=self.status_info)
        await self._bind()
        await self._open_kernel_layer()
        self.app.ready = True
        log.info("serving %s %s: %s", bundle.name, bundle.version,
                 ", ".join(f"{k} {v}" for k, v in self.listeners.addresses.items()))  # fmt: skip
        self.notifier.ready(self.serving_line())
        if self._echo is not None:
            self._echo(self.serving_line())
        interval = watchdog_interval()
        if interval is not None:
            self._tasks.append(asyncio.create_task(run_watchdog(self.notifier, interval, self.healthy)))
        self._tasks.append(asyncio.create_task(self._report_status()))
        self._tasks.append(asyncio.create_task(self.governor.run()))

    async def _open_kernel_layer(self) -> None:
        """The eBPF flow table and allowlist on the serving interfaces, or their userspace stand-in."""
        cfg, ls = self.config, self.listeners
        assert self.app is not None
        tcp_name = ls.tcp.sock.getsockname() if ls.tcp else None
        ports = sorted({p for p in (ls.http3.port if ls.http3 else None, tcp_name[1] if tcp_name else None) if p})
        bound = [a for a in (ls.http3.address[0] if ls.http3 else None, tcp_name[0] if tcp_name else None) if a]
        if cfg.kernel.mode != "off":
            self.status("loading eBPF programs")
        kernel = await asyncio.to_thread(
            open_kernel_layer, cfg.kernel.mode, ports=ports, allowlist=cfg.kernel.allowlist,  # type: ignore[arg-type]
            interfaces=cfg.kernel.interfaces, bound_addresses=bound, xdp=cfg.kernel.xdp,  # type: ignore[arg-type]
        )  # fmt: skip
        self.kernel = kernel
        if isinstance(kernel, UserspaceFlows):
            if cfg.kernel.mode != "off":
                self.notifier.status("kernel layer refused: flows and allowlist in userspace (see the log)")
            self.app.allowed = kernel.allowed  # enforce before parsing, as the kernel would
            if ls.http3 is not None:  # drop and count datagrams, as the tc programs would
                ls.http3.gate = kernel
        self.app.flows = LayerDigests(kernel, cfg.kernel.flow_idle_seconds)
        self.metrics.add_collector(self._kernel_metrics)

    def _kernel_metrics(self) -> dict[str, float]:
        if self.kernel is None:
            return {}
        verdicts = self.kernel.verdict_counts()
        flows = list(self.kernel.flows())
        return {"flows": len(flows), "flow_packets": sum(f.packets for f in flows),
                "allowlist_dropped": verdicts.get("tc_drop", 0) + verdicts.get("xdp_drop", 0)}  # fmt: skip

    def _make_governor(self, gov_cfg: GovernorConfig, engine: Engine, probe: MemoryProbe) -> Governor:
        gpu = next((d for d in engine.workers if not d.startswith("cpu")), None)
        if gpu is None and probe.read():
            log.warning("%s reports GPU memory but this onnxruntime has no GPU provider: CPU only", probe.kind)
        governor = Governor(
            probe, gov_cfg, gpu_device=gpu, cpu_device=engine.cpu_device or engine.default_device,
            on_reading=lambda r: self.metrics.memory_ratio.labels(r.device).set(r.ratio),
            on_fallback=lambda: self.metrics.fallback.labels("vram_threshold").inc(),
        )  # fmt: skip
        if gpu is not None:
            engine.workers[gpu].admitting = lambda: not governor.shedding
        return governor

    def _kernel_state(self) -> str:
        if isinstance(self.kernel, KernelLayer):
            filters = ", ".join(f"{i} {p}" for i, p, _ in self.kernel.attached_filters()) or "none"
            return f"eBPF loaded, pinned under {self.kernel.pin_root}; tc on {filters}; {self._kernel_metrics()}"
        return f"userspace (no eBPF): {self._kernel_metrics()}"

    def serving_line(self) -> str:
        assert self.engine is not None
        streams = self.app.active_streams if self.app is not None else 0
        queued = sum(w.queued for w in self.engine.workers.values())
        listeners = ", ".join(self.listeners.addresses)
        memory = ""
        if self.governor is not None and self.governor.latest is not None:
            memory = f", gpu {self.governor.latest.ratio:.0%} memory"
        return f"serving {self.engine.bundle.name}: {streams} streams, {queued} queued{memory}, on {listeners}"

    def status_info(self) -> dict[str, object]:
        """What `zerolayer status` prints."""
        assert self.engine is not None
        bundle, gov = self.engine.bundle, self.governor
        readings = self.probe.read() if self.probe is not None else []
        return {
            "firmware": {"name": bundle.name, "version": bundle.version, "signer": bundle.signer_key_id,
                         "path": str(bundle.root), "constants": dataclasses.asdict(bundle.layer)},
            "devices": {d: {"active": w.depth - w.queued, "queued": w.queued, "alive": w.alive()}
                        for d, w in self.engine.workers.items()},
            "memory": [{"device": r.device, "used": r.used, "total": r.total, "ratio": round(r.ratio, 4)}
                       for r in readings],
            "placement": {"probe": self.probe.kind if self.probe else "none",
                          "now": gov.place_preview() if gov else self.engine.default_device,
                          "threshold": gov.config.threshold if gov else None,
                          "hysteresis": gov.config.hysteresis if gov else None,
                          "policy": gov.config.policy if gov else None,
                          "state": gov.describe() if gov else ""},
            "listeners": dict(self.listeners.addresses),
            "active_streams": self.app.active_streams if self.app else 0,
            "kernel": self._kernel_state(),
        }

    async def _report_status(self) -> None:
        while True:
            await asyncio.sleep(5)
            self.notifier.status(self.serving_line())

    def healthy(self, now: float | None = None) -> bool:
        """Every engine worker thread alive and, if busy, progressing within the stall limit."""
        if self.engine is None or not self.engine.alive():
            return False
        now = time.monotonic() if now is None else now
        limit = self.stall_limit
        return all(not w.depth or now - w.last_progress < limit for w in self.engine.workers.values())

    @property
    def stall_limit(self) -> float:
        interval = watchdog_interval()
        return interval * 2 if interval is not None else 60.0

    async def _bind(self) -> None:
        """Bind every listener: sockets systemd passed (by name) first, else our own."""
        cfg, app, ls = self.config, self.app, self.listeners
        assert app is not None
        self.activated = listen_fds()
        for sock in self.activated.by_name.values():
            sock.setblocking(False)
        quic_port = None
        quic_sock = self.activated.take("quic")
        if cfg.listen.quic or quic_sock is not None:
            host, port = parse_address(cfg.listen.quic or "[::]:0")
            ls.http3 = await serve_http3(
                app, host=host, port=port, sock=quic_sock, certfile=cfg.tls.cert, keyfile=cfg.tls.key,
                ticket_key_path=cfg.state.dir / "quic-tickets", idle_timeout=cfg.limits.quic_idle_timeout,
                max_connections=cfg.limits.quic_max_connections,
                max_streams_per_connection=cfg.limits.quic_max_streams, ca_certs=cfg.tls.client_ca,
                max_body_bytes=cfg.limits.max_body_bytes, on_handshake=self.metrics.count_handshake,
            )  # fmt: skip
            quic_port = ls.http3.port
            ls.addresses["http3"] = f"udp port {quic_port}"
        drain = cfg.limits.drain_timeout
        tcp_sock = self.activated.take("tcp")
        if cfg.listen.tcp or tcp_sock is not None:
            if tcp_sock is None:
                tcp_sock = bind_tcp(*parse_address(cfg.listen.tcp))
            ls.tcp = HypercornListener(
                app, tcp_sock, "tcp", certfile=cfg.tls.cert, keyfile=cfg.tls.key,
                client_ca=cfg.tls.client_ca, alt_svc_port=quic_port, graceful_timeout=drain,
            )  # fmt: skip
            ls.tcp.start()
            ls.addresses["tcp"] = f"https {ls.tcp.address}"
        unix_sock = self.activated.take("unix")
        if cfg.listen.unix or unix_sock is not None:
            if unix_sock is None:
                unix_sock = bind_unix(Path(cfg.listen.unix), int(cfg.listen.unix_mode, 8))
            ls.unix = HypercornListener(app, unix_sock, "unix", graceful_timeout=drain)
            ls.unix.start()
            ls.addresses["unix"] = str(unix_sock.getsockname())
        await asyncio.sleep(0)  # let Hypercorn start accepting on the sockets we bound

    def reload(self) -> bool:
        """SIGHUP: re-read the config and apply what can change live; a bad config changes nothing."""
        self.notifier.reloading()
        try:
            new = load_config(self.config_root)
            keys = KeyStore.load(new.auth.keys_file)
        except (ConfigError, ValueError, OSError) as exc:
            problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
            for line in problems:
                log.error("reload rejected, the running config stays: %s", line)
            self.notifier.ready(self.serving_line())
            return False
        if self.app is not None:
            self.app.settings = ApiSettings(keys=keys, auth_required=new.auth.required,
                                            max_body_bytes=new.limits.max_body_bytes)  # fmt: skip
        if self.engine is not None:
            for worker in self.engine.workers.values():
                worker.max_queued = new.limits.max_queued
            if self.governor is not None and self.probe is not None:
                try:
                    gov_cfg = governor_config(new, self.engine.bundle, self.probe)
                except ConfigError as exc:
                    for line in exc.problems:
                        log.error("reload rejected, the running config stays: %s", line)
                    self.notifier.ready(self.serving_line())
                    return False
                self.governor.reconfigure(gov_cfg)
        try:
            for listener in (self.listeners.http3, self.listeners.tcp):
                if listener is not None:
                    listener.reload_certificate(new.tls.cert, new.tls.key)
        except (OSError, ValueError, ssl.SSLError) as exc:
            log.error("reload: TLS certificate %s not loaded (%s); new connections keep the old one",
                      new.tls.cert, exc)  # fmt: skip
        if self.kernel is not None:
            self.kernel.set_allowlist(new.kernel.allowlist)
        logging.getLogger().setLevel(new.log.level.upper())
        self.config = new
        log.info("reloaded config: %d API keys, log level %s", len(keys.keys), new.log.level)
        self.notifier.ready(self.serving_line())
        return True

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Stop accepting, let in-flight streams finish (up to the drain timeout), close QUIC
        connections with CONNECTION_CLOSE, stop the engine."""
        drain_timeout = self.config.limits.drain_timeout if drain_timeout is None else drain_timeout
        self.notifier.stopping()
        self.status("stopping: draining in-flight requests")
        for task in self._tasks:
            task.cancel()
        if self.app is not None:
            self.app.ready = False
        ls = self.listeners
        closers = [x.close(drain_timeout) for x in (ls.tcp, ls.unix) if x is not None]
        if ls.http3 is not None:
            closers.append(ls.http3.close(drain_timeout))
        await asyncio.gather(*closers, return_exceptions=True)
        if self.kernel is not None:
            await asyncio.to_thread(self.kernel.close)  # detach what we attached; the pins stay
        if self.engine is not None:
            await asyncio.to_thread(self.engine.close)

    async def run(self) -> int:
        """Serve until SIGTERM or SIGINT (SIGHUP reloads); a second stop signal exits at once."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        try:
            await self.start()
        except Exception as exc:  # say why in `systemctl status`, release what was bound, then fail
            self.notifier.status(f"failed to start: {str(exc).splitlines()[0]}")
            await self.stop(drain_timeout=0)
            raise
        await stop.wait()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _exit_now)
        await self.stop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(ValueError):
                loop.remove_signal_handler(sig)
        self.notifier.close()
        log.info("stopped")
        return 0


def _exit_now() -> None:
    log.warning("second signal: stopping at once, without draining")
    os._exit(1)


def serve(config_root: Path | None) -> int:
    """`zerolayer serve`: the daemon as systemd runs it."""
    config = load_config(config_root)
    configure_logging(config.log.level)
    return asyncio.run(Daemon(config, notifier=Notifier(), config_root=config_root).run())
