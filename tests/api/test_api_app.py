"""The ASGI app called directly (no sockets): readiness, a full queue, metrics; and the key CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from battery import call_app

import firmware
from appliance.api import ApiApp, ApiSettings, KeyStore
from appliance.api.auth import add_key, revoke_key
from appliance.engine import Engine, EngineConfig
from appliance.served import ServedModels


async def _call(app: ApiApp, method: str, path: str, body: Any = None, transport: str = "unix",
                headers: list[tuple[bytes, bytes]] | None = None, connected_for: float = 3600.0,
                on_send: Callable[[int], Awaitable[None]] | None = None,
                ) -> tuple[int, dict[bytes, bytes], bytes]:  # fmt: skip
    data = b"" if body is None else json.dumps(body).encode()
    return await call_app(app, method, path, data, headers, transport, connected_for, on_send)


@pytest.fixture()
def engine(tiny_bundle_path: Path, trusted_keys: Path):  # type: ignore[no-untyped-def]
    eng = Engine(firmware.load(tiny_bundle_path, trusted_keys),
                 EngineConfig(max_active_per_device=1, max_queued=1, prefix_cache_bytes=0))  # fmt: skip
    yield eng
    eng.close()


REQ = {"model": "tiny-llama", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def test_not_ready_is_503_but_health_answers(engine: Engine) -> None:
    app = ApiApp(ServedModels.of(engine), ApiSettings(keys=KeyStore([])))

    async def run() -> None:
        assert (await _call(app, "GET", "/healthz"))[0] == 200
        status, _, _ = await _call(app, "GET", "/readyz")
        assert status == 503
        status, headers, body = await _call(app, "POST", "/v1/messages", REQ)
        assert status == 503 and headers[b"retry-after"] == b"1"
        assert json.loads(body)["error"]["type"] == "api_error"
        assert (await _call(app, "GET", "/health"))[0] == 503  # llama.cpp's and vLLM's name for readiness
        app.set_ready(True)
        assert (await _call(app, "GET", "/readyz"))[0] == (await _call(app, "GET", "/health"))[0] == 200
        assert (await _call(app, "POST", "/v1/messages", REQ))[0] == 200

    asyncio.run(run())


def test_full_queue_is_529_for_anthropic_and_429_for_openai(engine: Engine) -> None:
    app = ApiApp(ServedModels.of(engine), ApiSettings(keys=KeyStore([])))
    app.set_ready(True)
    session = engine.workers["cpu"].session
    release = threading.Event()
    real_forward = session.forward

    def held_forward(*args, **kwargs):  # type: ignore[no-untyped-def]
        release.wait(30)  # the running request holds the device until the test lets go
        return real_forward(*args, **kwargs)

    session.forward = held_forward  # type: ignore[method-assign]

    async def run() -> None:
        # One runs, one waits: the queue (max_queued=1) is then full.
        hogs = []
        for _ in range(2):
            hogs.append(asyncio.create_task(_call(app, "POST", "/v1/messages", {**REQ, "stream": True})))
            await asyncio.sleep(0.2)  # let the worker admit the first before the second queues
        status, headers, body = await _call(app, "POST", "/v1/messages", REQ)
        assert status == 529 and headers[b"retry-after"] == b"1"
        assert json.loads(body)["error"]["type"] == "overloaded_error"
        chat = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]}
        status, headers, body = await _call(app, "POST", "/v1/chat/completions", chat)
        assert status == 429 and headers[b"retry-after"] == b"1"
        assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"
        release.set()
        for h in hogs:
            status, _, _ = await h
            assert status == 200  # the queued ones are served once the device is free

    try:
        asyncio.run(run())
    finally:
        release.set()
        session.forward = real_forward  # type: ignore[method-assign]


def test_n_choices_that_do_not_fit_the_queue_are_429_and_a_client_gone_early_is_499(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # One slot and one place in the queue: the first choice runs, the second waits, the third
    # finds the queue full, so the whole request is refused before any header went out.
    app = ApiApp(ServedModels.of(engine), ApiSettings(keys=KeyStore([])))
    app.set_ready(True)
    chat = {"model": "tiny-llama", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    worker = engine.workers["cpu"]

    async def idle() -> None:  # the refused request's choices leave at the worker's next step
        for _ in range(250):
            if not worker.depth:
                return
            await asyncio.sleep(0.02)

    async def run() -> list[tuple[int, bytes]]:
        out = []
        for stream in (False, True):  # long enough that the first choice still runs when the third is queued
            status, _, body = await _call(app, "POST", "/v1/chat/completions",
                                          {**chat, "n": 3, "stream": stream, "max_tokens": 512})  # fmt: skip
            out.append((status, body))
            await idle()
        status, _, body = await _call(app, "POST", "/v1/chat/completions", {**chat, "n": 2, "stream": True})
        out.append((status, body))  # fits: one runs, one waits
        for stream in (False, True):  # the client leaves before the first choice is even prefilled
            status, _, body = await _call(app, "POST", "/v1/chat/completions", {**chat, "n": 2, "stream": stream},
                                          connected_for=0)  # fmt: skip
            out.append((status, body))
            await idle()
        return out

    with caplog.at_level("INFO"):
        whole, streamed, fits, *_ = asyncio.run(run())
    for status, body in (whole, streamed):
        assert status == 429 and json.loads(body)["error"]["code"] == "rate_limit_exceeded"
    assert fits[0] == 200
    indices = {c["index"] for line in fits[1].decode().splitlines() if line.startswith("data: {")
               for c in json.loads(line[6:])["choices"]}  # fmt: skip
    assert indices == {0, 1} and fits[1].endswith(b"data: [DONE]\n\n")
    text = app.metrics.render().decode()  # the client was gone: what it was sent matters to no one
    assert 'zerolayer_requests_total{api="openai",code="499",transport="unix"} 2.0' in text
    assert worker.depth == 0
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]


def test_metrics_count_requests_tokens_and_latency(engine: Engine) -> None:
    app = ApiApp(ServedModels.of(engine), ApiSettings(keys=KeyStore([])))
    app.set_ready(True)

    async def run() -> str:
        await _call(app, "POST", "/v1/messages", REQ)
        await _call(app, "POST", "/v1/messages", {"bad": 1})
        await _call(app, "POST", "/v1/messages", REQ, transport="tcp")  # no key on a network transport
        return (await _call(app, "GET", "/metrics"))[2].decode()

    text = asyncio.run(run())
    assert 'zerolayer_requests_total{api="anthropic",code="200",transport="unix"} 1.0' in text
    assert 'zerolayer_requests_total{api="anthropic",code="400",transport="unix"} 1.0' in text
    assert 'zerolayer_requests_total{api="anthropic",code="401",transport="tcp"} 1.0' in text
    assert 'zerolayer_tokens_total{kind="input"}' in text
    assert "zerolayer_time_to_first_token_seconds_count 1.0" in text
    assert "zerolayer_queue_depth 0.0" in text and "zerolayer_active_streams 0.0" in text


def test_keys_are_stored_hashed_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "api-keys"
    key = add_key(path, "alice")
    add_key(path, "ops", debug=True)
    assert key not in path.read_text()  # only the hash is stored
    store = KeyStore.load(path)
    found = store.check(key)
    assert found is not None and found.name == "alice" and not found.debug
    assert store.check(key + "x") is None and store.check("") is None
    with pytest.raises(ValueError, match="exists already"):
        add_key(path, "alice")
    assert revoke_key(path, "alice") and not revoke_key(path, "alice")
    assert KeyStore.load(path).check(key) is None


def test_keys_and_dev_cert_cli(tmp_path: Path) -> None:
    def zl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "appliance.cli", *args], capture_output=True, text=True)

    keys = tmp_path / "keys"
    added = zl("keys", "add", "bob", "--file", str(keys), "--debug")
    assert added.returncode == 0 and added.stdout.startswith("zl-") and "shown only this once" in added.stderr
    listed = zl("keys", "list", "--file", str(keys))
    assert listed.stdout.strip() == "bob  (debug)"
    assert zl("keys", "revoke", "bob", "--file", str(keys)).returncode == 0
    assert zl("keys", "revoke", "bob", "--file", str(keys)).returncode == 1
    cert = zl("tls", "dev-cert", "--out", str(tmp_path / "tls"))
    assert cert.returncode == 0 and (tmp_path / "tls" / "server.crt").is_file()


def test_metrics_carry_slots_kv_prefix_cache_and_firmware_and_need_a_key_on_the_network(
    tiny_bundle_path: Path, trusted_keys: Path
) -> None:
    from appliance.api.metrics import Metrics

    bundle = firmware.load(tiny_bundle_path, trusted_keys)
    engine = Engine(bundle, EngineConfig(max_active_per_device=3, prefix_cache_bytes=8 << 20, prefix_block_tokens=8))
    metrics = Metrics()
    metrics.add_engines(lambda: {bundle.name: engine})
    metrics.set_firmware(bundle.name, bundle.name, bundle.version, bundle.signer_key_id)
    app = ApiApp(ServedModels.of(engine), ApiSettings(keys=KeyStore([])), metrics)
    app.set_ready(True)
    body = {**REQ, "max_tokens": 2, "messages": [{"role": "user", "content": "Tell me about loops, lists and dicts."}]}

    async def run() -> tuple[str, int, int]:
        for _ in range(2):  # the second finds the first's prompt in the pool
            assert (await _call(app, "POST", "/v1/messages", body))[0] == 200
        local = (await _call(app, "GET", "/metrics"))[2].decode()
        network = (await _call(app, "GET", "/metrics", transport="tcp"))[0]
        keyed = (await _call(app, "GET", "/metrics", transport="tcp", headers=[(b"x-api-key", b"zl-nope")]))[0]
        return local, network, keyed

    try:
        text, network, keyed = asyncio.run(run())
    finally:
        engine.close()
    assert network == 401 and keyed == 401  # no key, a wrong key: the network needs a real one
    model = f'model="{bundle.name}"'
    assert f'zerolayer_slots{{device="cpu",{model}}} 3.0' in text
    assert f'zerolayer_slots_active{{device="cpu",{model}}} 0.0' in text
    assert "zerolayer_kv_budget_positions" in text
    assert f"zerolayer_prefix_cache_lookups_total{{{model}}} 2.0" in text
    assert f"zerolayer_prefix_cache_hits_total{{{model}}} 1.0" in text
    assert f"zerolayer_prefix_cache_misses_total{{{model}}} 1.0" in text
    reused = next(line for line in text.splitlines() if line.startswith("zerolayer_prefix_cache_reused_tokens_total"))
    assert float(reused.split()[1]) >= 8
    labels = f'{model},name="{bundle.name}",signer="{bundle.signer_key_id}",version="{bundle.version}"'
    assert f"zerolayer_firmware_info{{{labels}}} 1.0" in text


def test_a_long_conversation_is_prepared_off_the_event_loop_and_an_endless_one_refused(engine: Engine) -> None:
    from appliance.engine.request import MAX_MESSAGES

    app = ApiApp(ServedModels.of(engine), ApiSettings(keys=KeyStore([])))
    app.set_ready(True)
    threads: list[str] = []
    real_prepare = engine.prepare

    def recording_prepare(request):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        return real_prepare(request)

    engine.prepare = recording_prepare  # type: ignore[method-assign]

    def turns(n: int) -> list[dict[str, str]]:
        return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(n)]

    async def run() -> tuple[int, bytes, str]:
        status, _, body = await _call(app, "POST", "/v1/messages", {**REQ, "messages": turns(MAX_MESSAGES + 1)})
        ok = (await _call(app, "POST", "/v1/messages", {**REQ, "messages": turns(61)}))[0]
        assert ok == 200
        return status, body, threading.current_thread().name

    try:
        status, body, loop_thread = asyncio.run(run())
    finally:
        engine.prepare = real_prepare  # type: ignore[method-assign]
    assert status == 400 and f"at most {MAX_MESSAGES} messages" in json.loads(body)["error"]["message"]
    assert threads and loop_thread not in threads  # templating and tokenizing ran in a worker thread


def test_message_boundaries_cost_a_bounded_number_of_renders(engine: Engine) -> None:
    from appliance.engine import Message
    from appliance.engine.chat import BOUNDARY_MESSAGES

    template = engine.template
    calls = []
    real_render = template.render

    def counting_render(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real_render(*args, **kwargs)

    template.render = counting_render  # type: ignore[method-assign]
    try:
        messages = tuple(Message("user" if i % 2 == 0 else "assistant", f"turn {i}") for i in range(1001))
        prompt = template.prompt(messages)
    finally:
        template.render = real_render  # type: ignore[method-assign]
    assert len(calls) <= BOUNDARY_MESSAGES + 1  # not one render per prefix (that was quadratic)
    assert len(prompt.message_starts) == BOUNDARY_MESSAGES  # the last ones, for the shard cuts near the end


def test_a_client_that_goes_away_is_499_not_500_and_no_error_is_logged(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # a lab box: no key on the network
    app = ApiApp(ServedModels.of(engine), ApiSettings(keys=KeyStore([]), auth_required=False))
    app.set_ready(True)
    body = {**REQ, "max_tokens": 200, "stream": True}

    async def reset_after_three(n: int) -> None:  # the transport's send fails: an HTTP/3 stream reset
        if n > 3:
            raise ConnectionResetError("stream reset by the client")

    async def slow_reader(n: int) -> None:
        await asyncio.sleep(0.01)

    async def reset_mid_stream() -> None:
        await _call(app, "POST", "/v1/messages", body, transport="http3", on_send=reset_after_three)

    async def disconnect_mid_stream() -> None:  # the transport reports a disconnect (TCP, the Unix socket)
        await _call(app, "POST", "/v1/messages", body, transport="tcp", connected_for=0.05, on_send=slow_reader)

    with caplog.at_level("INFO"):
        asyncio.run(reset_mid_stream())
        asyncio.run(disconnect_mid_stream())
    text = app.metrics.render().decode()
    assert 'zerolayer_requests_total{api="anthropic",code="499",transport="http3"} 1.0' in text
    assert 'zerolayer_requests_total{api="anthropic",code="499",transport="tcp"} 1.0' in text
    assert 'code="500"' not in text
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]
