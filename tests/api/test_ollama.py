"""Ollama's API (appliance/api/ollama.py) with Ollama's own Python client: the demo firmware over
HTTPS with a key and over the Unix socket, answering as the OpenAI dialects do for the same
request; the shapes of calls and errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import ollama
import pytest
from clients import MODEL, openai_client, trust
from daemon_thread import RunningDaemon

from appliance.api.errors import ApiError
from appliance.api.ollama import OLLAMA_CHAT, OLLAMA_GENERATE, OllamaStream
from appliance.api.tools import Answer, CallOut
from appliance.devsetup import DevSetup
from appliance.engine import Finished, Trace

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(params=["tcp", "unix"])
def client(request: pytest.FixtureRequest, demo: tuple[RunningDaemon, DevSetup]) -> Iterator[ollama.Client]:
    running, setup = demo
    if request.param == "unix":
        yield ollama.Client(host="http://localhost", transport=httpx.HTTPTransport(uds=str(setup.unix_socket)))
    else:
        yield ollama.Client(host=f"https://localhost:{running.port('tcp')}", verify=trust(setup),
                            headers={"Authorization": f"Bearer {setup.api_key}"})  # fmt: skip


@pytest.mark.demo
def test_ollama_s_client_lists_shows_and_chats_as_openai_s_does(
        client: ollama.Client, demo: tuple[RunningDaemon, DevSetup]) -> None:  # fmt: skip
    assert [m.model for m in client.list().models] == [MODEL]
    shown = client.show(MODEL)
    assert "completion" in (shown.capabilities or []) and "im_start" in (shown.template or "")
    assert [m.model for m in client.ps().models] == [MODEL]
    greedy: dict[str, Any] = {"num_predict": 12, "temperature": 0}
    whole = client.chat(model=MODEL, messages=QUESTION, options=greedy)
    gpt = openai_client(*demo).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12,  # type: ignore[call-overload]
                                                       temperature=0)  # fmt: skip
    assert whole.message.content == gpt.choices[0].message.content and "Paris" in (whole.message.content or "")
    assert whole.done and whole.prompt_eval_count == gpt.usage.prompt_tokens  # type: ignore[union-attr]
    assert whole.eval_count == gpt.usage.completion_tokens  # type: ignore[union-attr]
    assert whole.done_reason == ("length" if gpt.choices[0].finish_reason == "length" else "stop")
    parts = list(client.chat(model=MODEL + ":latest", messages=QUESTION, options=greedy, stream=True))
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True] and parts[-1].eval_count == whole.eval_count
    # No num_predict: as many tokens as the context leaves; the answer ends at its own end of turn.
    unbounded = client.chat(model=MODEL, messages=QUESTION, options={"temperature": 0})
    assert unbounded.done_reason == "stop" and (unbounded.message.content or "").startswith(whole.message.content or "")


@pytest.mark.demo
def test_ollama_s_generate_is_a_chat_turn_or_with_raw_a_plain_completion(
        client: ollama.Client, demo: tuple[RunningDaemon, DevSetup]) -> None:  # fmt: skip
    greedy: dict[str, Any] = {"num_predict": 8, "temperature": 0}
    turn = client.generate(model=MODEL, prompt="What is the capital of France?", options=greedy)
    assert turn.response == client.chat(model=MODEL, messages=QUESTION, options=greedy).message.content
    raw = client.generate(model=MODEL, prompt="The capital of France is", raw=True, options=greedy)
    plain = openai_client(*demo).completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                                    temperature=0)  # fmt: skip
    assert raw.response == plain.choices[0].text
    streamed = "".join(p.response for p in client.generate(model=MODEL, prompt="The capital of France is", raw=True,
                                                            options=greedy, stream=True))  # fmt: skip
    assert streamed == raw.response
    stopped = client.generate(model=MODEL, prompt="The capital of France is", raw=True,
                              options={**greedy, "stop": ["."]})  # fmt: skip
    assert stopped.response == raw.response.split(".")[0] and stopped.done_reason == "stop"


@pytest.mark.demo
def test_ollama_s_format_tools_history_and_seeds(client: ollama.Client) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}  # fmt: skip
    person = client.chat(model=MODEL, messages=[{"role": "user", "content": "Give me a person."}], format=schema,
                         options={"temperature": 0})  # fmt: skip
    jsonschema.validate(json.loads(person.message.content or ""), schema)
    generated = client.generate(model=MODEL, prompt="A person:", format=schema, options={"temperature": 0})
    jsonschema.validate(json.loads(generated.response), schema)
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "tool_name": "get_weather", "content": "sunny, 24 degrees"}]  # fmt: skip
    tool = {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    answer = client.chat(model=MODEL, messages=history, tools=[tool], options={"num_predict": 16, "temperature": 0})
    assert answer.done and (answer.message.content or answer.message.tool_calls)
    sampled: dict[str, Any] = {"num_predict": 10, "temperature": 1.0, "seed": 5}
    once, again = (client.chat(model=MODEL, messages=QUESTION, options=sampled) for _ in range(2))
    assert once.message.content == again.message.content


@pytest.mark.demo
def test_ollama_s_logprobs_are_the_tokens_of_the_answer(client: ollama.Client,
                                                        demo: tuple[RunningDaemon, DevSetup]) -> None:  # fmt: skip
    asked: dict[str, Any] = {"model": MODEL, "messages": QUESTION, "options": {"num_predict": 8, "temperature": 0},
                             "logprobs": True, "top_logprobs": 2}  # fmt: skip
    whole = client.chat(**asked)
    assert whole.logprobs and "".join(t.token for t in whole.logprobs) == whole.message.content
    assert all(len(t.top_logprobs or []) == 2 and t.top_logprobs[0].token == t.token for t in whole.logprobs)  # type: ignore[index]
    gpt = openai_client(*demo).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0,  # type: ignore[call-overload]
                                                       logprobs=True, top_logprobs=2)  # fmt: skip
    assert [t.logprob for t in whole.logprobs] == [t.logprob for t in gpt.choices[0].logprobs.content]
    streamed = [t for part in client.chat(**asked, stream=True) for t in part.logprobs or []]
    assert [t.token for t in streamed] == [t.token for t in whole.logprobs]
    assert client.chat(model=MODEL, messages=QUESTION, options={"num_predict": 2}).logprobs is None


@pytest.mark.demo
def test_ollama_s_errors_are_its_own_shape(client: ollama.Client, demo: tuple[RunningDaemon, DevSetup]) -> None:
    for call, status, says in (
        (lambda: client.chat(model="nope", messages=QUESTION), 404, "does not exist"),
        (lambda: client.chat(model=MODEL, messages=QUESTION, options={"mirostat": 2}), 400, "options.mirostat"),
        (lambda: client.chat(model=MODEL, messages=QUESTION, options={"nonsense": 1}), 400, "unknown option"),
        (lambda: client.chat(model=MODEL, messages=[{"role": "user", "content": "hi", "images": ["aGk="]}]), 400,
         "images"),
        (lambda: client.generate(model=MODEL, prompt="hi", suffix="there"), 400, "suffix"),
        (lambda: client.generate(model=MODEL, prompt="hi", raw=True, system="be brief"), 400, "system"),
    ):  # fmt: skip
        with pytest.raises(ollama.ResponseError) as err:
            call()
        assert err.value.status_code == status and says in err.value.error, err.value.error
    setup = demo[1]
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(setup.unix_socket))) as raw:
        with raw.stream("POST", "http://localhost/api/chat", json={"model": MODEL, "messages": QUESTION,
                                                                   "options": {"num_predict": 2}}) as r:  # fmt: skip
            lines = [json.loads(line) for line in r.iter_lines() if line]
        assert r.headers["content-type"] == "application/x-ndjson" and lines[-1]["done"] is True
        assert raw.get("http://localhost/api/version").json()["version"]
        assert raw.head("http://localhost/").status_code == 200  # the Ollama CLI's heartbeat
        for path, body in (("/api/generate", {"model": MODEL}), ("/api/chat", {"model": MODEL, "messages": []})):
            loaded = raw.post("http://localhost" + path, json=body).json()  # what `ollama run` sends first
            assert loaded["done"] is True and loaded["done_reason"] == "load", loaded
        assert raw.post("http://localhost/api/generate", json={"model": "nope"}).status_code == 404


def _done(reason: str = "end_turn") -> Finished:
    return Finished(reason, None, 7, 3, Trace(request_id="r", device="cpu", input_tokens=7))


def test_calls_are_written_as_ollama_writes_them_whole_and_streamed() -> None:
    call = CallOut("call_1", "get_weather", '{"city": "Paris"}')
    whole = OLLAMA_CHAT.response(MODEL, OLLAMA_CHAT.parse({"model": MODEL, "messages": QUESTION}, [MODEL]),
                                 [(Answer("", [call], None, "hmm"), _done("tool_use"))])  # fmt: skip
    assert whole["message"] == {"role": "assistant", "content": "", "thinking": "hmm", "tool_calls": [
        {"id": "call_1", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert whole["done_reason"] == "stop" and whole["prompt_eval_count"] == 7 and whole["eval_count"] == 3
    stream = OllamaStream(MODEL, chat=True)
    assert stream.call_start(CallOut("call_1", "get_weather")) == b""
    stream.calls[0].arguments = '{"city": "Paris"}'  # (the app fills the arguments in as they arrive)
    lines = [json.loads(line) for line in stream.finish_choice(_done("tool_use")).splitlines()]
    assert lines[0]["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert not lines[0]["done"] and lines[1]["done"] and lines[1]["message"]["content"] == ""
    generated = OLLAMA_GENERATE.response(MODEL, OLLAMA_GENERATE.parse({"model": MODEL, "prompt": "hi"}, [MODEL]),
                                         [(Answer("there"), _done("max_tokens"))])  # fmt: skip
    assert generated["response"] == "there" and generated["done_reason"] == "length"
    assert json.loads(OllamaStream(MODEL, chat=False).error(ApiError(500, "broke"))) == {"error": "broke"}


def test_options_map_to_the_engine_s_sampling() -> None:
    call = OLLAMA_CHAT.parse({"model": MODEL + ":latest", "messages": QUESTION, "think": "high", "options": {
        "temperature": 0.3, "top_k": 5, "top_p": 0.9, "min_p": 0.05, "seed": -1, "repeat_penalty": 1.1,
        "num_predict": 7, "stop": ["\n"], "num_ctx": 4096, "mirostat": 0}}, [MODEL])  # fmt: skip
    r = call.request
    assert call.model == MODEL and call.stream  # Ollama streams unless told not to
    assert (r.temperature, r.top_k, r.top_p, r.min_p, r.seed, r.repetition_penalty) == (0.3, 5, 0.9, 0.05, None, 1.1)
    assert (r.max_tokens, r.fit_context, r.stop_sequences) == (7, False, ("\n",))
    assert (r.thinking, r.reasoning_effort) == (True, "high")
    unbounded = OLLAMA_CHAT.parse({"model": MODEL, "messages": QUESTION, "stream": False, "format": "json"}, [MODEL])
    assert unbounded.request.fit_context and not unbounded.stream
    assert unbounded.request.output.json_schema == {"type": "object"}  # "json": any JSON object
