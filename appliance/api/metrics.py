"""Prometheus metrics. One registry per app (the process has one app), so tests can make several."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("zerolayer_requests", "API requests", ["api", "transport", "code"], registry=r)
        self.ttft = Histogram("zerolayer_time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.inter_token = Histogram("zerolayer_inter_token_latency_seconds", "Time between tokens",
                                     buckets=_LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.tokens = Counter("zerolayer_tokens", "Tokens processed", ["kind"], registry=r)
        self.quic_handshakes = Counter("zerolayer_quic_handshakes", "QUIC handshakes completed",
                                       ["resumed", "early_data"], registry=r)  # fmt: skip
        self.active_streams = Gauge("zerolayer_active_streams", "Generations in progress", registry=r)
        self.queue_depth = Gauge("zerolayer_queue_depth", "Requests waiting for the engine", registry=r)
        self.fallback = Counter("zerolayer_fallback", "Requests moved to the CPU", ["reason"], registry=r)
        self.memory_ratio = Gauge("zerolayer_device_memory_used_ratio", "Device memory used / total",
                                  ["device"], registry=r)  # fmt: skip
        self.placed = Counter("zerolayer_requests_placed", "Requests placed per device", ["device"], registry=r)
        self.firmware = Info("zerolayer_firmware", "The firmware bundle each model is served from", ["model"],
                             registry=r)  # fmt: skip
        self.streams = 0  # generations in progress (the gauge's value, for status lines)

    def stream_opened(self) -> None:
        self.streams += 1
        self.active_streams.inc()

    def stream_closed(self) -> None:
        self.streams -= 1
        self.active_streams.dec()

    def add_collector(self, read: Callable[[], dict[str, float]]) -> None:
        """Values read at scrape time: `flows` a gauge, the others counters (`zerolayer_NAME_total`)."""
        self.registry.register(_ReadAtScrape(read))

    def add_engines(self, engines: Callable[[], Mapping[str, EngineStats]]) -> None:
        """Slot and KV occupancy per model and device and each prefix pool's counters, read at
        scrape time from the engines served then (model name -> engine)."""
        self.registry.register(_EngineCollector(engines))

    def set_firmware(self, model: str, name: str, version: str, signer: str) -> None:
        self.firmware.labels(model).info({"name": name, "version": version, "signer": signer})

    def drop_firmware(self, model: str) -> None:
        self.firmware.remove(model)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))

    def count_handshake(self, resumed: bool, early_data: bool) -> None:
        self.quic_handshakes.labels(str(resumed).lower(), str(early_data).lower()).inc()


class EngineStats(Protocol):
    """What the metrics read of an engine (appliance/engine/engine.py)."""

    def snapshot(self) -> dict[str, dict[str, Any]]: ...

    def prefix_stats(self) -> dict[str, int]: ...


class _EngineCollector(Collector):
    def __init__(self, engines: Callable[[], Mapping[str, EngineStats]]) -> None:
        self.engines = engines

    def collect(self) -> Iterator[Metric]:
        per_device = {
            "slots": ("zerolayer_slots", "Requests a device can run at once", "slots"),
            "active": ("zerolayer_slots_active", "Slots running a request", "active"),
            "kv_reserved": ("zerolayer_kv_reserved_positions", "KV positions admitted requests reserve", "kv_reserved"),
            "kv_budget": ("zerolayer_kv_budget_positions", "KV positions a device may reserve", "kv_budget"),
        }  # fmt: skip
        engines = self.engines()
        for name, help_text, key in per_device.values():
            family = GaugeMetricFamily(name, help_text, labels=["model", "device"])
            for model, engine in engines.items():
                for device, values in engine.snapshot().items():
                    family.add_metric([model, device], float(values[key]))
            yield family
        pools = {model: engine.prefix_stats() for model, engine in engines.items()}
        counters = {
            "lookups": ("zerolayer_prefix_cache_lookups", "Prefix pool lookups"),
            "hits": ("zerolayer_prefix_cache_hits", "Lookups that reused a cached prefix"),
            "misses": ("zerolayer_prefix_cache_misses", "Lookups that found nothing"),
            "reused_tokens": ("zerolayer_prefix_cache_reused_tokens", "Prompt tokens whose prefill was skipped"),
        }
        for key, (name, help_text) in counters.items():
            counter = CounterMetricFamily(name, help_text, labels=["model"])
            for model, pool in pools.items():
                counter.add_metric([model], pool["lookups"] - pool["hits"] if key == "misses" else pool[key])
            yield counter
        held = GaugeMetricFamily("zerolayer_prefix_cache_bytes", "Bytes the prefix pool holds", labels=["model"])
        for model, pool in pools.items():
            held.add_metric([model], pool["bytes"])
        yield held


class _ReadAtScrape(Collector):
    _HELP: ClassVar[dict[str, str]] = {
        "flows": "Client flows in the flow table",
        "flow_packets": "Packets counted on client flows",
        "allowlist_dropped": "Packets dropped by the source allowlist",
    }

    def __init__(self, read: Callable[[], dict[str, float]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        for name, value in self.read().items():
            help_text = self._HELP.get(name, name)
            if name == "flows":
                yield GaugeMetricFamily(f"zerolayer_{name}", help_text, value=value)
            else:
                yield CounterMetricFamily(f"zerolayer_{name}", help_text, value=value)
