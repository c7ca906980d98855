"""The whole daemon with its kernel layer, run as a process in a server network namespace, with
clients in another across a veth pair: the pinned map's packet and byte counts for a real HTTP/3
exchange equal a tcpdump capture of it; a client outside the allowlist gets nothing (dropped in
XDP and counted) until a SIGHUP widens the list; the pinned flow outlives a restart; and stop
leaves no tc filter and no XDP program behind."""

from __future__ import annotations

import json
import signal
import sys
import textwrap
import time
from pathlib import Path

import httpx2 as httpx
from capture import per_client, read_pcap, tcpdump
from daemon_process import NotifySocket, daemon_process
from netns import NetPair, sh

from appliance.devsetup import DevSetup, write_dev_config
from appliance.kernel import FlowKey, FlowRecord, KernelLayer
from appliance.kernel.loader import PIN_ROOT

PORT = 8443

H3_CLIENT = textwrap.dedent("""
    import json, sys, niquests
    src, url, ca, key, timeout = sys.argv[1:6]
    prompt = "Explain the for statement, the while statement and the else clauses of both loops. " * 3
    body = {"model": "tiny-llama", "max_tokens": 4, "messages": [{"role": "user", "content": prompt}]}
    with niquests.Session(disable_http1=True, disable_http2=True, retries=0, source_address=(src, 0)) as s:
        try:
            r = s.post(url, verify=ca, headers={"x-api-key": key}, json=body, timeout=float(timeout))
            print(json.dumps({"status": r.status_code, "version": r.http_version}))
        except niquests.exceptions.RequestException as e:
            print(json.dumps({"status": 0, "error": repr(e)}))
""")


def ask(pair: NetPair, setup: DevSetup, source: str, timeout: float = 20) -> dict[str, object]:
    """One HTTP/3 request from `source` in the client namespace to the daemon in the server one."""
    out = sh("ip", "netns", "exec", pair.client_ns, sys.executable, "-c", H3_CLIENT, source,
             f"https://{pair.server4}:{PORT}/v1/messages", str(setup.ca_cert), setup.api_key, str(timeout))  # fmt: skip
    result: dict[str, object] = json.loads(out)
    return result


def ours(pair: NetPair) -> str:
    """Our tc filters and any XDP program on the server's interface."""
    filters = "".join(sh("ip", "netns", "exec", pair.server_ns, "tc", "filter", "show", "dev", pair.server_if, side)
                      for side in ("ingress", "egress"))  # fmt: skip
    link = sh("ip", "-n", pair.server_ns, "link", "show", pair.server_if)
    return ("zerolayer " if "zerolayer" in filters else "") + ("xdp" if "xdp" in link else "")


def quic_flows(reader: KernelLayer, client: str) -> list[FlowRecord]:
    return [f for f in reader.flows() if f.proto == "udp" and f.client[0] == client and f.server[1] == PORT]


def settled_flows(reader: KernelLayer, client: str) -> list[FlowRecord]:
    """The client's flows once nothing moves any more (the last ACKs and the close are counted)."""
    before: list[FlowRecord] = []
    for _ in range(50):
        now = quic_flows(reader, client)
        if now and [(f.packets, f.digests) for f in now] == [(f.packets, f.digests) for f in before]:
            return now
        before = now
        time.sleep(0.2)
    raise AssertionError(f"the flows of {client} did not settle: {before}")


