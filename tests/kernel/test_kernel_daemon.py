"""The kernel layer inside the daemon, on loopback: a real HTTP/3 request is counted in the pinned
flows map with its digests beside it, the allowlist changes on reload without a restart, the
entries survive a restart, and stop leaves no filter of ours behind."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import niquests
import pytest
from clients import metric, metrics
from daemon_process import UNPRIVILEGED, NotifySocket, daemon_process
from daemon_thread import RunningDaemon

from appliance.config import load_config
from appliance.devsetup import DevSetup, write_dev_config
from appliance.kernel import FlowKey, FlowRecord, KernelLayer
from appliance.kernel.loader import PIN_ROOT

LONG = "Explain the for statement, the while statement and the else clauses of both loops. " * 3


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _filters(dev: str = "lo") -> str:
    return "".join(subprocess.run(["tc", "filter", "show", "dev", dev, side], capture_output=True, text=True).stdout
                   for side in ("ingress", "egress"))  # fmt: skip


def _ask(running: RunningDaemon, setup: DevSetup, timeout: float = 30) -> int:
    with niquests.Session(disable_http1=True, disable_http2=True, retries=0) as s:
        r = s.post(f"https://127.0.0.1:{running.port('http3')}/v1/messages", verify=str(setup.ca_cert),
                   headers={"x-api-key": setup.api_key}, timeout=timeout,
                   json={"model": "tiny-llama", "max_tokens": 4, "messages": [{"role": "user", "content": LONG}]})
        assert r.http_version == 30
        return int(r.status_code or 0)


def _our_flow(kernel: KernelLayer, quic_port: int) -> FlowRecord:
    """The QUIC flow to the daemon, once the daemon has written its digests (just after the
    response goes out)."""
    deadline = time.monotonic() + 5
    while True:
        ours = [f for f in kernel.flows() if f.proto == "udp" and f.server[1] == quic_port]
        if (ours and any(any(d) for d in ours[0].digests)) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(ours) == 1
    return ours[0]


@pytest.fixture
def required(pins: None, tiny_bundle_path: Path, trusted_keys: Path, tmp_path: Path) -> DevSetup:
    """A development appliance whose daemon must load the kernel layer."""
    return write_dev_config(tmp_path / "etc", tiny_bundle_path, trusted_keys, kernel="required")


@contextlib.contextmanager
def serving_with_kernel(setup: DevSetup) -> Iterator[tuple[RunningDaemon, KernelLayer]]:
    running = RunningDaemon(setup.root).start()
    try:
        kernel = running.daemon.kernel
        assert isinstance(kernel, KernelLayer)
        yield running, kernel
    finally:
        running.stop()


def test_the_kernel_counts_a_clients_flow_and_the_daemon_writes_its_digests_beside(required: DevSetup) -> None:
    with serving_with_kernel(required) as (running, kernel):
        assert "zerolayer" in _filters()
        assert _ask(running, required) == 200
        flow = _our_flow(kernel, running.port("http3"))
        assert flow.packets >= 4 and flow.bytes > 1200  # handshake + request
        assert any(any(d) for d in flow.digests)
        text = metrics(required)
        assert metric(text, "zerolayer_flows") >= 1 and metric(text, "zerolayer_flow_packets_total") >= 4
    assert "zerolayer" not in _filters()  # stop detached exactly what it attached


def test_a_reloaded_allowlist_drops_clients_it_leaves_out_in_the_kernel(required: DevSetup) -> None:
    with serving_with_kernel(required) as (running, _):
        assert _ask(running, required) == 200
        dropped_before = metric(metrics(required), "zerolayer_allowlist_dropped_total")
        config = required.root / "zerolayer.toml"
        config.write_text(config.read_text() + 'allowlist = ["10.0.0.0/8"]\n')  # loopback left out
        assert running.call(running.daemon.reload)
        with pytest.raises(niquests.exceptions.RequestException):
            _ask(running, required, timeout=3)
        assert metric(metrics(required), "zerolayer_allowlist_dropped_total") > dropped_before
        config.write_text(config.read_text().replace('allowlist = ["10.0.0.0/8"]\n', 'allowlist = ["127.0.0.0/8"]\n'))
        assert running.call(running.daemon.reload)
        assert _ask(running, required) == 200


def test_flow_state_and_digests_survive_a_restart_in_the_pinned_maps(required: DevSetup) -> None:
    with serving_with_kernel(required) as (running, kernel):
        assert _ask(running, required) == 200
        flow = _our_flow(kernel, running.port("http3"))
    with serving_with_kernel(required) as (_, kernel):
        again = kernel.lookup_flow(FlowKey.make("udp", flow.client, flow.server))
        assert again is not None and again.packets >= flow.packets and again.digests == flow.digests
    assert "zerolayer" not in _filters()


def test_kernel_off_serves_with_userspace_flows(tiny_bundle_path: Path, trusted_keys: Path, tmp_path: Path) -> None:
    """The userspace stand-in keeps the kernel's semantics: the QUIC server counts every datagram
    of the flow as tc would (whole frames, both ways) and the digests go in the same entry."""
    from appliance.kernel import UserspaceFlows

    setup = write_dev_config(tmp_path / "etc", tiny_bundle_path, trusted_keys, kernel="off")
    running = RunningDaemon(setup.root).start()
    try:
        layer = running.daemon.kernel
        assert isinstance(layer, UserspaceFlows)
        assert _ask(running, setup) == 200
        deadline = time.monotonic() + 5  # written just after the response goes out
        while not any(any(d) for f in layer.flows() for d in f.digests) and time.monotonic() < deadline:
            time.sleep(0.05)
        (flow,) = layer.flows()
        assert flow.proto == "udp" and flow.server == ("127.0.0.1", running.port("http3"))
        assert flow.packets >= 6 and flow.bytes > flow.packets * (14 + 20 + 8) and any(any(d) for d in flow.digests)
        assert metric(metrics(setup), "zerolayer_flow_packets_total") >= flow.packets
    finally:
        running.stop()


def test_userspace_allowlist_refuses_before_parsing(tiny_bundle_path: Path, trusted_keys: Path, tmp_path: Path) -> None:
    """Without the kernel, the daemon itself keeps sources outside the allowlist out: QUIC datagrams
    are dropped unread (no answer, as the kernel would), TCP gets a 403 in the dialect's JSON before
    the body is parsed; the Unix socket has no source address and is not affected."""
    setup = write_dev_config(tmp_path / "etc", tiny_bundle_path, trusted_keys, kernel="off",
                             extra='allowlist = ["10.0.0.0/8"]\n')  # fmt: skip
    running = RunningDaemon(setup.root).start()
    try:
        layer = running.daemon.kernel
        assert layer is not None
        with pytest.raises(niquests.exceptions.RequestException):
            _ask(running, setup, timeout=2)
        assert layer.verdict_counts()["tc_drop"] >= 1 and not list(layer.flows())
        ctx = ssl.create_default_context(cafile=str(setup.ca_cert))
        with httpx.Client(verify=ctx) as c:
            r = c.post(f"https://127.0.0.1:{running.port('tcp')}/v1/messages", headers={"x-api-key": setup.api_key},
                       content=b"{not even json")  # fmt: skip
            assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(setup.unix_socket))) as c:
            assert c.post("http://localhost/v1/messages", json={"model": "tiny-llama", "max_tokens": 2,
                          "messages": [{"role": "user", "content": "hi"}]}).status_code == 200  # fmt: skip
        assert metric(metrics(setup), "zerolayer_allowlist_dropped_total") >= 2
    finally:
        running.stop()


def test_wildcard_bind_keys_digests_with_the_kernels_counters(pins: None, tiny_bundle_path: Path,
                                                              trusted_keys: Path, tmp_path: Path) -> None:  # fmt: skip
    """The default config binds [::]: IPv4 clients arrive v4-mapped and the socket does not say
    which local address they reached. The digests must still land in the entry the kernel counts
    (the real 4-tuple), on HTTP/3 and on TCP, and turn 2 on the same connection must find them."""
    setup = write_dev_config(tmp_path / "etc", tiny_bundle_path, trusted_keys, kernel="required",
                             quic="[::]:0", tcp="[::]:0")  # fmt: skip
    running = RunningDaemon(setup.root).start()
    try:
        kernel = running.daemon.kernel
        assert isinstance(kernel, KernelLayer)
        body = {"model": "tiny-llama", "max_tokens": 2, "messages": [{"role": "user", "content": LONG}]}
        headers = {"x-api-key": setup.api_key, "zerolayer-debug": "1"}
        quic_port, tcp_port = running.port("http3"), running.port("tcp")
        with niquests.Session(disable_http1=True, disable_http2=True, retries=0) as s:
            traces = [s.post(f"https://127.0.0.1:{quic_port}/v1/messages", verify=str(setup.ca_cert), headers=headers,
                             json=body, timeout=30).headers["zerolayer-trace"] for _ in range(2)]  # fmt: skip
        ctx = ssl.create_default_context(cafile=str(setup.ca_cert))
        with httpx.Client(verify=ctx) as c:
            traces += [c.post(f"https://127.0.0.1:{tcp_port}/v1/messages", headers=headers, json=body,
                              timeout=30).headers["zerolayer-trace"] for _ in range(2)]  # fmt: skip
        assert "found 0/0 digests" in traces[0] and "found 0/0 digests" in traces[2]
        assert re.search(r"found [1-9]\d*/\d+ digests", traces[1]) and re.search(r"found [1-9]\d*/\d+", traces[3])
        for proto, port in (("udp", quic_port), ("tcp", tcp_port)):
            (flow,) = [f for f in kernel.flows() if f.proto == proto and f.server == ("127.0.0.1", port)]
            assert flow.packets > 4 and any(any(d) for d in flow.digests), flow  # one entry: counted and digested
    finally:
        running.stop()


def test_unprivileged_daemon_auto_serves_in_userspace_and_required_refuses(
    pins: None, tiny_bundle_path: Path, trusted_keys: Path, tmp_path: Path
) -> None:
    setup = write_dev_config(tmp_path / "etc", tiny_bundle_path, trusted_keys, kernel="auto",
                             quic=f"127.0.0.1:{_free_udp_port()}")  # fmt: skip
    quic_port = int(load_config(setup.root).listen.quic.rpartition(":")[2])
    notify = NotifySocket(tmp_path / "notify.sock")
    log = tmp_path / "auto.log"
    with daemon_process(setup.root, notify, argv_prefix=UNPRIVILEGED, log=log) as proc:
        notify.wait_for("READY=1")
        with niquests.Session(disable_http1=True, disable_http2=True, retries=0) as s:
            r = s.post(f"https://127.0.0.1:{quic_port}/v1/messages", verify=str(setup.ca_cert), timeout=30,
                       headers={"x-api-key": setup.api_key, "zerolayer-debug": "1"},
                       json={"model": "tiny-llama", "max_tokens": 4, "messages": [{"role": "user", "content": LONG}]})
            assert r.status_code == 200 and r.http_version == 30
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(setup.unix_socket))) as c:
            status = c.get("http://localhost/status").json()
        assert status["kernel"].startswith("userspace (no eBPF)")
        assert metric(metrics(setup), "zerolayer_flow_packets_total") >= 6  # counted in userspace
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    warnings = [line for line in log.read_text().splitlines() if "kernel layer unavailable" in line]
    assert len(warnings) == 1 and ("not permitted" in warnings[0] or "Permission denied" in warnings[0]), warnings
    assert any("kernel layer refused" in f for f in notify.fields() if f.startswith("STATUS="))
    assert not PIN_ROOT.exists() and "zerolayer" not in _filters()

    config = setup.root / "zerolayer.toml"
    config.write_text(config.read_text().replace('mode = "auto"', 'mode = "required"'))
    notify = NotifySocket(tmp_path / "notify2.sock")
    log = tmp_path / "required.log"
    with daemon_process(setup.root, notify, argv_prefix=UNPRIVILEGED, log=log) as proc:
        code = proc.wait(120)
    text = log.read_text()
    assert code == 69 and "READY=1" not in notify.fields()
    assert "kernel layer" in text and ("Operation not permitted" in text or "Permission denied" in text), text
    assert "Traceback" not in text, text
