"""Several bundles served at once: requests route by `model` over every transport, the model list
names them all, an unknown model is a 404 in each dialect's shape that names them, and a reload
adds, replaces or drops one without touching the streams of the others. Two tiny fixtures of
different architectures stand in for two real models (their answers differ, so a misroute shows)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import niquests
import pytest
from clients import anthropic_client, openai_client
from daemon_thread import RunningDaemon

import firmware
from appliance.devsetup import DevSetup, write_dev_config

OTHER = "qwen"  # the second model's name in [firmware.bundles]
PROMPT = [{"role": "user", "content": "Explain the for statement and the else clause of a loop."}]


@pytest.fixture(scope="module")
def other_bundle_path() -> Path:
    from firmware.toolchain.tiny import tiny_bundle

    return tiny_bundle("qwen2")


@pytest.fixture(scope="module")
def first_model(tiny_bundle_path: Path, trusted_keys: Path) -> str:
    return firmware.load(tiny_bundle_path, trusted_keys).name


def _serve(root: Path, first: Path, trusted: Path, bundles: dict[str, Path]) -> tuple[RunningDaemon, DevSetup]:
    setup = write_dev_config(root, first, trusted, bundles=bundles)
    return RunningDaemon(setup.root).start(), setup


@pytest.fixture(scope="module")
def two(tiny_bundle_path: Path, other_bundle_path: Path, trusted_keys: Path,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, DevSetup]]:  # fmt: skip
    running, setup = _serve(tmp_path_factory.mktemp("two"), tiny_bundle_path, trusted_keys, {OTHER: other_bundle_path})
    yield running, setup
    running.stop()


def _unix(setup: DevSetup, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(setup.unix_socket)), timeout=60) as client:
        if body is None:
            return client.get(f"http://localhost{path}")
        return client.post(f"http://localhost{path}", json=body)


def _h3(running: RunningDaemon, setup: DevSetup, path: str, body: dict[str, Any]) -> niquests.Response:
    with niquests.Session(disable_http1=True, disable_http2=True) as s:
        r = s.post(f"https://localhost:{running.port('http3')}{path}", json=body, verify=str(setup.ca_cert),
                   headers={"x-api-key": setup.api_key}, timeout=60)  # fmt: skip
        assert r.http_version == 30
        return r


def _chat(model: str, max_tokens: int = 24, stream: bool = False) -> dict[str, Any]:
    return {"model": model, "messages": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": stream}


def _sse_text(body: str) -> str:
    text = []
    for line in body.splitlines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            text += [c["delta"].get("content") or "" for c in chunk.get("choices", [])]
    return "".join(text)


def test_each_model_answers_by_name_concurrently_over_http3_and_the_unix_socket(
        two: tuple[RunningDaemon, DevSetup], first_model: str) -> None:  # fmt: skip
    running, setup = two
    alone = {m: _unix(setup, "/v1/chat/completions", _chat(m)).json() for m in (first_model, OTHER)}
    assert alone[first_model]["model"] == first_model and alone[OTHER]["model"] == OTHER
    texts = {m: alone[m]["choices"][0]["message"]["content"] for m in alone}
    assert texts[first_model] != texts[OTHER]  # two different models: a misrouted request would show

    def ask(model: str, over_h3: bool) -> tuple[str, str]:
        if over_h3:
            doc = _h3(running, setup, "/v1/chat/completions", _chat(model)).json()
        else:
            doc = _unix(setup, "/v1/chat/completions", _chat(model)).json()
        return doc["model"], doc["choices"][0]["message"]["content"]

    work = [(m, h3) for m in (first_model, OTHER) for h3 in (True, False)] * 2
    with concurrent.futures.ThreadPoolExecutor(len(work)) as pool:
        answers = list(pool.map(lambda args: ask(*args), work))
    assert answers == [(m, texts[m]) for m, _ in work]


def test_the_model_list_names_every_model_and_an_unknown_one_is_a_404_naming_them(
        two: tuple[RunningDaemon, DevSetup], first_model: str) -> None:  # fmt: skip
    running, setup = two
    assert [m.id for m in openai_client(running, setup).models.list()] == [first_model, OTHER]
    claude = anthropic_client(running, setup, unix=True)
    assert [m.id for m in claude.models.list().data] == [first_model, OTHER]
    assert claude.models.retrieve(OTHER).id == OTHER
    import anthropic
    import openai

    with pytest.raises(anthropic.NotFoundError) as a:
        claude.messages.create(model="gemma-9000", max_tokens=4, messages=PROMPT)  # type: ignore[arg-type]
    assert a.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as o:
        openai_client(running, setup).chat.completions.create(model="gemma-9000", messages=PROMPT)  # type: ignore[arg-type]
    assert o.value.code == "model_not_found"
    for message in (a.value.message, o.value.message):
        assert "gemma-9000" in message and f"`{first_model}`" in message and f"`{OTHER}`" in message
    assert _unix(setup, "/v1/models/gemma-9000").status_code == 404
    info = running.call(running.daemon.status_info)
    assert [m["model"] for m in info["models"]] == [first_model, OTHER]  # type: ignore[index]
    import subprocess
    import sys

    status = subprocess.run([sys.executable, "-m", "appliance.cli", "status", "--socket", str(setup.unix_socket)],
                            capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    firmware_lines = [line for line in status.splitlines() if line.startswith("firmware:")]
    assert len(firmware_lines) == 2 and f"as model {OTHER} " in firmware_lines[1]


def _stream(setup: DevSetup, model: str, started: concurrent.futures.Future[None]) -> tuple[int, str, str]:
    """A streamed chat over the Unix socket: status, the text, and how it ended."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(setup.unix_socket)), timeout=120) as client, \
            client.stream("POST", "http://localhost/v1/chat/completions",
                          json=_chat(model, max_tokens=160, stream=True)) as r:  # fmt: skip
        body = []
        for line in r.iter_lines():
            if not started.done():
                started.set_result(None)
            if line:
                body.append(line)
    text = "\n".join(body)
    return r.status_code, _sse_text(text), body[-1] if body else ""


