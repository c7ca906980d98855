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
import socket
import ssl
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import firmware
from appliance.api import ApiApp, KeyStore, Metrics
from appliance.config import Config, ConfigError, load_config, parse_address
from appliance.engine import Engine, available_devices
from appliance.flows import LayerDigests
from appliance.governor import Governor, MemoryProbe, available_host_memory, detect_probe
from appliance.kernel import KernelLayer, UserspaceFlows, open_kernel_layer, pin_dir
from appliance.plan import HostFacts, Plan, api_settings, governor_config, memory_need, plan_models
from appliance.served import Served, ServedModels
from appliance.system import image_info
from appliance.systemd import ActivatedSockets, Notifier, configure_logging, listen_fds, run_watchdog, watchdog_interval
from appliance.transport.http3 import Http3Server, bind_udp, serve_http3
from appliance.transport.tcp import HypercornListener, bind_tcp, bind_unix

log = logging.getLogger(__name__)


@dataclass
class Listeners:
    http3: Http3Server | None = None
    tcp: HypercornListener | None = None
    unix: HypercornListener | None = None
    addresses: dict[str, str] = field(default_factory=dict)


# Where each served bundle comes from: a table name, or None for `firmware.path` (served under its
# manifest's name, known once it is verified).
Sources = dict[str | None, Path]


def bundle_sources(config: Config) -> Sources:
    sources: Sources = dict(config.firmware.bundles)
    if config.firmware.path is not None:
        sources[None] = config.firmware.path
    return sources


@dataclass(frozen=True)
class Loaded:
    """A verified bundle and where the config named it."""

    key: str | None
    source: Path
    bundle: firmware.Bundle


def load_bundles(sources: Sources, trusted_keys: Path, taken: Collection[str] = ()) -> dict[str, Loaded]:
    """Verify each bundle, by model name. Raises on the first that fails, or when two would be
    served under one name (`taken`: names other models keep)."""
    loaded: dict[str, Loaded] = {}
    for key, path in sorted(sources.items(), key=lambda item: item[0] is not None):  # firmware.path first
        bundle = firmware.load(path, trusted_keys)
        name = key if key is not None else bundle.name
        if name in loaded or name in taken:
            raise ConfigError([f"firmware.bundles.{name}: the model name {name!r} is also firmware.path's "
                               "bundle's manifest name; name it differently"])  # fmt: skip
        loaded[name] = Loaded(key, path, bundle)
    return loaded


@dataclass
class Sockets:
    """The listening sockets, bound (or passed by systemd) before anything serves on them."""

    quic: socket.socket | None = None
    tcp: socket.socket | None = None
    unix: socket.socket | None = None

    def ports(self) -> list[int]:
        return sorted({int(s.getsockname()[1]) for s in (self.quic, self.tcp) if s is not None})

    def addresses(self) -> list[str]:
        return [str(s.getsockname()[0]) for s in (self.quic, self.tcp) if s is not None]


@contextlib.contextmanager
def _listening(key: str, address: str) -> Iterator[None]:
    """A listener's bind failing names its config key and address (the CLI prints it in one line)."""
    try:
        yield
    except OSError as exc:
        raise OSError(exc.errno, f"cannot listen on {key} = {address!r}: {exc.strerror or exc}") from None