def dropped_metric(setup: DevSetup) -> float:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(setup.unix_socket))) as c:
        text = c.get("http://localhost/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("zerolayer_allowlist_dropped_total ")))  # fmt: skip


def test_daemon_in_a_namespace_counts_filters_reloads_restarts_and_detaches(
    pins: None, netpair: NetPair, tiny_bundle_path: Path, trusted_keys: Path, tmp_path: Path
) -> None:
    outsider = netpair.client4.rsplit(".", 1)[0] + ".3"  # a second address on the client side
    sh("ip", "-n", netpair.client_ns, "addr", "add", f"{outsider}/24", "dev", netpair.client_if)
    setup = write_dev_config(
        tmp_path / "etc", tiny_bundle_path, trusted_keys, tcp=f"{netpair.server4}:{PORT}",
        quic=f"{netpair.server4}:{PORT}", kernel="required", cert_hosts=[netpair.server4],
        extra=f'allowlist = ["{netpair.client4}/32"]\nxdp = "generic"\n',
    )  # fmt: skip
    in_server_ns = ["nsenter", f"--net=/run/netns/{netpair.server_ns}", "--"]
    notify = NotifySocket(tmp_path / "notify.sock")
    with daemon_process(setup.root, notify, argv_prefix=in_server_ns, log=tmp_path / "daemon.log") as proc:
        notify.wait_for("READY=1")
        assert ours(netpair) == "zerolayer xdp"
        with tcpdump(netpair.server_ns, netpair.server_if, f"udp port {PORT}", tmp_path / "h3.pcap") as pcap:
            served = ask(netpair, setup, netpair.client4)
            refused = ask(netpair, setup, outsider, timeout=3)
            reader = KernelLayer(pin_root=PIN_ROOT)
            (flow,) = settled_flows(reader, netpair.client4)
        assert served == {"status": 200, "version": 30}, served
        assert refused["status"] == 0, refused  # no answer at all: dropped before userspace
        captured = per_client(read_pcap(pcap), PORT)
        assert captured[("udp", flow.client)] == (flow.packets, flow.bytes)  # the kernel's count is the wire's
        assert flow.packets >= 6 and any(any(d) for d in flow.digests)  # and the daemon wrote the digests
        assert not quic_flows(reader, outsider)  # XDP dropped it before tc could count it
        dropped = reader.verdict_counts()["xdp_drop"]
        assert dropped >= 1 and dropped_metric(setup) == dropped

        config = setup.root / "zerolayer.toml"  # widen the allowlist to the client subnet; SIGHUP applies it
        config.write_text(config.read_text().replace(f"{netpair.client4}/32", f"{netpair.client4}/24"))
        proc.send_signal(signal.SIGHUP)
        notify.wait_for("RELOADING=1", 10)
        notify.wait_for("READY=1", 10)
        assert ask(netpair, setup, outsider) == {"status": 200, "version": 30}
        assert reader.verdict_counts()["xdp_drop"] == dropped
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert ours(netpair) == ""  # stop detached the tc filters and the XDP program it attached

    notify = NotifySocket(tmp_path / "notify2.sock")
    with daemon_process(setup.root, notify, argv_prefix=in_server_ns, log=tmp_path / "daemon2.log") as proc:
        notify.wait_for("READY=1")
        again = reader.lookup_flow(FlowKey.make("udp", flow.client, flow.server))  # the map is pinned: same entry
        assert again is not None and again.packets == flow.packets and again.digests == flow.digests
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    reader.close()
    assert ours(netpair) == ""
    assert "kernel layer unavailable" not in (tmp_path / "daemon.log").read_text()


def test_a_second_stop_signal_exits_at_once_and_still_detaches(
    pins: None, netpair: NetPair, tiny_bundle_path: Path, trusted_keys: Path, tmp_path: Path
) -> None:
    import socket

    setup = write_dev_config(
        tmp_path / "etc", tiny_bundle_path, trusted_keys, tcp=f"{netpair.server4}:{PORT}",
        quic=f"{netpair.server4}:{PORT}", kernel="required", cert_hosts=[netpair.server4],
        extra='xdp = "generic"\n\n[limits]\ndrain_timeout = 60.0\n',
    )  # fmt: skip
    in_server_ns = ["nsenter", f"--net=/run/netns/{netpair.server_ns}", "--"]
    notify = NotifySocket(tmp_path / "notify.sock")
    with daemon_process(setup.root, notify, argv_prefix=in_server_ns, log=tmp_path / "daemon.log") as proc, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as held:  # fmt: skip
        notify.wait_for("READY=1")
        assert ours(netpair) == "zerolayer xdp"
        held.connect(str(setup.unix_socket))  # a request whose body never finishes: the drain waits for it
        held.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n{")  # fmt: skip
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1", 10)
        time.sleep(0.3)
        assert proc.poll() is None  # draining, as asked
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 1  # the second signal: at once, without draining
    assert ours(netpair) == ""  # and no program left on the interface
    assert "second signal: stopping at once" in (tmp_path / "daemon.log").read_text()
