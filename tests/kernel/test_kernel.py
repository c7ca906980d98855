"""The kernel layer on a real kernel: the BPF object built and loaded, map round trips, pinning
across instances, real UDP through a veth pair between two network namespaces counted and
filtered by tc and XDP, detach, and the userspace fallback. These machines are root with BTF."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_process import UNPRIVILEGED
from netns import NetPair, sh
from pyroute2 import IPRoute

from appliance.kernel import (
    FlowKey,
    FlowValue,
    KernelLayer,
    KernelLayerError,
    LpmKey,
    UserspaceFlows,
    build_object,
    open_kernel_layer,
    pin_dir,
    resolve_interfaces,
)
from appliance.kernel.libbpf import BpfError
from appliance.kernel.loader import PIN_ROOT, on_bpffs
from appliance.kernel.maps import BPF_NOEXIST

REPO = Path(__file__).resolve().parents[2]
PORT = 4433
ETH, IPV4, IPV6, UDP = 14, 20, 40, 8


@pytest.fixture(scope="session")
def bpf_object(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_object(tmp_path_factory.mktemp("bpf"))


@pytest.fixture
def pin_root() -> Iterator[Path]:
    root = Path("/sys/fs/bpf") / f"zerolayer-test-{uuid.uuid4().hex[:8]}"
    yield root
    for p in root.glob("*") if root.exists() else ():
        p.unlink()
    if root.exists():
        root.rmdir()


@pytest.fixture
def layer(bpf_object: Path, pin_root: Path) -> Iterator[KernelLayer]:
    kl = KernelLayer(bpf_object, pin_root)
    yield kl
    kl.close()


ECHO = textwrap.dedent("""
    import socket, sys
    fams = []
    for addr in sys.argv[2:]:
        s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((addr, int(sys.argv[1])))
        fams.append(s)
    print("ready", flush=True)
    import selectors
    sel = selectors.DefaultSelector()
    for s in fams:
        sel.register(s, selectors.EVENT_READ)
    while True:
        for k, _ in sel.select():
            data, peer = k.fileobj.recvfrom(65535)
            k.fileobj.sendto(data, peer)
""")

CLIENT = textwrap.dedent("""
    import json, socket, sys
    src, dst, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sizes = [int(x) for x in sys.argv[4].split(",")]
    s = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((src, 0))
    s.settimeout(float(sys.argv[5]))
    got = 0
    for n in sizes:
        s.sendto(b"x" * n, (dst, port))
        try:
            data, _ = s.recvfrom(65535)
            got += len(data) == n
        except socket.timeout:
            pass
    print(json.dumps({"port": s.getsockname()[1], "received": got}))
