"""The daemon under a service manager's protocols: sd_notify (STATUS, READY only when ready,
WATCHDOG at half the interval and none once the engine stalls, RELOADING/READY on SIGHUP,
STOPPING on SIGTERM), socket activation through systemd-socket-activate, live reload, drain."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import threading
import time
from pathlib import Path

import httpx2 as httpx
import pytest
from daemon_process import NotifySocket, daemon_process
from daemon_thread import RunningDaemon

from appliance.devsetup import DevSetup, write_dev_config

REQ = {"model": "tiny-llama", "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]}
LONG = {"model": "tiny-llama", "max_tokens": 400, "stream": True,
        "messages": [{"role": "user", "content": "Go on."}]}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture()
def setup(tiny_bundle_path: Path, trusted_keys: Path, tmp_path: Path) -> DevSetup:
    return write_dev_config(tmp_path / "etc", tiny_bundle_path, trusted_keys, tcp=f"127.0.0.1:{_free_port()}",
                            extra="[limits]\ndrain_timeout = 20\n")  # fmt: skip


def _tcp_url(setup: DevSetup) -> str:
    from appliance.config import load_config

    return f"https://localhost:{load_config(setup.root).listen.tcp.rpartition(':')[2]}/v1/messages"


def _unix_client(setup: DevSetup) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(setup.unix_socket)), base_url="http://localhost",
                        timeout=60)  # fmt: skip


def test_notify_sequence_ready_reload_stopping(setup: DevSetup, tmp_path: Path) -> None:
    notify = NotifySocket(tmp_path / "notify.sock")
    with daemon_process(setup.root, notify) as proc:
        notify.wait_for("READY=1")
        with _unix_client(setup) as c:  # READY=1 came only once /readyz answers 200
            assert c.get("/readyz").status_code == 200
        statuses = [f for f in notify.fields() if f.startswith("STATUS=")]
        assert statuses[0].startswith("STATUS=verifying firmware")
        assert any(s.startswith("STATUS=warming engine on cpu") for s in statuses)
        before_ready = notify.fields()[: notify.fields().index("READY=1")]
        assert any(f.startswith("EXTEND_TIMEOUT_USEC=") for f in before_ready)
        proc.send_signal(signal.SIGHUP)
        notify.wait_for("RELOADING=1", 10)
        notify.wait_for("READY=1", 10)
        reload_msg = next(m for _, m in notify.messages if "RELOADING=1" in m)
        assert any(f.startswith("MONOTONIC_USEC=") for f in reload_msg.split("\n"))
        proc.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1", 10)
        assert proc.wait(30) == 0


def test_watchdog_pings_at_half_the_interval_and_stop_when_the_engine_stalls(
    setup: DevSetup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notify = NotifySocket(tmp_path / "notify.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify.path))
    monkeypatch.setenv("WATCHDOG_USEC", "400000")  # 0.4 s: pings every 0.2 s
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    from appliance.systemd import Notifier

    running = RunningDaemon(setup.root, notifier=Notifier()).start()
    try:
        notify.collect(1.5)
        pings = [t for t, m in notify.messages if m == "WATCHDOG=1"]
        assert 5 <= len(pings) <= 9, len(pings)  # ~7 in 1.5 s
        engine = running.daemon.engine
        assert engine is not None
        worker = engine.workers["cpu"]
        release = threading.Event()
        real_forward = worker.session.forward

        def stuck_forward(*args, **kwargs):  # type: ignore[no-untyped-def]
            release.wait(30)  # a hung model run
            return real_forward(*args, **kwargs)

        worker.session.forward = stuck_forward  # type: ignore[method-assign]
        with _unix_client(setup) as c, contextlib.suppress(httpx.TimeoutException):
            c.post("/v1/messages", json=REQ, timeout=0.3)
        time.sleep(1.0)  # past the stall limit (the full WATCHDOG_USEC)
        notify.drain_pending()  # pings sent before the stall was detected sat in the socket's buffer
        notify.messages.clear()
        notify.collect(1.0)
        assert "WATCHDOG=1" not in notify.fields()  # a hung engine stops the pings
        worker.session.forward = real_forward  # type: ignore[method-assign]
        release.set()
        notify.collect(1.0)
        assert "WATCHDOG=1" in notify.fields()  # and they resume once it moves again
    finally:
        running.stop()


def test_socket_activation_with_named_fds(setup: DevSetup, tmp_path: Path) -> None:
    """systemd-socket-activate hands over a datagram, a stream and a Unix socket, by name.
    The first UDP datagram and TCP connection wait in the kernel until the daemon takes them."""
    port = _free_port()
    sock_path = tmp_path / "activated.sock"
    notify = NotifySocket(tmp_path / "notify.sock")
    env = f"--setenv=NOTIFY_SOCKET={notify.path}"  # it passes on only what it is told to
    prefix = ["systemd-socket-activate", "-d", "-l", f"127.0.0.1:{port}", "--fdname=quic", env,
              "systemd-socket-activate", "-l", f"127.0.0.1:{port}", "-l", str(sock_path),
              "--fdname=quic:tcp:unix", env, "--setenv=ZEROLAYER_CACHE", "--setenv=PATH"]  # fmt: skip
    # The config names other addresses: the activated sockets must win.
    with daemon_process(setup.root, notify, argv_prefix=prefix) as proc:
        deadline = time.monotonic() + 10
        while not sock_path.exists() and time.monotonic() < deadline:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                udp.sendto(b"\0wake", ("127.0.0.1", port))  # garbage to QUIC: dropped, but starts us
            time.sleep(0.1)
        ctx = ssl.create_default_context(cafile=str(setup.ca_cert))
        with httpx.Client(verify=ctx, timeout=120) as c:  # queued in the backlog until the daemon is up
            r = c.post(f"https://localhost:{port}/v1/messages", json=REQ, headers={"x-api-key": setup.api_key})
            assert r.status_code == 200, r.text
        try:
            notify.wait_for("READY=1", 60)
        except AssertionError:
            proc.kill()
            raise AssertionError(proc.communicate()[0][-3000:]) from None
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock_path)), timeout=60) as c:
            assert c.post("http://localhost/v1/messages", json=REQ).status_code == 200
        import niquests

        with niquests.Session(disable_http1=True, disable_http2=True) as s:
            r3 = s.post(f"https://localhost:{port}/v1/messages", json=REQ, verify=str(setup.ca_cert),
                        headers={"x-api-key": setup.api_key})  # fmt: skip
            assert r3.status_code == 200 and r3.http_version == 30
        assert not setup.unix_socket.exists()  # the configured socket was not bound
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def _stream_in_thread(setup: DevSetup, out: dict[str, object]) -> threading.Thread:
    def run() -> None:
        with _unix_client(setup) as c, c.stream("POST", "/v1/messages", json=LONG) as r:
            out["status"] = r.status_code
            out["body"] = b"".join(r.iter_bytes())

    t = threading.Thread(target=run)
    t.start()
    return t


def test_reload_applies_a_good_change_without_dropping_a_stream_and_rejects_a_bad_one(
    setup: DevSetup, tmp_path: Path
) -> None:
    from appliance.api.auth import add_key

    notify = NotifySocket(tmp_path / "notify.sock")
    with daemon_process(setup.root, notify) as proc:
        notify.wait_for("READY=1")
        ctx = ssl.create_default_context(cafile=str(setup.ca_cert))
        tcp = _tcp_url(setup)
        new_key = add_key(setup.root / "api-keys", "late")
        with httpx.Client(verify=ctx, timeout=60) as c:
            assert c.post(tcp, json=REQ, headers={"x-api-key": new_key}).status_code == 401  # not yet loaded
        out: dict[str, object] = {}
        t = _stream_in_thread(setup, out)
        time.sleep(0.3)
        proc.send_signal(signal.SIGHUP)
        notify.wait_for("RELOADING=1", 10)
        notify.wait_for("READY=1", 10)
        with httpx.Client(verify=ctx, timeout=60) as c:
            assert c.post(tcp, json=REQ, headers={"x-api-key": new_key}).status_code == 200
        t.join(60)
        assert out["status"] == 200 and b"message_stop" in out["body"]  # type: ignore[operator]
        # A bad drop-in: rejected naming file and key; the old config keeps serving.
        (setup.root / "conf.d").mkdir()
        (setup.root / "conf.d" / "50-typo.toml").write_text("[limits]\nmax_queue = 5\n")
        proc.send_signal(signal.SIGHUP)
        notify.wait_for("RELOADING=1", 10)
        notify.wait_for("READY=1", 10)
        with httpx.Client(verify=ctx, timeout=60) as c:
            assert c.post(tcp, json=REQ, headers={"x-api-key": new_key}).status_code == 200
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    assert "reload rejected" in output and "50-typo.toml: unknown key limits.max_queue" in output
    assert "did you mean 'max_queued'?" in output


def test_sigterm_drains_a_stream_refuses_new_connections_and_exits_0(setup: DevSetup, tmp_path: Path) -> None:
    import niquests

    notify = NotifySocket(tmp_path / "notify.sock")
    with daemon_process(setup.root, notify) as proc:
        notify.wait_for("READY=1")
        out: dict[str, object] = {}
        t = _stream_in_thread(setup, out)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1", 10)
        time.sleep(0.3)
        started = time.monotonic()
        with pytest.raises(httpx.ConnectError), _unix_client(setup) as c:  # refused, not left waiting
            c.get("/healthz")
        with pytest.raises(httpx.ConnectError), httpx.Client(verify=str(setup.ca_cert)) as c:
            c.get(_tcp_url(setup).replace("/v1/messages", "/healthz"))
        with niquests.Session(disable_http1=True, disable_http2=True) as s, pytest.raises(niquests.RequestException):
            s.get(_tcp_url(setup).replace("/v1/messages", "/healthz"), verify=str(setup.ca_cert), timeout=5)
        assert time.monotonic() - started < 1.5
        t.join(60)
        assert proc.wait(30) == 0
    assert out["status"] == 200 and b"message_stop" in out["body"]  # type: ignore[operator]


def test_an_idle_pooled_tls_connection_does_not_hold_a_stop(setup: DevSetup) -> None:
    """An SDK keeps its connection in its pool between calls and answers nothing until it next
    uses it: the stop closes it and waited asyncio's 30 s for the client's close_notify
    (TLS_CLOSE_SECONDS now), after a drain with nothing in flight."""
    running = RunningDaemon(setup.root).start()
    with httpx.Client(verify=str(setup.ca_cert)) as pooled:
        assert pooled.get(_tcp_url(setup).replace("/v1/messages", "/healthz")).status_code == 200
        started = time.monotonic()
        running.stop()  # (a drain of 1 s)
        assert time.monotonic() - started < 10


def test_reload_swaps_the_tls_certificate_for_new_connections(setup: DevSetup) -> None:
    import niquests

    from appliance.tls import make_dev_cert

    running = RunningDaemon(setup.root).start()
    try:
        url = _tcp_url(setup).replace("/v1/messages", "/healthz")
        old_ca = ssl.create_default_context(cafile=str(setup.ca_cert))
        with httpx.Client(verify=old_ca) as c:
            assert c.get(url).status_code == 200
        make_dev_cert(setup.root / "tls")  # a new CA and leaf in the same files
        assert running.call(running.daemon.reload)
        new_ca = ssl.create_default_context(cafile=str(setup.ca_cert))
        with httpx.Client(verify=new_ca) as c:
            assert c.get(url).status_code == 200
        with pytest.raises(httpx.ConnectError), httpx.Client(verify=old_ca) as c:
            c.get(url)
        with niquests.Session(disable_http1=True, disable_http2=True) as s:
            r = s.get(f"https://localhost:{running.port('http3')}/healthz", verify=str(setup.ca_cert))
            assert r.status_code == 200 and r.http_version == 30
    finally:
        running.stop()


def test_journal_fields_come_from_the_log_record() -> None:
    import logging

    from appliance.systemd import JournalFieldsFilter

    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "m", None, None)
    record.request_id, record.device = "abc", "cuda:0"
    assert JournalFieldsFilter().filter(record)
    assert record.ZEROLAYER_REQUEST_ID == "abc" and record.ZEROLAYER_DEVICE == "cuda:0"  # type: ignore[attr-defined]


def test_logging_goes_to_the_journal_only_under_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from systemd.journal import JournalHandler

    from appliance.systemd import configure_logging

    root = logging.getLogger()
    saved = list(root.handlers), root.level
    try:
        monkeypatch.delenv("JOURNAL_STREAM", raising=False)
        configure_logging("info")
        assert [type(h) for h in root.handlers] == [logging.StreamHandler]
        monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
        configure_logging("debug")
        assert [type(h) for h in root.handlers] == [JournalHandler] and root.level == logging.DEBUG
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
