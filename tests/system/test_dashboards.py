"""The shipped Grafana dashboard and Prometheus scrape example query only metrics the daemon
exports (read from a running daemon's /metrics, so neither side can drift)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx2 as httpx
import yaml
from daemon_thread import RunningDaemon
from prometheus_client.parser import text_string_to_metric_families

from appliance.devsetup import DevSetup

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_info", "_created")


def _family(series: str) -> str:
    for suffix in _SUFFIXES:
        if series.endswith(suffix):
            return series[: -len(suffix)]
    return series


def test_every_metric_the_dashboard_queries_is_exported(tiny: tuple[RunningDaemon, DevSetup]) -> None:
    _, setup = tiny
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(setup.unix_socket))) as client:
        text = client.get("http://localhost/metrics").text
    exported = {family.name for family in text_string_to_metric_families(text)}
    dashboard = json.loads((DASHBOARDS / "zerolayer.json").read_text())
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"\bzerolayer_[a-z0-9_]+", target["expr"])}  # fmt: skip
    assert len(queried) >= 15
    missing = sorted(name for name in queried if _family(name) not in exported and name not in exported)
    assert not missing, f"the dashboard queries metrics /metrics does not export: {missing}"
    for topic in ("first token", "Tokens per second", "Queue", "fallback", "Prefix cache"):
        assert any(topic.lower() in p["title"].lower() for p in dashboard["panels"]), topic


def test_the_scrape_example_is_valid_yaml_for_the_metrics_path() -> None:
    doc = yaml.safe_load((DASHBOARDS / "prometheus.yml").read_text())
    (job,) = doc["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["authorization"]["type"] == "Bearer"
