"""The servers one benchmark run starts and stops itself: the Zerolayer daemon and the layered
baseline (Redis, the layer service, nginx as the TLS gateway), on loopback or inside a network
namespace, and the namespace pair with netem for the lossy link.

Every process is a child of the benchmark, started here and stopped here (also on error).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from appliance.client import ApplianceClient
from appliance.devsetup import write_dev_config
from appliance.tls import DEV_HOSTS, make_dev_cert
from bench.protocol.layer import record_key
from bench.protocol.paths import Target

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Stack:
    target: Target
    internal_ports: list[int]  # behind the gateway: the layer service and Redis
    servers: list[Server] = field(default_factory=list)

    def pids(self) -> dict[str, int]:
        return {s.name: s.proc.pid for s in self.servers}

    def check(self) -> None:
        for s in self.servers:
            if s.proc.poll() is not None:
                raise RuntimeError(f"{s.name} exited with {s.proc.returncode}: {tail(s.log)}")


def tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def in_ns(ns: str | None, cmd: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *cmd] if ns else cmd


def _spawn(stack: Stack, name: str, cmd: list[str], work: Path, ns: str | None) -> Server:
    log = work / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(in_ns(ns, cmd), stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)  # fmt: skip
    server = Server(name, proc, log)
    stack.servers.append(server)
    return server


def _wait_tcp(host: str, port: int, ns: str | None, stack: Stack, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    probe = f"import socket; socket.create_connection(({host!r}, {port}), 1).close()"
    while True:
        stack.check()
        if ns is None:
            with contextlib.suppress(OSError), socket.create_connection((host, port), 1):
                return
        elif subprocess.run(in_ns(ns, [sys.executable, "-c", probe]), capture_output=True).returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens on {host}:{port} after {timeout:.0f} s")
        time.sleep(0.1)


def nginx_conf(work: Path, host: str, port: int, layer_port: int, cert: Path, key: Path) -> str:
    temp = work / "nginx-temp"
    temp.mkdir(exist_ok=True)
    return f"""\