""")


@contextlib.contextmanager
def echo_server(ns: str, *addrs: str) -> Iterator[None]:
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", ECHO, str(PORT), *addrs],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def echo(netpair: NetPair) -> Iterator[None]:
    with echo_server(netpair.server_ns, netpair.server4, netpair.server6):
        yield


def send(pair: NetPair, sizes: list[int], v6: bool = False, timeout: float = 1.0,
         via: tuple[str, str, str] | None = None, port: int = PORT) -> dict[str, int]:  # fmt: skip
    """Datagrams from the client namespace (or `via`: namespace, source, destination); the echoes counted."""
    ns, src, dst = via or ((pair.client_ns, pair.client6, pair.server6) if v6 else
                           (pair.client_ns, pair.client4, pair.server4))  # fmt: skip
    out = sh("ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, src, dst, str(port),
             ",".join(map(str, sizes)), str(timeout))  # fmt: skip
    result: dict[str, int] = json.loads(out)
    return result


# --- build, load, maps ---------------------------------------------------------------------------


def test_object_builds_and_both_programs_load(layer: KernelLayer) -> None:
    assert set(layer.prog_fds) == {"zl_tc_ingress", "zl_tc_egress", "zl_xdp"}
    assert all(fd > 0 for fd in layer.prog_fds.values())
    assert ctypes.sizeof(FlowKey) == 40 and ctypes.sizeof(FlowValue) == 24 + 320 and ctypes.sizeof(LpmKey) == 20
    assert layer.verdict_counts() == {"tc_pass": 0, "tc_drop": 0, "xdp_pass": 0, "xdp_drop": 0}


def test_flow_map_round_trips(layer: KernelLayer) -> None:
    m = layer.flows_map
    keys = [FlowKey.make("udp", (f"10.0.{i // 250}.{i % 250 + 1}", 1000 + i), ("10.0.9.254", PORT))
            for i in range(1, 300)]  # fmt: skip
    keys.append(FlowKey.make("tcp", ("2001:db8::7", 55000), ("2001:db8::1", 443)))
    for i, k in enumerate(keys):
        v = FlowValue(last_ns=i, packets=i * 2, bytes=i * 100)
        v.set_digests([bytes([i % 256]) * 32])
        m.update(k, v)
    got = m.lookup(keys[5])
    assert got is not None and (got.last_ns, got.packets, got.bytes) == (5, 10, 500)
    assert got.digest_list() == [bytes([5]) * 32]
    with pytest.raises(BpfError) as exc:
        m.update(keys[5], FlowValue(), BPF_NOEXIST)
    assert "File exists" in str(exc.value)
    assert m.delete(keys[5]) and not m.delete(keys[5]) and m.lookup(keys[5]) is None
    walked = {bytes(k): v.packets for k, v in m.iterate()}
    batched = {bytes(k): v.packets for k, v in m.lookup_batch(chunk=64)}
    assert len(walked) == len(keys) - 1 and walked == batched
    assert {bytes(k): v.packets for k, v in m.items()} == walked
    v6 = next(r for r in layer.flows() if r.proto == "tcp")
    assert v6.client == ("2001:db8::7", 55000) and v6.server == ("2001:db8::1", 443)
    layer.write_digests(FlowKey.make("udp", ("10.0.0.10", 1009), ("10.0.9.254", PORT)), [b"a" * 32, b"b" * 32])
    rec = layer.lookup_flow(FlowKey.make("udp", ("10.0.0.10", 1009), ("10.0.9.254", PORT)))
    assert rec is not None and rec.digests == (b"a" * 32, b"b" * 32) and rec.packets == 16  # counters kept


def test_allowlist_map_and_lpm(layer: KernelLayer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "appliance.kernel"):
        layer.set_allowlist([])
    assert "every client is allowed" in caplog.text and layer.allowed("192.0.2.1") and not layer.enforcing()
    layer.set_allowlist(["192.0.2.0/24", "2001:db8:1::/48"])
    assert layer.enforcing()
    assert layer.allowed("192.0.2.77") and layer.allowed("::ffff:192.0.2.77") and not layer.allowed("192.0.3.1")
    assert layer.allowed("2001:db8:1:2::3") and not layer.allowed("2001:db8:2::1")
    assert sorted(k.cidr() for k in layer.allow_map.iter_keys()) == ["192.0.2.0/24", "2001:db8:1::/48"]
    layer.set_allowlist(["198.51.100.7"])
    assert [k.cidr() for k in layer.allow_map.iter_keys()] == ["198.51.100.7/32"]
    with pytest.raises(ValueError, match="not an IPv4/IPv6"):
        layer.set_allowlist(["nope"])


def test_pinned_maps_survive_a_second_load(bpf_object: Path, pin_root: Path) -> None:
    first = KernelLayer(bpf_object, pin_root)
    first.set_ports([PORT])
    first.write_digests(FlowKey.make("udp", ("10.1.2.3", 40000), ("10.1.2.1", PORT)), [b"d" * 32])
    first.close()
    assert sorted(p.name for p in pin_root.iterdir()) == ["allow", "allow_config", "flows", "ports", "verdicts"]
    with KernelLayer(bpf_object, pin_root) as second:
        rec = second.lookup_flow(FlowKey.make("udp", ("10.1.2.3", 40000), ("10.1.2.1", PORT)))
        assert rec is not None and rec.digests == (b"d" * 32,)
        assert [k.value for k in second.ports_map.iter_keys()] == [PORT]


def test_maps_pin_through_the_bind_the_unit_makes_of_the_daemons_bpffs_directory(
        bpf_object: Path, pin_root: Path, tmp_path: Path) -> None:  # fmt: skip
    """zerolayer.service binds /sys/fs/bpf/zerolayer at /run/zerolayer/bpf; the daemon finds it
    there from $RUNTIME_DIRECTORY, pins through it, and the pins are the bpffs directory's."""
    pin_root.mkdir(mode=0o700)
    runtime = tmp_path / "run"
    bound = runtime / "bpf"
    bound.mkdir(parents=True)
    assert pin_dir("", str(runtime)) == PIN_ROOT  # not bound yet: a tmp directory is no bpffs
    subprocess.run(["mount", "--bind", str(pin_root), str(bound)], check=True)
    try:
        assert on_bpffs(bound) and not on_bpffs(runtime)
        assert pin_dir("", str(runtime)) == bound
        assert pin_dir("/elsewhere/pins", str(runtime)) == Path("/elsewhere/pins")  # the config wins
        with KernelLayer(bpf_object, bound) as layer:
            layer.set_ports([PORT])
        assert sorted(p.name for p in pin_root.iterdir()) == ["allow", "allow_config", "flows", "ports", "verdicts"]
    finally:
        subprocess.run(["umount", str(bound)], check=True)
    assert pin_dir("", None) == PIN_ROOT