class Daemon:
    """Builds each part whole, in dependency order, from one plan: firmware, governor, engine,
    sockets, kernel layer, app, listeners. Status is read from what each part reports."""

    def __init__(self, config: Config, status: Callable[[str], None] | None = None,
                 notifier: Notifier | None = None, config_root: Path | None = None,
                 probe: MemoryProbe | None = None) -> None:  # fmt: skip
        self.config = config
        self.config_root = config_root
        self.notifier = notifier or Notifier("")
        self._echo = status
        self.metrics = Metrics()
        self.probe = probe  # None: detected at start (tests pass one whose readings they control)
        self.models = ServedModels()
        self.reloading: asyncio.Task[None] | None = None  # a reload's model changes, while they load
        self.app: ApiApp | None = None
        self.listeners = Listeners()
        self.activated = ActivatedSockets({})
        self.kernel: KernelLayer | UserspaceFlows | None = None
        self.governor: Governor | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def status(self, line: str) -> None:
        """One line for `systemctl status` and the log."""
        self.notifier.status(line)
        if self._echo is not None:
            self._echo(line)
        else:
            log.info("%s", line)

    @property
    def engine(self) -> Engine | None:
        """The first model's engine (firmware.path's bundle, when it is set)."""
        return self.models.first().engine if len(self.models) else None

    def host_facts(self, probe: MemoryProbe) -> HostFacts:
        readings = probe.read()
        return HostFacts(tuple(available_devices()), probe.kind, readings[0].total if readings else None,
                         available_host_memory())  # fmt: skip

    async def start(self) -> None:
        cfg = self.config
        sources = bundle_sources(cfg)
        self.status(f"verifying firmware {', '.join(str(p) for p in sources.values())}")
        self.notifier.extend_timeout(120)  # hashing a large bundle can outlast TimeoutStartSec's default
        loaded = await asyncio.to_thread(load_bundles, sources, cfg.firmware.trusted_keys)
        for name, one in loaded.items():
            bundle = one.bundle
            self.status(f"verified firmware {bundle.name} {bundle.version} (signed by key {bundle.signer_key_id})"
                        + (f" as model {name}" if name != bundle.name else ""))  # fmt: skip
        probe = self.probe if self.probe is not None else await asyncio.to_thread(detect_probe)
        self.probe = probe
        host = self.host_facts(probe)
        plans, governor_cfg = plan_models(cfg, {name: one.bundle for name, one in loaded.items()}, host)
        for name, plan in plans.items():
            for note in plan.notes:
                log.warning("%s: %s", name, note)
        gpu = next((p.gpu_device for p in plans.values() if p.gpu_device is not None), None)
        governor = self.governor = Governor(
            probe, governor_cfg, gpu_device=gpu, cpu_device="cpu",
            on_reading=lambda r: self.metrics.memory_ratio.labels(r.device).set(r.ratio),
            on_fallback=lambda: self.metrics.fallback.labels("vram_threshold").inc(),
        )  # fmt: skip
        devices = sorted({d for plan in plans.values() for d in plan.devices})
        self.status(f"warming engine on {', '.join(devices)}" + (f" for {len(plans)} models" if len(plans) > 1 else ""))
        self.notifier.extend_timeout(300)
        for model in await asyncio.to_thread(self._build_engines, loaded, plans):
            self._serve_model(model)
        governor.reserved = self._gpu_held(list(self.models))
        self.metrics.add_engines(lambda: {s.name: s.engine for s in self.models})
        settings = api_settings(cfg, KeyStore.load(cfg.auth.keys_file))
        if cfg.auth.required and not settings.keys.keys:
            log.warning("auth is required but %s holds no keys: network clients will get 401", cfg.auth.keys_file)
        sockets = self._bind_sockets()
        kernel = self.kernel = await self._open_kernel_layer(sockets)
        userspace = kernel if isinstance(kernel, UserspaceFlows) else None
        self.app = ApiApp(
            self.models, settings, self.metrics, governor=governor, status=self.status_info,
            flows=LayerDigests(kernel, cfg.kernel.flow_idle_seconds),
            # Where the kernel cannot enforce the allowlist, TCP checks it before parsing anything.
            allowed=userspace.allowed if userspace is not None else None,
        )  # fmt: skip
        await self._serve(self.app, sockets, userspace)
        self.app.set_ready(True)
        log.info("serving %s: %s", ", ".join(self._model_lines()),
                 ", ".join(f"{k} {v}" for k, v in self.listeners.addresses.items()))  # fmt: skip
        self.notifier.ready(self.serving_line())
        if self._echo is not None:
            self._echo(self.serving_line())
        interval = watchdog_interval()
        if interval is not None:
            self._tasks.append(asyncio.create_task(run_watchdog(self.notifier, interval, self.healthy)))
        self._tasks.append(asyncio.create_task(self._report_status()))
        self._tasks.append(asyncio.create_task(governor.run()))

    def _build_engines(self, loaded: dict[str, Loaded], plans: dict[str, Plan]) -> list[Served]:
        """An engine per bundle, each warmed; all or none (what was built is closed if one fails)."""
        assert self.governor is not None
        built: list[Served] = []
        try:
            for name, one in loaded.items():
                plan = plans[name]
                engine = Engine(one.bundle, plan.engine, plan.devices, plan.cuda_options, self._count_fallback,
                                self.governor.admits)  # fmt: skip
                built.append(Served(name, engine, one.source, one.key))
                engine.warm()
        except BaseException:
            for model in built:
                model.engine.close()
            raise
        return built

    @staticmethod
    def _gpu_held(models: list[Served]) -> int:
        """The most these models' engines may hold on the GPU: their weights and KV pools."""
        return sum(memory_need(s.engine.bundle, s.engine.config, d).on(d)
                   for s in models for d in s.engine.devices if d != "cpu")  # fmt: skip

    def _count_fallback(self, reason: str) -> None:
        self.metrics.fallback.labels(reason).inc()

    def _serve_model(self, served: Served) -> Served | None:
        """Route requests for its name to it; returns the model it replaced, if any."""
        bundle = served.engine.bundle
        self.metrics.set_firmware(served.name, bundle.name, bundle.version, bundle.signer_key_id)
        return self.models.put(served)

    def _retire(self, served: Served, drain: float) -> None:
        """Stop routing to a model and its metrics label; it closes once its streams end."""
        self.models.remove(served.name)
        self.metrics.drop_firmware(served.name)
        self.models.retire(served, drain)

    def _model_lines(self) -> list[str]:
        lines = []
        for one in self.models:
            bundle = one.engine.bundle
            alias = f" as {one.name}" if one.name != bundle.name else ""
            lines.append(f"{bundle.name} {bundle.version}{alias}")
        return lines

    async def _open_kernel_layer(self, sockets: Sockets) -> KernelLayer | UserspaceFlows:
        """The eBPF flow table and allowlist on the serving interfaces, or their userspace stand-in."""
        cfg = self.config
        if cfg.kernel.mode != "off":
            self.status("loading eBPF programs")
        kernel = await asyncio.to_thread(
            open_kernel_layer, cfg.kernel.mode, ports=sockets.ports(), allowlist=cfg.kernel.allowlist,  # type: ignore[arg-type]
            interfaces=cfg.kernel.interfaces, bound_addresses=sockets.addresses(), xdp=cfg.kernel.xdp,  # type: ignore[arg-type]
            pin_root=pin_dir(cfg.kernel.pin_dir, os.environ.get("RUNTIME_DIRECTORY")),
        )  # fmt: skip
        if isinstance(kernel, UserspaceFlows) and cfg.kernel.mode != "off":
            self.notifier.status("kernel layer refused: flows and allowlist in userspace (see the log)")
        self.metrics.add_collector(self._kernel_metrics)
        return kernel

    def _kernel_metrics(self) -> dict[str, float]:
        if self.kernel is None:
            return {}
        verdicts = self.kernel.verdict_counts()
        flows = list(self.kernel.flows())
        return {"flows": len(flows), "flow_packets": sum(f.packets for f in flows),
                "allowlist_dropped": verdicts.get("tc_drop", 0) + verdicts.get("xdp_drop", 0)}  # fmt: skip

    def _kernel_state(self) -> str:
        if isinstance(self.kernel, KernelLayer):
            filters = ", ".join(f"{i} {p}" for i, p, _ in self.kernel.attached_filters()) or "none"
            return f"eBPF loaded, pinned under {self.kernel.pin_root}; tc on {filters}; {self._kernel_metrics()}"
        return f"userspace (no eBPF): {self._kernel_metrics()}"

    def serving_line(self) -> str:
        listeners = ", ".join(self.listeners.addresses)
        memory = ""
        if self.governor is not None and self.governor.latest is not None:
            memory = f", gpu {self.governor.latest.ratio:.0%} memory"
        return (f"serving {', '.join(self.models.names())}: {self.metrics.streams} streams, {self.models.queued} "
                f"queued{memory}, on {listeners}")  # fmt: skip

    @staticmethod
    def _firmware_info(served: Served) -> dict[str, object]:
        bundle = served.engine.bundle
        return {"model": served.name, "name": bundle.name, "version": bundle.version, "signer": bundle.signer_key_id,
                "path": str(bundle.root), "configured": str(served.source),
                "constants": dataclasses.asdict(bundle.layer), "devices": served.engine.snapshot()}  # fmt: skip

    def status_info(self) -> dict[str, object]:
        """What `zerolayer status` prints: each part's own report (`firmware` and `devices`: the
        first model's, as before several were served; `models`: every one)."""
        assert self.engine is not None and self.governor is not None
        readings = self.probe.read() if self.probe is not None else []
        first = self._firmware_info(self.models.first())
        return {
            "firmware": {k: v for k, v in first.items() if k not in ("devices", "model", "configured")},
            "models": [self._firmware_info(one) for one in self.models],
            "devices": first["devices"],
            "memory": [{"device": r.device, "used": r.used, "total": r.total, "ratio": round(r.ratio, 4)}
                       for r in readings],
            "placement": self.governor.snapshot(),
            "listeners": dict(self.listeners.addresses),
            "active_streams": self.metrics.streams,
            "kernel": self._kernel_state(),
            "image": image_info(),  # the appliance image's version and trust, where this is one
        }

    async def _report_status(self) -> None:
        while True:
            await asyncio.sleep(5)
            self.notifier.status(self.serving_line())

    def healthy(self, now: float | None = None) -> bool:
        """Every engine worker thread alive and, if busy, progressing within the stall limit."""
        if not len(self.models):
            return False
        return self.models.healthy(self.stall_limit, time.monotonic() if now is None else now)

    @property
    def stall_limit(self) -> float:
        interval = watchdog_interval()
        return interval * 2 if interval is not None else 60.0

    def _bind_sockets(self) -> Sockets:
        """Every listening socket: those systemd passed (by name) first, else our own."""
        cfg = self.config
        self.activated = listen_fds()
        for sock in self.activated.by_name.values():
            sock.setblocking(False)
        sockets = Sockets(self.activated.take("quic"), self.activated.take("tcp"), self.activated.take("unix"))
        listen = cfg.listen
        try:
            if sockets.quic is None and listen.quic:
                with _listening("listen.quic", listen.quic):
                    sockets.quic = bind_udp(*parse_address(listen.quic))
            if sockets.tcp is None and listen.tcp:
                with _listening("listen.tcp", listen.tcp):
                    sockets.tcp = bind_tcp(*parse_address(listen.tcp))
            if sockets.unix is None and listen.unix:
                with _listening("listen.unix", listen.unix):
                    sockets.unix = bind_unix(Path(listen.unix), int(listen.unix_mode, 8))
        except OSError:
            for bound in (sockets.quic, sockets.tcp, sockets.unix):
                if bound is not None:
                    bound.close()
            raise
        return sockets

    async def _serve(self, app: ApiApp, sockets: Sockets, userspace: UserspaceFlows | None) -> None:
        """Start serving on every bound socket."""
        cfg, ls = self.config, self.listeners
        quic_port = None
        if sockets.quic is not None:
            ls.http3 = await serve_http3(
                app, sock=sockets.quic, certfile=cfg.tls.cert, keyfile=cfg.tls.key,
                ticket_key_path=cfg.state.dir / "quic-tickets", idle_timeout=cfg.limits.quic_idle_timeout,
                max_connections=cfg.limits.quic_max_connections, retry=cfg.limits.quic_retry,
                max_handshakes=cfg.limits.quic_max_handshakes, handshake_timeout=cfg.limits.quic_handshake_timeout,
                max_streams_per_connection=cfg.limits.quic_max_streams, ca_certs=cfg.tls.client_ca,
                max_body_bytes=cfg.limits.max_body_bytes, on_handshake=self.metrics.count_handshake,
                gate=userspace,  # drop and count datagrams in userspace, as the tc programs would
                refusal=app.refusal,
            )  # fmt: skip
            quic_port = ls.http3.port
            ls.addresses["http3"] = f"udp port {quic_port}"
        drain = cfg.limits.drain_timeout
        if sockets.tcp is not None:
            ls.tcp = HypercornListener(
                app, sockets.tcp, "tcp", certfile=cfg.tls.cert, keyfile=cfg.tls.key,
                client_ca=cfg.tls.client_ca, alt_svc_port=quic_port, graceful_timeout=drain,
            )  # fmt: skip
            ls.tcp.start()
            ls.addresses["tcp"] = f"https {ls.tcp.address}"
        if sockets.unix is not None:
            ls.unix = HypercornListener(app, sockets.unix, "unix", graceful_timeout=drain)
            ls.unix.start()
            ls.addresses["unix"] = str(sockets.unix.getsockname())
        await asyncio.sleep(0)  # let Hypercorn start accepting on the sockets we bound

    def reload(self) -> bool:
        """SIGHUP: re-read the config and apply what can change live; a bad config changes nothing.
        Bundles added, removed or pointing elsewhere load in the background (`self.reloading`):
        the other models' streams go on meanwhile, and READY=1 follows once they are served."""
        self.notifier.reloading()
        governor, probe = self.governor, self.probe
        try:
            new = load_config(self.config_root)
            keys = KeyStore.load(new.auth.keys_file)
            bundles = [s.engine.bundle for s in self.models]
            gov_cfg = governor_config(new, bundles, probe.kind) if bundles and probe else None
        except (ConfigError, ValueError, OSError) as exc:
            problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
            for line in problems:
                log.error("reload rejected, the running config stays: %s", line)
            self.notifier.ready(self.serving_line())
            return False
        if governor is not None and gov_cfg is not None:
            governor.reconfigure(gov_cfg)
        for one in self.models:
            one.engine.set_max_queued(new.limits.max_queued)
        if self.app is not None:
            self.app.reconfigure(api_settings(new, keys))
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
        if self.reloading is not None and not self.reloading.done():
            log.warning("reload: the previous reload's firmware is still loading; its result stands, then this "
                        "one's changes load")  # fmt: skip
        self.reloading = asyncio.get_running_loop().create_task(self._reload_models(new, self.reloading))
        return True

    def _changed_sources(self, config: Config) -> tuple[Sources, list[Served]]:
        """Bundles to load (new, or whose path now resolves elsewhere) and models to retire."""
        wanted = bundle_sources(config)
        keyed = {s.key: s for s in self.models}
        load = {key: path for key, path in wanted.items()
                if key not in keyed or path.resolve() != keyed[key].loaded.resolve()}  # fmt: skip
        retire = [s for key, s in keyed.items() if key not in wanted]
        return load, retire

    async def _reload_models(self, config: Config, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        try:
            await self._apply_models(config)
        except Exception:
            log.exception("reload: firmware changes failed; the models served stay as they were")
        self.notifier.ready(self.serving_line())

    async def _apply_models(self, config: Config) -> None:
        """Load what is new first, then retire what is gone: if the new firmware fails and nothing
        else would be left, the old keeps serving (a box serving nothing is worse than the old model)."""
        load, retire = self._changed_sources(config)
        drain = config.limits.drain_timeout
        retiring = {s.name for s in retire}
        reloaded = {s.name for s in self.models if s.key in load}
        kept = [s for s in self.models if s.name not in reloaded and s.name not in retiring]
        built: list[Served] = []
        loaded: dict[str, Loaded] = {}
        failed = False
        if load:
            try:
                loaded = await asyncio.to_thread(load_bundles, load, config.firmware.trusted_keys,
                                                 {s.name for s in kept})  # fmt: skip
                assert self.probe is not None
                # The kept engines already hold their host memory (MemAvailable excludes it), but the
                # GPU's budget is a fixed share of the card: count what they may hold there.
                plans, _ = plan_models(config, {name: one.bundle for name, one in loaded.items()},
                                       self.host_facts(self.probe), self._gpu_held(kept))  # fmt: skip
                built = await asyncio.to_thread(self._build_engines, loaded, plans)
            except (ConfigError, firmware.BundleError, OSError, ValueError) as exc:
                failed = True
                for line in exc.problems if isinstance(exc, ConfigError) else [str(exc)]:
                    log.error("reload: firmware not loaded, the models served stay as they were: %s", line)
        if failed and not kept and len(retiring) == len(self.models):
            log.error("reload: keeping %s served: the firmware configured instead did not load",
                      ", ".join(sorted(retiring)))  # fmt: skip
            return
        for served in retire:
            log.info("reload: model %s is no longer configured: it takes no new requests and closes once its %d "
                     "running requests end", served.name, served.engine.in_flight)  # fmt: skip
            self._retire(served, drain)
        if failed:
            return
        for name in reloaded - set(loaded):  # firmware.path's bundle now has another manifest name
            gone = self.models.get(name)
            if gone is not None:
                self._retire(gone, drain)
        for model in built:
            old = self._serve_model(model)
            bundle = model.engine.bundle
            log.info("reload: serving model %s from %s %s%s", model.name, bundle.name, bundle.version,
                     f" (replacing {old.engine.bundle.version}, which drains)" if old is not None else "")  # fmt: skip
            if old is not None:  # already unrouted: the new model took its name, and its firmware label
                self.models.retire(old, drain)
        if self.governor is not None and self.probe is not None:
            bundles = [s.engine.bundle for s in self.models]
            self.governor.reconfigure(governor_config(config, bundles, self.probe.kind))
            self.governor.reserved = self._gpu_held(list(self.models))

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Stop accepting, let in-flight streams finish (up to the drain timeout), close QUIC
        connections with CONNECTION_CLOSE, stop the engine."""
        drain_timeout = self.config.limits.drain_timeout if drain_timeout is None else drain_timeout
        self.notifier.stopping()
        self.status("stopping: draining in-flight requests")
        for task in self._tasks:
            task.cancel()
        if self.app is not None:
            self.app.set_ready(False)
        ls = self.listeners
        closers = [x.close(drain_timeout) for x in (ls.tcp, ls.unix) if x is not None]
        if ls.http3 is not None:
            closers.append(ls.http3.close(drain_timeout))
        await asyncio.gather(*closers, return_exceptions=True)
        if self.kernel is not None:
            await asyncio.to_thread(self.kernel.close)  # detach what we attached; the pins stay
        if self.reloading is not None:
            self.reloading.cancel()
        await asyncio.to_thread(self.models.close)
        with contextlib.suppress(TimeoutError):  # models a reload retired: their streams ended with the listeners
            await asyncio.wait_for(self.models.wait_retired(), timeout=5)

    def _exit_now(self) -> None:
        """A second stop signal: exit at once, without draining, but leave no program attached to an
        interface (the pinned maps stay, as on every stop)."""
        log.warning("second signal: stopping at once, without draining")
        kernel = self.kernel
        if kernel is not None:
            failed: list[BaseException] = []

            def detach() -> None:  # netlink wants a thread of its own: this handler runs on the loop
                try:
                    kernel.detach()
                except Exception as exc:
                    failed.append(exc)

            worker = threading.Thread(target=detach, name="detach")
            worker.start()
            worker.join(5)
            if failed or worker.is_alive():  # exiting regardless: say what may be left behind
                why = failed[0] if failed else "no answer in 5 s"
                log.error("second signal: detaching the kernel layer failed (%s); `tc filter show` may list it", why)
        os._exit(1)

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
            loop.add_signal_handler(sig, self._exit_now)
        await self.stop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(ValueError):
                loop.remove_signal_handler(sig)
        self.notifier.close()
        log.info("stopped")
        return 0


def serve(config_root: Path | None) -> int:
    """`zerolayer serve`: the daemon as systemd runs it."""
    config = load_config(config_root)
    configure_logging(config.log.level)
    return asyncio.run(Daemon(config, notifier=Notifier(), config_root=config_root).run())