# The layered baseline's API gateway: TLS termination, then the layer service.
user root;
worker_processes auto;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    keepalive_requests 1000000;
    upstream layer {{
        server 127.0.0.1:{layer_port};
        keepalive 64;
    }}
    server {{
        listen {host}:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.3;
        location /v1/layer/ {{
            proxy_pass http://layer;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


def start_stack(work: Path, bundle: Path, trusted_keys: Path, host: str = "127.0.0.1",
                ns: str | None = None, extra_hosts: tuple[str, ...] = ()) -> Stack:  # fmt: skip
    """The daemon and the layered baseline; in `ns` (fixed ports) or on loopback (free ports)."""
    work.mkdir(parents=True, exist_ok=True)
    root = work / "zerolayer"
    make_dev_cert(root / "tls", (*DEV_HOSTS, *extra_hosts))  # before write_dev_config, which keeps it
    if ns is None:
        tcp, quic, gw, layer, rds = (free_port(), free_port(socket.SOCK_DGRAM), free_port(), free_port(), free_port())
    else:
        tcp, quic, gw, layer, rds = 8443, 8443, 9443, 9080, 9379
    setup = write_dev_config(root, bundle, trusted_keys, tcp=f"{host}:{tcp}", quic=f"{host}:{quic}",
                             extra='[limits]\nmax_queued = 512\n\n[log]\nlevel = "warning"\n')  # fmt: skip
    model = json.loads((bundle / "manifest.json").read_text())["name"]
    target = Target(host, tcp, quic, gw, str(setup.unix_socket), str(setup.ca_cert), setup.api_key, model, str(bundle))
    stack = Stack(target, [layer, rds])
    try:
        zl = Path(sys.executable).with_name("zerolayer")
        daemon = _spawn(stack, "zerolayer", [str(zl), "serve", "--config", str(root)], work, ns)
        _spawn(stack, "redis", ["redis-server", "--bind", "127.0.0.1", "--port", str(rds), "--save", "",
                                "--appendonly", "no", "--daemonize", "no", "--dir", str(work)], work, ns)  # fmt: skip
        _wait_tcp("127.0.0.1", rds, ns, stack)
        endpoint = f"https://{host}:{tcp}/v1/messages"
        record = json.dumps({"endpoint": endpoint, "model": model, "tier": "standard"})
        subprocess.run(in_ns(ns, ["redis-cli", "-p", str(rds), "SET", record_key(setup.api_key), record]),
                       check=True, capture_output=True)  # fmt: skip
        _spawn(stack, "layer", [sys.executable, "-m", "bench.protocol.layer", "--port", str(layer),
                                "--redis-port", str(rds)], work, ns)  # fmt: skip
        tls = root / "tls"
        conf = work / "nginx.conf"
        conf.write_text(nginx_conf(work, host, gw, layer, tls / "server.crt", tls / "server.key"))
        _spawn(stack, "nginx", ["nginx", "-c", str(conf), "-p", str(work)], work, ns)
        _wait_tcp("127.0.0.1", layer, ns, stack)
        _wait_tcp(host, gw, ns, stack)
        client = ApplianceClient(str(setup.unix_socket), timeout=5)
        deadline = time.monotonic() + 300
        while True:  # the daemon is ready once its firmware is verified, its engine warm, its listeners bound
            if daemon.proc.poll() is not None:
                raise RuntimeError(f"zerolayer exited with {daemon.proc.returncode}: {tail(daemon.log)}")
            with contextlib.suppress(OSError):
                if client.get_json("/readyz")[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("zerolayer not ready after 300 s")
            time.sleep(0.2)
        stack.check()
    except BaseException:
        stop_stack(stack)
        raise
    return stack


def stop_stack(stack: Stack) -> None:
    """SIGTERM each server (its whole process group), SIGKILL what is left after 10 s."""
    for s in reversed(stack.servers):
        if s.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(s.proc.pid, signal.SIGTERM)
    for s in reversed(stack.servers):
        try:
            s.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(s.proc.pid, signal.SIGKILL)
            s.proc.wait(5)
    stack.servers.clear()


# --- the lossy link ------------------------------------------------------------------------------


@dataclass
class NetPair:
    server_ns: str
    client_ns: str
    server_ip: str
    client_ip: str
    link_report: list[str] = field(default_factory=list)  # the forwarder's counts, after exit


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


@contextlib.contextmanager
def lossy_pair(delay_ms: float, loss_pct: float) -> Iterator[NetPair]:
    """Two fresh namespaces joined by a link that delays each packet `delay_ms` one way (twice that
    per round trip) and drops `loss_pct` % each way: TUN devices bridged by bench.protocol.wire,
    since this kernel has no sch_netem. Everything is deleted on exit."""
    if shutil.which("ip") is None:
        raise RuntimeError("the lossy link needs iproute2")
    tag = uuid.uuid4().hex[:6]
    pair = NetPair(f"zlp-{tag}-s", f"zlp-{tag}-c", "10.211.0.1", "10.211.0.2")
    ifname = f"zpt{tag}"
    wire: subprocess.Popen[str] | None = None
    try:
        _ip("netns", "add", pair.server_ns)
        _ip("netns", "add", pair.client_ns)
        wire = subprocess.Popen([sys.executable, "-m", "bench.protocol.wire", pair.server_ns, pair.client_ns, ifname,
                                 str(delay_ms), str(loss_pct)], stdout=subprocess.PIPE, text=True, cwd=REPO,
                                start_new_session=True)  # fmt: skip
        assert wire.stdout is not None
        if wire.stdout.readline().strip() != "ready":
            raise RuntimeError("the link forwarder did not start")
        for ns, addr in ((pair.server_ns, pair.server_ip), (pair.client_ns, pair.client_ip)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
            _ip("-n", ns, "link", "set", ifname, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        if wire is not None:
            wire.terminate()
            try:
                out, _ = wire.communicate(timeout=10)
                pair.link_report.append(out.strip())
            except subprocess.TimeoutExpired:
                wire.kill()
                wire.wait()
        for ns in (pair.server_ns, pair.client_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