def test_a_pin_directory_off_bpffs_is_refused_with_the_reason(bpf_object: Path, tmp_path: Path) -> None:
    with pytest.raises(KernelLayerError, match="is not on bpffs"):
        KernelLayer(bpf_object, tmp_path / "pins")
    assert not (tmp_path / "pins").exists()


# --- real packets --------------------------------------------------------------------------------


def tc_filters(pair: NetPair, hook: str) -> str:
    return sh("ip", "netns", "exec", pair.server_ns, "tc", "filter", "show", "dev", pair.server_if, hook)


@pytest.mark.usefixtures("echo")
def test_tc_counts_udp_flow_both_directions(layer: KernelLayer, netpair: NetPair) -> None:
    layer.netns = netpair.server_ns
    layer.set_ports([PORT])
    layer.set_allowlist([])
    layer.attach([netpair.server_if])
    assert "zerolayer" in tc_filters(netpair, "ingress") and "zerolayer" in tc_filters(netpair, "egress")
    sizes = [1, 100, 512, 1200]
    result = send(netpair, sizes)
    assert result["received"] == len(sizes)
    rec = layer.lookup_flow(FlowKey.make("udp", (netpair.client4, result["port"]), (netpair.server4, PORT)))
    assert rec is not None, list(layer.flows())
    assert rec.packets == 2 * len(sizes)  # each datagram in (ingress) and its echo out (egress)
    assert rec.bytes == 2 * sum(n + UDP + IPV4 + ETH for n in sizes)
    assert rec.last_ns > 0 and rec.digests == ()
    # IPv6: same key layout, family 10
    result6 = send(netpair, sizes, v6=True)
    assert result6["received"] == len(sizes)
    rec6 = layer.lookup_flow(FlowKey.make("udp", (netpair.client6, result6["port"]), (netpair.server6, PORT)))
    assert rec6 is not None and rec6.packets == 2 * len(sizes)
    assert rec6.bytes == 2 * sum(n + UDP + IPV6 + ETH for n in sizes)
    # digests written by userspace survive the kernel's counting
    layer.write_digests(FlowKey.make("udp", (netpair.client4, result["port"]), (netpair.server4, PORT)),
                        [b"z" * 32])
    assert send(netpair, [10])["received"] == 1
    assert layer.verdict_counts()["tc_pass"] == 2 * len(sizes) + 1
    layer.detach()
    assert "zerolayer" not in tc_filters(netpair, "ingress") and "zerolayer" not in tc_filters(netpair, "egress")
    qdiscs = sh("ip", "netns", "exec", netpair.server_ns, "tc", "qdisc", "show", "dev", netpair.server_if)
    assert "clsact" not in qdiscs  # it created the qdisc, so it removed it