def _reload(running: RunningDaemon, setup: DevSetup, first: Path, trusted: Path, bundles: dict[str, Path]) -> None:
    write_dev_config(setup.root, first, trusted, bundles=bundles)
    _settle(running)


def _settle(running: RunningDaemon) -> None:
    """SIGHUP's work, and the firmware changes it loads in the background, done."""
    assert running.call(running.daemon.reload)
    task = running.daemon.reloading
    assert task is not None

    async def settled() -> None:
        await task

    asyncio.run_coroutine_threadsafe(settled(), running.loop).result(120)


def test_a_reload_drops_a_model_and_adds_it_back_while_streams_on_both_finish_whole(
        tiny_bundle_path: Path, other_bundle_path: Path, trusted_keys: Path, tmp_path: Path,
        first_model: str) -> None:  # fmt: skip
    running, setup = _serve(tmp_path, tiny_bundle_path, trusted_keys, {OTHER: other_bundle_path})
    try:
        before = _unix(setup, "/v1/chat/completions", _chat(OTHER)).json()["choices"][0]["message"]["content"]
        quiet = {m: _stream(setup, m, concurrent.futures.Future()) for m in (first_model, OTHER)}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            started = {m: concurrent.futures.Future[None]() for m in quiet}
            streams = {m: pool.submit(_stream, setup, m, started[m]) for m in quiet}
            for future in started.values():
                future.result(60)
            _reload(running, setup, tiny_bundle_path, trusted_keys, {})  # OTHER is no longer configured
            after = _unix(setup, "/v1/chat/completions", _chat(OTHER))
            results = {m: f.result(120) for m, f in streams.items()}
        # Both streams, the dropped model's included, ran to their end unchanged.
        assert results == quiet and all(r[2] == "data: [DONE]" for r in results.values())
        assert after.status_code == 404 and f"`{first_model}`" in after.json()["error"]["message"]
        assert running.daemon.models.names() == [first_model]
        _reload(running, setup, tiny_bundle_path, trusted_keys, {OTHER: other_bundle_path})
        back = _unix(setup, "/v1/chat/completions", _chat(OTHER)).json()
        assert back["model"] == OTHER and back["choices"][0]["message"]["content"] == before
    finally:
        running.stop()