TCP_ECHO = textwrap.dedent("""
    import socket, sys
    srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
    print("ready", flush=True)
    conn, _ = srv.accept()
    while data := conn.recv(65536):
        conn.sendall(data)
    conn.close()
""")

TCP_CLIENT = textwrap.dedent("""
    import socket, sys
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2, source_address=(sys.argv[3], 0))
    c.sendall(b"y" * 3000)
    got = b""
    while len(got) < 3000:
        got += c.recv(65536)
    print(c.getsockname()[1])
    c.close()
""")


def test_tc_counts_tcp_under_the_clients_key_only(layer: KernelLayer, netpair: NetPair) -> None:
    layer.netns = netpair.server_ns
    layer.set_ports([PORT])
    layer.attach([netpair.server_if])
    server = subprocess.Popen(["ip", "netns", "exec", netpair.server_ns, sys.executable, "-c", TCP_ECHO,
                               netpair.server4, str(PORT)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        port = int(sh("ip", "netns", "exec", netpair.client_ns, sys.executable, "-c", TCP_CLIENT, netpair.server4,
                      str(PORT), netpair.client4))  # fmt: skip
        server.wait(timeout=5)
    finally:
        server.kill()
    # a datagram to a port that is not a service port is not counted
    assert send(netpair, [10], port=PORT + 1, timeout=0.1)["received"] == 0
    records = list(layer.flows())
    assert all(r.server == (netpair.server4, PORT) for r in records), records  # never the reversed key
    (rec,) = records
    assert rec.proto == "tcp" and rec.client == (netpair.client4, port)
    assert rec.packets >= 6 and rec.bytes > 2 * 3000  # handshake, data both ways, FINs


@pytest.mark.usefixtures("echo")
def test_tc_allowlist_drops_unlisted_clients(layer: KernelLayer, netpair: NetPair) -> None:
    layer.netns = netpair.server_ns
    layer.set_ports([PORT])
    layer.set_allowlist(["10.199.250.0/24", "fd00:dead::/32"])
    layer.attach([netpair.server_if])
    before = layer.verdict_counts()["tc_drop"]
    assert send(netpair, [50, 60, 70], timeout=0.3)["received"] == 0
    assert send(netpair, [50], v6=True, timeout=0.3)["received"] == 0
    assert layer.verdict_counts()["tc_drop"] - before == 4
    layer.set_allowlist([f"{netpair.client4.rsplit('.', 1)[0]}.0/24", f"{netpair.client6}/128"])
    assert send(netpair, [50, 60, 70])["received"] == 3
    assert send(netpair, [50], v6=True)["received"] == 1
    layer.set_allowlist([])  # empty: allow all, never drop all
    assert send(netpair, [5])["received"] == 1


@pytest.mark.usefixtures("echo")
def test_xdp_allowlist(layer: KernelLayer, netpair: NetPair) -> None:
    layer.netns = netpair.server_ns
    layer.set_ports([PORT])
    layer.set_allowlist(["192.0.2.0/24"])
    layer.attach([netpair.server_if], xdp="generic")
    assert "xdpgeneric" in sh("ip", "-n", netpair.server_ns, "link", "show", netpair.server_if)
    assert send(netpair, [40, 40], timeout=0.3)["received"] == 0
    counts = layer.verdict_counts()
    assert counts["xdp_drop"] == 2 and counts["tc_drop"] == 0  # XDP dropped them before tc saw them
    layer.set_allowlist([f"{netpair.client4}/32"])
    assert send(netpair, [40])["received"] == 1 and layer.verdict_counts()["xdp_pass"] == 1
    layer.detach()
    link = sh("ip", "-n", netpair.server_ns, "link", "show", netpair.server_if)
    assert "xdp" not in link


def test_loopback_counts_each_packet_once(layer: KernelLayer, netpair: NetPair) -> None:
    layer.netns = netpair.server_ns
    layer.set_ports([PORT])
    layer.attach(resolve_interfaces(["auto"], ["127.0.0.1"], netpair.server_ns))
    assert "zerolayer" in sh("ip", "netns", "exec", netpair.server_ns, "tc", "filter", "show", "dev", "lo", "ingress")
    assert layer.attached_filters() == [("lo", "ffff:fff2", 1)]  # ingress only: every lo packet passes it once
    sizes = [10, 300]
    with echo_server(netpair.server_ns, "127.0.0.1"):
        result = send(netpair, sizes, via=(netpair.server_ns, "127.0.0.1", "127.0.0.1"))
    assert result["received"] == 2
    rec = layer.lookup_flow(FlowKey.make("udp", ("127.0.0.1", result["port"]), ("127.0.0.1", PORT)))
    assert rec is not None and rec.packets == 4 and rec.bytes == 2 * sum(n + UDP + IPV4 + ETH for n in sizes)


REFUSED = """
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
SEC("tc")
int unchecked(struct __sk_buff *skb)
{
	return *(int *)(long)skb->data; /* no bounds check: the verifier refuses it */
}
char LICENSE[] SEC("license") = "GPL";
"""


def test_refused_program_says_why(tmp_path: Path, pin_root: Path) -> None:
    src, obj = tmp_path / "refused.bpf.c", tmp_path / "refused.bpf.o"
    src.write_text(REFUSED)
    multiarch = sh("gcc", "-print-multiarch").strip()
    sh("clang", "-O2", "-g", "-target", "bpf", f"-I/usr/include/{multiarch}", "-c", str(src), "-o", str(obj))
    with pytest.raises(KernelLayerError) as exc:
        KernelLayer(obj, pin_root)
    assert "Permission denied" in exc.value.reason  # EACCES: the verifier's refusal
    assert "invalid access to packet" in exc.value.reason  # and its log line saying why
    assert not pin_root.exists()  # nothing left behind


def test_libbpf_log_goes_to_logging(bpf_object: Path, pin_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, "appliance.kernel.libbpf"), KernelLayer(bpf_object, pin_root):
        pass
    lines = [r.getMessage() for r in caplog.records if r.name == "appliance.kernel.libbpf"]
    assert any("libbpf: map 'flows'" in line for line in lines), lines[:5]


def test_detach_leaves_other_filters_and_qdisc(layer: KernelLayer, netpair: NetPair) -> None:
    ns, dev = netpair.server_ns, netpair.server_if
    sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "clsact")
    with IPRoute(netns=ns) as ipr:  # someone else's filter (a bpf one: this kernel has no matchall/u32)
        ipr.tc("add-filter", "bpf", ipr.link_lookup(ifname=dev)[0], ":1", fd=layer.prog_fds["zl_tc_egress"],
               name="foreign", parent="ffff:fff2", classid=1, direct_action=True, prio=1)  # fmt: skip
    layer.netns = ns
    layer.attach([dev])
    assert layer.attached_filters() == [(dev, "ffff:fff2", 2), (dev, "ffff:fff3", 1)]
    layer.detach()
    ingress = tc_filters(netpair, "ingress")
    assert "foreign" in ingress and "zerolayer" not in ingress
    assert "zerolayer" not in tc_filters(netpair, "egress")
    assert "clsact" in sh("ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", dev)


def test_auto_interfaces_resolve_bound_addresses(netpair: NetPair) -> None:
    ns = netpair.server_ns
    assert resolve_interfaces(["auto"], [netpair.server4], ns) == [netpair.server_if]
    assert resolve_interfaces(["auto"], ["127.0.0.1"], ns) == ["lo"]
    assert set(resolve_interfaces(["auto"], ["::"], ns)) == {"lo", netpair.server_if}
    assert resolve_interfaces(["eth9"], [], ns) == ["eth9"]
    with pytest.raises(KernelLayerError, match="no interface carries"):
        resolve_interfaces(["auto"], ["192.0.2.1"], ns)


def test_open_kernel_layer_required_attaches(bpf_object: Path, pin_root: Path, netpair: NetPair) -> None:
    kl = open_kernel_layer("required", ports=[PORT], allowlist=[], interfaces=["auto"],
                           bound_addresses=[netpair.server4], object_path=bpf_object, pin_root=pin_root,
                           netns=netpair.server_ns)  # fmt: skip
    try:
        assert isinstance(kl, KernelLayer) and kl.attached_filters()[0][0] == netpair.server_if
    finally:
        kl.close()
    assert "zerolayer" not in tc_filters(netpair, "ingress")


# --- fallback ------------------------------------------------------------------------------------


CLIENT_1 = FlowKey.make("udp", ("10.0.0.1", 5000), ("10.0.0.254", PORT))


def test_userspace_flows_forget_the_least_recently_seen_beyond_the_bound() -> None:
    flows = UserspaceFlows(max_flows=3)
    for i in range(4):
        flows.record_packet("udp", (f"10.0.0.{i}", 5000), ("10.0.0.254", PORT), 100, now_ns=i)
    flows.record_packet("udp", ("10.0.0.1", 5000), ("10.0.0.254", PORT), 50, now_ns=9)  # touch: most recent
    flows.record_packet("udp", ("10.0.0.9", 5000), ("10.0.0.254", PORT), 10, now_ns=10)
    assert len(flows) == 3
    assert {r.client[0] for r in flows.flows()} == {"10.0.0.1", "10.0.0.3", "10.0.0.9"}


def test_userspace_flows_count_packets_and_bytes_as_the_kernel_does() -> None:
    flows = UserspaceFlows()
    flows.record_packet("udp", ("10.0.0.1", 5000), ("10.0.0.254", PORT), 100, now_ns=1)
    flows.record_packet("udp", ("10.0.0.1", 5000), ("10.0.0.254", PORT), 50, now_ns=9)
    rec = flows.lookup_flow(CLIENT_1)
    assert rec is not None and (rec.packets, rec.bytes, rec.last_ns) == (2, 150, 9)
    assert rec.proto == "udp" and rec.client == ("10.0.0.1", 5000)


def test_userspace_flows_keep_a_flows_last_ten_digests() -> None:
    flows = UserspaceFlows()
    flows.record_packet("udp", ("10.0.0.1", 5000), ("10.0.0.254", PORT), 100, now_ns=1)
    flows.write_digests(CLIENT_1, [bytes([i]) * 32 for i in range(12)])
    rec = flows.lookup_flow(CLIENT_1)
    assert rec is not None and rec.digests == tuple(bytes([i]) * 32 for i in range(2, 12)) and rec.packets == 1


def test_userspace_allowlist_matches_v4_v6_and_mapped_clients_and_counts_drops() -> None:
    flows = UserspaceFlows()
    flows.set_allowlist(["10.0.0.0/8", "2001:db8::/32"])
    assert flows.allowed("10.1.2.3") and flows.allowed("::ffff:10.1.2.3") and not flows.allowed("192.0.2.1")
    assert flows.allowed("2001:db8::5") and flows.verdict_counts()["tc_drop"] == 1
    flows.set_allowlist([])
    assert flows.allowed("192.0.2.1")


@pytest.fixture
def readable_object(bpf_object: Path) -> Iterator[Path]:
    """The object in a folder of its own, readable by anyone."""
    d = Path(tempfile.mkdtemp(prefix="zl-bpf-"))
    d.chmod(0o755)
    obj = d / "zerolayer.bpf.o"
    shutil.copy(bpf_object, obj)
    obj.chmod(0o644)
    yield obj
    shutil.rmtree(d)


def run_unprivileged(mode: str, obj: Path, pin_root: Path) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(f"""
        import logging, sys
        from pathlib import Path
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
        from appliance.kernel import open_kernel_layer
        layer = open_kernel_layer({mode!r}, ports=[{PORT}], object_path=Path({str(obj)!r}),
                                  pin_root=Path({str(pin_root)!r}))
        print(type(layer).__name__)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": "/tmp"}
    return subprocess.run([*UNPRIVILEGED, sys.executable, "-c", code], capture_output=True, text=True, cwd="/tmp",
                          env=env, check=False)  # fmt: skip


def test_required_unprivileged_fails_with_the_kernels_reason(readable_object: Path, pin_root: Path) -> None:
    proc = run_unprivileged("required", readable_object, pin_root)
    assert proc.returncode != 0
    assert "KernelLayerError: kernel layer:" in proc.stderr
    assert "Operation not permitted" in proc.stderr or "Permission denied" in proc.stderr, proc.stderr


def test_auto_unprivileged_falls_back_with_one_log_line(readable_object: Path, pin_root: Path) -> None:
    proc = run_unprivileged("auto", readable_object, pin_root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "UserspaceFlows"
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "kernel layer unavailable" in warnings[0], proc.stderr
    assert "not permitted" in warnings[0] or "Permission denied" in warnings[0]


@pytest.mark.usefixtures("echo")
def test_attach_replaces_what_a_killed_run_left_attached(bpf_object: Path, pin_root: Path, netpair: NetPair) -> None:
    """A daemon killed with SIGKILL cannot detach: its filters and XDP program stay in the kernel.
    The next run must replace them, not stack beside them (every packet counted twice) or fail on
    the XDP program (EBUSY), and its stop must then leave nothing behind."""
    code = textwrap.dedent(f"""
        from pathlib import Path
        from appliance.kernel import open_kernel_layer
        layer = open_kernel_layer("required", ports=[{PORT}], interfaces=[{netpair.server_if!r}], xdp="generic",
                                  object_path=Path({str(bpf_object)!r}), pin_root=Path({str(pin_root)!r}),
                                  netns={netpair.server_ns!r})
        print("attached", flush=True)
        import time; time.sleep(60)
    """)
    crashed = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert crashed.stdout is not None and crashed.stdout.readline().strip() == "attached"
    crashed.kill()
    crashed.wait()
    assert "zerolayer" in tc_filters(netpair, "ingress")  # the kernel kept them
    layer = KernelLayer(bpf_object, pin_root, netpair.server_ns)
    try:
        layer.set_ports([PORT])
        layer.attach([netpair.server_if], xdp="generic")
        for hook in ("ingress", "egress"):
            assert tc_filters(netpair, hook).count("zerolayer") == 1
        result = send(netpair, [100, 200])
        rec = layer.lookup_flow(FlowKey.make("udp", (netpair.client4, result["port"]), (netpair.server4, PORT)))
        assert result["received"] == 2 and rec is not None and rec.packets == 4  # counted once each way
        layer.detach()
        assert "zerolayer" not in tc_filters(netpair, "ingress") + tc_filters(netpair, "egress")
        assert "xdp" not in sh("ip", "-n", netpair.server_ns, "link", "show", netpair.server_if)
        assert "clsact" not in sh("ip", "netns", "exec", netpair.server_ns, "tc", "qdisc", "show", "dev",
                                  netpair.server_if)  # fmt: skip
    finally:
        layer.close()