def test_a_bundle_that_does_not_fit_is_refused_at_reload_and_the_others_serve_on(
        tiny_bundle_path: Path, other_bundle_path: Path, trusted_keys: Path, tmp_path: Path, first_model: str,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    import appliance.daemon

    running, setup = _serve(tmp_path, tiny_bundle_path, trusted_keys, {})
    try:
        monkeypatch.setattr(appliance.daemon, "available_host_memory", lambda: 1 << 20)  # a host with 1 MiB free
        with caplog.at_level(logging.ERROR, logger="appliance.daemon"):
            _reload(running, setup, tiny_bundle_path, trusted_keys, {OTHER: other_bundle_path})
        refusal = next(r.getMessage() for r in caplog.records if "does not fit" in r.getMessage())
        assert f"firmware {OTHER!r} does not fit on cpu" in refusal and "engine.kv_cache_mb" in refusal
        assert running.daemon.models.names() == [first_model]
        assert _unix(setup, "/v1/chat/completions", _chat(first_model)).status_code == 200
        assert _unix(setup, "/v1/chat/completions", _chat(OTHER)).status_code == 404
    finally:
        running.stop()


def test_a_table_name_that_repeats_the_first_bundles_name_is_refused_at_start(
        tiny_bundle_path: Path, other_bundle_path: Path, trusted_keys: Path, tmp_path: Path, first_model: str) -> None:
    from appliance.config import ConfigError

    with pytest.raises(ConfigError, match=f"the model name {first_model!r} is also firmware.path"):
        _serve(tmp_path, tiny_bundle_path, trusted_keys, {first_model: other_bundle_path})


def test_firmware_install_beside_serves_a_second_model_on_reload_and_remove_stops_it(
        tiny_bundle_path: Path, other_bundle_path: Path, trusted_keys: Path, tmp_path: Path, first_model: str,
        ) -> None:  # fmt: skip
    import subprocess
    import sys

    running, setup = _serve(tmp_path / "etc", tiny_bundle_path, trusted_keys, {})
    store = tmp_path / "store"

    def firmware_cli(*args: str | Path) -> str:
        done = subprocess.run([sys.executable, "-m", "appliance.cli", "firmware", *map(str, args),
                               "--store", str(store), "--config", str(setup.root), "--no-restart"],
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    try:
        said = firmware_cli("install", other_bundle_path, "--beside", OTHER, "--trusted-keys", trusted_keys)
        assert f"serves it as model {OTHER} once the daemon reloads" in said
        _settle(running)
        assert running.daemon.models.names() == [first_model, OTHER]
        assert running.daemon.models.get(OTHER).source == store / OTHER  # type: ignore[union-attr]
        assert _unix(setup, "/v1/chat/completions", _chat(OTHER)).json()["model"] == OTHER
        assert f"no longer served: {OTHER}" in firmware_cli("remove", OTHER)
        _settle(running)
        assert running.daemon.models.names() == [first_model]
        assert not (store / OTHER).exists() and not list(setup.root.glob("conf.d/*.toml"))
    finally:
        running.stop()


@pytest.mark.demo
@pytest.mark.gemma
def test_smollm2_and_gemma3_answer_side_by_side_over_http3_and_the_unix_socket(
        demo_bundle_path: Path, trusted_keys: Path, tmp_path: Path) -> None:  # fmt: skip
    """The two real models in one daemon, asked at once over both transports (Gemma 3 270M is a
    base model: the answer's first words are given, as an Anthropic assistant prefill)."""
    from firmware.toolchain.gemma import GEMMA_NAME, gemma_bundle

    smollm2 = firmware.load(demo_bundle_path, trusted_keys).name
    running, setup = _serve(tmp_path, demo_bundle_path, trusted_keys, {GEMMA_NAME: gemma_bundle()})
    question = [{"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "The capital of France is"}]  # fmt: skip

    def ask(model: str, over_h3: bool) -> tuple[str, str]:
        body = {"model": model, "messages": question, "max_tokens": 8, "temperature": 0}
        doc = (_h3(running, setup, "/v1/messages", body) if over_h3 else _unix(setup, "/v1/messages", body)).json()
        return doc["model"], doc["content"][0]["text"]

    try:
        work = [(m, h3) for m in (smollm2, GEMMA_NAME) for h3 in (True, False)]
        with concurrent.futures.ThreadPoolExecutor(len(work)) as pool:
            answers = list(pool.map(lambda args: ask(*args), work))
        assert [model for model, _ in answers] == [m for m, _ in work]
        assert all("Paris" in text for _, text in answers), answers
        assert answers[0][1] == answers[1][1] and answers[2][1] == answers[3][1]  # greedy: same on both transports
    finally:
        running.stop()


def test_bundles_that_do_not_fit_together_are_refused_at_start_before_any_loads(
        tiny_bundle_path: Path, other_bundle_path: Path, trusted_keys: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    import appliance.daemon
    from appliance.config import ConfigError
    from appliance.engine import Engine

    built: list[Engine] = []
    monkeypatch.setattr(appliance.daemon, "Engine", lambda *a, **k: built.append(Engine(*a, **k)) or built[-1])
    monkeypatch.setattr(appliance.daemon, "available_host_memory", lambda: 1 << 20)
    with pytest.raises(ConfigError) as refused:
        _serve(tmp_path, tiny_bundle_path, trusted_keys, {OTHER: other_bundle_path})
    assert any("does not fit on cpu" in p for p in refused.value.problems)
    assert not built  # refused whole: no engine was made for either


def test_a_swap_whose_new_firmware_fails_keeps_the_old_model_serving(
        tiny_bundle_path: Path, other_bundle_path: Path, trusted_keys: Path, tiny_copy: Path, tmp_path: Path,
        first_model: str, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """Dropping the only model for one that does not verify would leave the box serving nothing;
    the old model stays. A swap that loads retires it."""
    (tiny_copy / "tokenizer.json").write_text("{}")  # no longer what the manifest signed
    running, setup = _serve(tmp_path / "etc", tiny_bundle_path, trusted_keys, {})
    try:
        with caplog.at_level(logging.ERROR, logger="appliance.daemon"):
            write_dev_config(setup.root, None, trusted_keys, bundles={OTHER: tiny_copy})
            _settle(running)
        assert running.daemon.models.names() == [first_model]
        assert any(f"keeping {first_model} served" in r.getMessage() for r in caplog.records)
        assert _unix(setup, "/v1/chat/completions", _chat(first_model)).status_code == 200
        write_dev_config(setup.root, None, trusted_keys, bundles={OTHER: other_bundle_path})
        _settle(running)
        assert running.daemon.models.names() == [OTHER]
        assert _unix(setup, "/v1/chat/completions", _chat(first_model)).status_code == 404
    finally:
        running.stop()
