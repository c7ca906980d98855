"""Serving, end to end: the official anthropic and openai clients over TCP and the Unix socket,
niquests over HTTP/3 (forced, and upgraded through Alt-Svc), a table of malformed requests on
every transport, concurrency, and a client that goes away."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx  # the official clients' own HTTP library (httpx's successor)
import niquests
import openai
import pytest
from battery import check_error
from clients import MODEL, anthropic_client, metric, metrics, openai_client, trust
from daemon_thread import RunningDaemon

from appliance.devsetup import DevSetup, write_dev_config

QUESTION = "What is the capital of France?"


@pytest.mark.demo
@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_anthropic_client_create_and_stream(demo: tuple[RunningDaemon, DevSetup], unix: bool) -> None:
    client = anthropic_client(*demo, unix=unix)
    msg = client.messages.create(model=MODEL, max_tokens=40,
                                 messages=[{"role": "user", "content": QUESTION}])  # fmt: skip
    assert "Paris" in msg.content[0].text
    assert msg.stop_reason == "end_turn" and msg.usage.input_tokens > 10 and msg.usage.output_tokens > 2
    cut = client.messages.create(model=MODEL, max_tokens=3,
                                 messages=[{"role": "user", "content": QUESTION}])  # fmt: skip
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    # With the hints today's clients may send (fields.check_hints): the answer is the same.
    stopped = client.messages.create(model=MODEL, max_tokens=40, stop_sequences=[" is"], cache_control={
        "type": "ephemeral"}, service_tier="auto", speed="standard", inference_geo="us",
        messages=[{"role": "user", "content": QUESTION}])  # fmt: skip
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == " is"
    assert stopped.content[0].text == "The capital of France"
    with client.messages.stream(model=MODEL, max_tokens=40,
                                messages=[{"role": "user", "content": QUESTION}]) as stream:  # fmt: skip
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 2 and "Paris" in "".join(pieces)
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    count = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": QUESTION}])
    assert count.input_tokens == msg.usage.input_tokens
    assert [m.id for m in client.models.list().data] == [MODEL]
    # As Claude Code sends them: a system message among the turns, thoughts kept by context management.
    steered = client.messages.create(model=MODEL, max_tokens=40, messages=[
        {"role": "user", "content": QUESTION}, {"role": "system", "content": "Answer in one sentence."}],
        extra_body={"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}})  # fmt: skip
    assert steered.content[0].text and steered.usage.input_tokens > msg.usage.input_tokens
    # Worded as the Messages API words it: Claude Code reads the numbers and retries with a max_tokens that fits.
    with pytest.raises(anthropic.BadRequestError, match=r"input length and `max_tokens` exceed context limit: "
                                                        r"\d+ \+ 100000 > \d+"):  # fmt: skip
        client.with_options(timeout=60).messages.create(model=MODEL, max_tokens=100000, messages=[
            {"role": "user", "content": QUESTION}])  # a timeout of its own: else the SDK asks for a stream


@pytest.mark.demo
@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_openai_client_create_and_stream(demo: tuple[RunningDaemon, DevSetup], unix: bool) -> None:
    client = openai_client(*demo, unix=unix)
    messages: Any = [{"role": "user", "content": QUESTION}]
    done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40)
    assert "Paris" in (done.choices[0].message.content or "")
    assert done.choices[0].finish_reason == "stop"
    assert done.usage is not None and done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40,
                                                 stream=True, stream_options={"include_usage": True}))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    details = chunks[-1].usage.prompt_tokens_details  # the same prompt again: its blocks were in the prefix pool
    assert details is not None and 0 < (details.cached_tokens or 0) < chunks[-1].usage.prompt_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    cut = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=2, service_tier="auto",
                                         prompt_cache_key="faq", prompt_cache_retention="24h", verbosity="low",
                                         safety_identifier="user-1", modalities=["text"])  # fmt: skip
    assert cut.choices[0].finish_reason == "length" and cut.usage is not None and cut.usage.completion_tokens == 2
    assert [m.id for m in client.models.list()] == [MODEL]
    with pytest.raises(openai.BadRequestError, match="maximum context length is") as info:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=100000)
    assert info.value.code == "context_length_exceeded"  # what LiteLLM and LangChain take for a context-window error


@pytest.mark.demo
def test_openai_logprobs_and_plain_completions(demo: tuple[RunningDaemon, DevSetup]) -> None:
    client = openai_client(*demo)
    messages: Any = [{"role": "user", "content": QUESTION}]
    done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, logprobs=True, top_logprobs=3)
    content = done.choices[0].logprobs.content if done.choices[0].logprobs else None
    assert content and "".join(t.token for t in content) == done.choices[0].message.content
    for t in content:  # greedy: the chosen token is the most likely, and the alternatives come in order
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token and t.logprob <= 0
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, logprobs=True,
                                                 stream=True))  # fmt: skip
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content or []]
    assert [t.token for t in streamed] == [t.token for t in content]

    prompt = "The capital of France is"
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=2)
    choice = plain.choices[0]
    assert "Paris" in choice.text and choice.finish_reason == "length"
    assert choice.logprobs is not None and "".join(choice.logprobs.tokens or []) == choice.text
    assert choice.logprobs.text_offset == [sum(map(len, (choice.logprobs.tokens or [])[:i])) for i in range(8)]
    assert plain.usage is not None and plain.usage.completion_tokens == 8
    echoed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + choice.text
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stream=True,
                                       stream_options={"include_usage": True})  # fmt: skip
    parts = list(stream)
    assert "".join(c.choices[0].text for c in parts if c.choices) == choice.text
    assert parts[-1].usage is not None and parts[-1].usage.completion_tokens == 8


def test_openai_logit_bias_bans_and_favours_tokens(demo: tuple[RunningDaemon, DevSetup],
                                                  demo_bundle_path: Path) -> None:  # fmt: skip
    from tokenizers import Tokenizer

    client = openai_client(*demo)
    tokenizer = Tokenizer.from_file(str(demo_bundle_path / "tokenizer.json"))
    prompt = "The capital of France is"
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0).choices[0].text
    paris = tokenizer.token_to_id("ĠParis")  # (byte-level: " Paris")
    assert paris is not None and plain.startswith(" Paris")
    banned = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0,
                                       logit_bias={str(paris): -100}).choices[0].text  # fmt: skip
    assert "Paris" not in banned
    rome = tokenizer.token_to_id("ĠRome")
    chat = client.chat.completions.create(model=MODEL, max_tokens=2, temperature=0, logit_bias={str(rome): 100},
                                          messages=[{"role": "user", "content": "Name a city."}])  # fmt: skip
    assert chat.choices[0].message.content == " Rome Rome"
    for bad, says in (({"-3": 1}, "'-3' is not a token id"), ({"3": 101}, "from -100 to 100"),
                      ({"999999": 1}, "not in the model's vocabulary")):  # fmt: skip
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, logit_bias=bad)
        assert says in str(err.value) and err.value.body["param"] == "logit_bias", err.value.body  # type: ignore[index]


@pytest.mark.demo
def test_vllm_s_structured_outputs_hold_the_answer(demo: tuple[RunningDaemon, DevSetup]) -> None:
    """guided_choice, guided_regex and guided_json (vLLM's older fields) and structured_outputs
    (its newer object), as its users send them through the SDK's extra_body."""
    import re

    client = openai_client(*demo)
    asked: Any = dict(model=MODEL, temperature=0, max_tokens=24,
                      messages=[{"role": "user", "content": "Is Paris the capital of France? Answer yes or no."}])
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for extra, holds in (
        ({"guided_choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
        ({"structured_outputs": {"choice": ["Positive", "Negative"]}}, lambda t: t in ("Positive", "Negative")),
        ({"guided_regex": r"\d{3}-\d{4}"}, lambda t: re.fullmatch(r"\d{3}-\d{4}", t)),
        ({"structured_outputs": {"regex": "[a-z]{1,6}/[a-z]{1,6}"}}, lambda t: re.fullmatch("[a-z]+/[a-z]+", t)),
        ({"guided_json": json.dumps(schema)}, lambda t: isinstance(json.loads(t)["a"], int)),
        ({"structured_outputs": {"json": schema}}, lambda t: isinstance(json.loads(t)["a"], int)),
    ):  # fmt: skip
        text = client.chat.completions.create(**asked, extra_body=extra).choices[0].message.content or ""
        assert holds(text), (extra, text)
    plain = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0,
                                      extra_body={"guided_choice": [" Rome", " Paris", " Berlin"]})  # fmt: skip
    assert plain.choices[0].text == " Paris"
    refused = [({"guided_regex": "(unclosed"}, "guided_regex"), ({"guided_choice": []}, "guided_choice"),
               ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_regex"),
               ({"structured_outputs": {"grammar": "start: x"}}, "structured_outputs.grammar"),
               ({"guided_json": "{", "response_format": {"type": "json_object"}}, "guided_json")]  # fmt: skip
    for extra, param in refused:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(**asked, extra_body=extra)
        assert err.value.body["param"] == param, (extra, err.value.body)  # type: ignore[index]


@pytest.mark.demo
def test_min_tokens_and_ignore_eos_set_an_answer_s_length(demo: tuple[RunningDaemon, DevSetup]) -> None:
    """vLLM's fields, which benchmark clients send for answers of a set length: the end of sequence
    is not chosen before min_tokens, nor at all with ignore_eos."""
    client = openai_client(*demo)
    asked: Any = dict(model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=40)
    plain = client.chat.completions.create(**asked)
    assert plain.choices[0].finish_reason == "stop" and plain.usage is not None and plain.usage.completion_tokens < 20
    text = plain.choices[0].message.content or ""
    fixed = client.chat.completions.create(**asked, extra_body={"ignore_eos": True})
    assert fixed.choices[0].finish_reason == "length" and fixed.usage is not None
    assert fixed.usage.completion_tokens == 40 and (fixed.choices[0].message.content or "").startswith(text)
    at_least = client.chat.completions.create(**asked, extra_body={"min_tokens": 25})
    assert at_least.usage is not None and at_least.usage.completion_tokens >= 25
    plain_completion = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=30,
                                                 temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
    assert plain_completion.usage is not None and plain_completion.usage.completion_tokens == 30
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**{**asked, "max_tokens": 5}, extra_body={"min_tokens": 6})
    assert err.value.body["param"] == "min_tokens"  # type: ignore[index]


def test_a_completion_s_prompt_may_be_the_model_s_token_ids(demo: tuple[RunningDaemon, DevSetup],
                                                           demo_bundle_path: Path) -> None:  # fmt: skip
    """As evaluation harnesses send what they tokenized (lm-eval's local-completions by default):
    the ids as they are, alone or as a list of one, answer as the same text does."""
    from tokenizers import Tokenizer

    client = openai_client(*demo)
    tokenizer = Tokenizer.from_file(str(demo_bundle_path / "tokenizer.json"))
    prompt = "The capital of France is"
    text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0).choices[0].text
    ids = tokenizer.encode(prompt).ids
    for given in (ids, [ids]):
        done = client.completions.create(model=MODEL, prompt=given, max_tokens=6, temperature=0)
        assert done.choices[0].text == text and done.usage is not None and done.usage.prompt_tokens == len(ids)
    for bad, says in (([1, 10**7], "not in the model's vocabulary"), ([[]], "must not be empty"),
                      ([ids, []], "prompt[1]: must not be empty"), ([ids, [1, 10**7]], "not in the model's vocabulary"),
                      ([ids] * 65, "at most 64 prompts")):  # fmt: skip
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model=MODEL, prompt=bad, max_tokens=1)
        assert says in str(err.value) and err.value.body["param"] == "prompt", err.value.body  # type: ignore[index]
    echoed = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + text  # the ids as the model's tokenizer reads them


@pytest.mark.demo
def test_the_tokenizer_endpoints_serve_vllm_s_and_llama_cpp_s_clients(demo: tuple[RunningDaemon, DevSetup],
                                                                      demo_bundle_path: Path) -> None:  # fmt: skip
    """What lm-eval's remote tokenizer asks of a server before it trusts it (tokenizer_info with an
    eos_token, then a tokenize), and its encode and decode; llama.cpp's spelling of the same: the
    model's own tokenizer over HTTP, behind the API key, so a harness on a box without a model hub
    needs no copy of it."""
    from tokenizers import Tokenizer

    running, setup = demo
    tokenizer = Tokenizer.from_file(str(demo_bundle_path / "tokenizer.json"))
    base = f"https://localhost:{running.port('tcp')}"
    with httpx.Client(verify=trust(setup), headers={"authorization": f"Bearer {setup.api_key}"}) as http:
        info = http.get(base + "/tokenizer_info").json()
        assert info["eos_token"] == "<|im_end|>" and "im_start" in info["chat_template"]
        assert info["model_max_length"] == 8192 and info["vocab_size"] == tokenizer.get_vocab_size()
        text = "The capital of France is Paris."
        ids = tokenizer.encode(text).ids
        vllm = http.post(base + "/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
        assert vllm == {"tokens": ids, "count": len(ids), "max_model_len": 8192}
        llama = http.post(base + "/tokenize", json={"content": text, "model": MODEL}).json()
        assert llama["tokens"] == ids
        eos = http.post(base + "/tokenize", json={"prompt": info["eos_token"], "add_special_tokens": False}).json()
        assert eos["tokens"] == [tokenizer.token_to_id("<|im_end|>")]
        assert http.post(base + "/detokenize", json={"tokens": ids}).json() == {"prompt": text, "content": text}
        refused = http.post(base + "/detokenize", json={"tokens": [ids[0], 10**7]})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "tokens"
        assert httpx.post(base + "/tokenize", json={"prompt": text}, verify=trust(setup)).status_code == 401


@pytest.mark.demo
def test_several_prompts_in_one_completion_request_answer_as_each_alone(demo: tuple[RunningDaemon, DevSetup],
                                                                        demo_bundle_path: Path) -> None:  # fmt: skip
    """A list of prompts (texts or token-id lists, as lm-eval sends a batch): choice p * n + j is
    prompt p's j-th, each as that prompt alone would answer, whole and streamed, echoed as its own;
    usage counts each prompt once."""
    from tokenizers import Tokenizer

    client = openai_client(*demo)
    tokenizer = Tokenizer.from_file(str(demo_bundle_path / "tokenizer.json"))
    prompts: list[Any] = ["The capital of France is", tokenizer.encode("The capital of Italy is").ids,
                          "Water boils at"]  # fmt: skip
    sampled = dict(model=MODEL, max_tokens=6, temperature=1.0, seed=11)
    alone = [client.completions.create(prompt=p, **{**sampled, "seed": 11 + j})  # type: ignore[call-overload]
             for p in prompts for j in range(2)]  # fmt: skip
    whole = client.completions.create(prompt=prompts, n=2, echo=True, **sampled)  # type: ignore[call-overload]
    assert [c.index for c in whole.choices] == list(range(6))
    heads = ["The capital of France is", "The capital of Italy is", "Water boils at"]
    assert [c.text for c in whole.choices] == [heads[i // 2] + a.choices[0].text for i, a in enumerate(alone)]
    assert whole.usage is not None and alone[0].usage is not None
    assert whole.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone[::2])  # type: ignore[union-attr]
    assert whole.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)  # type: ignore[union-attr]
    chunks = list(client.completions.create(prompt=prompts, n=2, echo=True, stream=True,  # type: ignore[call-overload]
                                            stream_options={"include_usage": True}, **sampled))  # fmt: skip
    texts = [""] * 6
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in whole.choices] and chunks[-1].usage == whole.usage
    with pytest.raises(openai.BadRequestError, match="over 64 choices"):
        client.completions.create(model=MODEL, prompt=["a"] * 9, n=8, max_tokens=1)


@pytest.mark.demo
def test_an_evaluation_harness_scores_a_continuation_with_echo_and_logprobs(
        demo: tuple[RunningDaemon, DevSetup], demo_bundle_path: Path) -> None:  # fmt: skip
    """As lm-eval's local-completions asks for a continuation's likelihood (multiple-choice tasks):
    the context and continuation as token ids, echo, logprobs 1, max_tokens 1; it sums
    token_logprobs[len(context):-1] and calls the continuation greedy where each of its tokens is
    its step's best. A text prompt scores the same; a stream carries the scores with the echo;
    max_tokens 0 scores the prompt alone."""
    from tokenizers import Tokenizer

    client = openai_client(*demo)
    tokenizer = Tokenizer.from_file(str(demo_bundle_path / "tokenizer.json"))
    context = tokenizer.encode("The capital of France is").ids

    def score(continuation: str) -> tuple[float, bool, Any]:
        ids = context + tokenizer.encode(continuation).ids
        done = client.completions.create(model=MODEL, prompt=[ids], max_tokens=1, logprobs=1, echo=True,
                                         temperature=0, seed=1234)  # fmt: skip
        lp = done.choices[0].logprobs
        assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset
        assert len(lp.tokens) == len(ids) + 1 and done.usage is not None and done.usage.prompt_tokens == len(ids)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # the first token has none
        assert done.choices[0].text == "".join(lp.tokens)  # the echo, then the one token generated
        assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]
        ours = lp.token_logprobs[len(context) : -1]
        greedy = all(t == max(top.values()) for t, top in zip(ours, lp.top_logprobs[len(context) : -1], strict=True))
        return sum(ours), greedy, lp  # type: ignore[arg-type]

    paris, paris_greedy, lp = score(" Paris")
    rome, rome_greedy, _ = score(" Rome")
    assert paris > rome and paris_greedy and not rome_greedy
    text = "The capital of France is Paris"
    as_text = client.completions.create(model=MODEL, prompt=text, max_tokens=1, logprobs=1, echo=True, temperature=0)
    assert as_text.choices[0].logprobs is not None and as_text.choices[0].logprobs.token_logprobs == lp.token_logprobs

    chunks = list(client.completions.create(model=MODEL, prompt=text, max_tokens=3, logprobs=1, echo=True,
                                            temperature=0, stream=True))  # fmt: skip
    first = chunks[0].choices[0]
    assert first.text == text and first.logprobs is not None and first.logprobs.tokens == lp.tokens[:-1]
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens or []]
    whole = client.completions.create(model=MODEL, prompt=text, max_tokens=3, logprobs=1, echo=True, temperature=0)
    assert whole.choices[0].logprobs is not None and streamed == whole.choices[0].logprobs.tokens
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text

    alone = client.completions.create(model=MODEL, prompt=text, max_tokens=0, logprobs=0, echo=True)
    choice = alone.choices[0]
    assert choice.text == text and choice.finish_reason == "length" and choice.logprobs is not None
    assert choice.logprobs.token_logprobs == lp.token_logprobs[:-1]
    assert alone.usage is not None and alone.usage.completion_tokens == 0


def _reused_tokens(setup: DevSetup) -> float:
    return metric(metrics(setup), "zerolayer_prefix_cache_reused_tokens_total")


@pytest.mark.demo
def test_openai_n_choices_whole_and_streamed_each_reproducible_by_its_seed(demo: tuple[RunningDaemon, DevSetup]
                                                                         ) -> None:  # fmt: skip
    client = openai_client(*demo)
    # Long enough (several 32-token blocks) for the other choices to reuse the first one's prefill.
    messages: Any = [{"role": "system", "content": "You are a storyteller for children. " * 12},
                     {"role": "user", "content": "Tell me a story about a fox."}]  # fmt: skip
    sampled = dict(model=MODEL, messages=messages, max_tokens=12, temperature=1.0, seed=7)
    reused = _reused_tokens(demo[1])
    whole = client.chat.completions.create(n=3, **sampled)  # type: ignore[call-overload]
    assert _reused_tokens(demo[1]) - reused >= 2 * 32  # choices 1 and 2 prefilled only what the pool lacked
    assert [c.index for c in whole.choices] == [0, 1, 2]
    alone = [client.chat.completions.create(**{**sampled, "seed": 7 + i}) for i in range(3)]  # type: ignore[call-overload]
    assert [c.message.content for c in whole.choices] == [a.choices[0].message.content for a in alone]
    assert len({c.message.content for c in whole.choices}) > 1  # sampled with different seeds
    assert whole.usage is not None and alone[0].usage is not None
    assert whole.usage.prompt_tokens == alone[0].usage.prompt_tokens  # one prompt, counted once
    assert whole.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone if a.usage)

    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    roles: list[int] = []
    chunks = list(client.chat.completions.create(n=3, stream=True, stream_options={"include_usage": True},
                                                 **sampled))  # type: ignore[call-overload]  # fmt: skip
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            roles += [c.index] if c.delta.role == "assistant" else []
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert sorted(roles) == [0, 1, 2] and sorted(finishes) == [0, 1, 2]
    assert [texts[i] for i in range(3)] == [c.message.content for c in whole.choices]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert sum(1 for c in chunks if c.usage is not None) == 1

    plain = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, n=2, temperature=0)
    assert [c.index for c in plain.choices] == [0, 1] and plain.choices[0].text == plain.choices[1].text


def _sse_text(body: str) -> str:
    text = ""
    for line in body.splitlines():
        if line.startswith("data: {"):
            doc = json.loads(line[6:])
            if doc.get("type") == "content_block_delta":
                text += doc["delta"]["text"]
            for choice in doc.get("choices", []):
                text += choice["delta"].get("content") or ""
    return text


@pytest.mark.demo
def test_http3_forced_streams_both_apis(demo: tuple[RunningDaemon, DevSetup]) -> None:
    running, setup = demo
    url = f"https://localhost:{running.port('http3')}"
    headers = {"x-api-key": setup.api_key}
    with niquests.Session(disable_http1=True, disable_http2=True) as s:
        r = s.post(f"{url}/v1/messages", headers=headers, verify=str(setup.ca_cert), stream=True, json={
            "model": MODEL, "max_tokens": 40, "stream": True,
            "messages": [{"role": "user", "content": QUESTION}]})  # fmt: skip
        assert r.status_code == 200 and r.http_version == 30
        events = [line for line in r.iter_lines() if line.startswith(b"event: ")]
        body_text = r.text if False else None  # consumed above
        assert body_text is None
        assert events[0] == b"event: message_start" and events[-1] == b"event: message_stop"
        r = s.post(f"{url}/v1/chat/completions", headers=headers, verify=str(setup.ca_cert), json={
            "model": MODEL, "stream": True, "messages": [{"role": "user", "content": QUESTION}]})  # fmt: skip
        assert r.status_code == 200 and r.http_version == 30
        assert "Paris" in _sse_text(r.text) and r.text.rstrip().endswith("data: [DONE]")


def test_tcp_session_upgrades_to_http3_through_alt_svc(tiny: tuple[RunningDaemon, DevSetup]) -> None:
    running, setup = tiny
    # Alt-Svc names the QUIC port; the TCP port differs here (both are picked by the kernel).
    with niquests.Session() as s:
        first = s.get(f"https://localhost:{running.port('tcp')}/healthz", verify=str(setup.ca_cert))
        assert first.http_version in (11, 20)
        assert first.headers["alt-svc"] == f'h3=":{running.port("http3")}"; ma=86400'
        versions = [s.get(f"https://localhost:{running.port('tcp')}/healthz", verify=str(setup.ca_cert)).http_version
                    for _ in range(3)]  # fmt: skip
    assert 30 in versions
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(setup.unix_socket))) as c:
        metrics = c.get("http://localhost/metrics").text
    assert 'zerolayer_quic_handshakes_total{early_data="false",resumed="false"}' in metrics
    assert 'zerolayer_requests_total{api="ops",code="200",transport="http3"}' in metrics


# ---- malformed requests: (method, path, body, headers, status, dialect) ----

GOOD_A = {"model": "tiny-llama", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
GOOD_O = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]}
MSG, CHAT = "/v1/messages", "/v1/chat/completions"


def _with(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = {**doc, **changes}
    return {k: v for k, v in out.items() if v is not ...}


BAD: list[tuple[str, str, str, Any, int]] = [
    # id, method, path, body (bytes or JSON-able), expected status
    ("a-not-json", "POST", MSG, b"{not json", 400),
    ("a-array-body", "POST", MSG, b"[1, 2]", 400),
    ("a-empty-body", "POST", MSG, b"", 400),
    ("a-no-model", "POST", MSG, _with(GOOD_A, model=...), 400),
    ("a-unknown-model", "POST", MSG, _with(GOOD_A, model="gpt-9"), 404),
    ("a-no-max-tokens", "POST", MSG, _with(GOOD_A, max_tokens=...), 400),
    ("a-max-tokens-zero", "POST", MSG, _with(GOOD_A, max_tokens=0), 400),
    ("a-max-tokens-huge", "POST", MSG, _with(GOOD_A, max_tokens=10**9), 400),
    ("a-max-tokens-string", "POST", MSG, _with(GOOD_A, max_tokens="4"), 400),
    ("a-max-tokens-bool", "POST", MSG, _with(GOOD_A, max_tokens=True), 400),
    ("a-no-messages", "POST", MSG, _with(GOOD_A, messages=...), 400),
    ("a-empty-messages", "POST", MSG, _with(GOOD_A, messages=[]), 400),
    ("a-messages-object", "POST", MSG, _with(GOOD_A, messages={"role": "user"}), 400),
    ("a-bad-role", "POST", MSG, _with(GOOD_A, messages=[{"role": "system", "content": "x"}]), 400),
    ("a-starts-assistant", "POST", MSG, _with(GOOD_A, messages=[{"role": "assistant", "content": "a"}]), 400),
    ("a-no-content", "POST", MSG, _with(GOOD_A, messages=[{"role": "user"}]), 400),
    ("a-content-number", "POST", MSG, _with(GOOD_A, messages=[{"role": "user", "content": 5}]), 400),
    ("a-image-block", "POST", MSG, _with(GOOD_A, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]), 400),
    ("a-pdf-document-block", "POST", MSG, _with(GOOD_A, messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}}]}]), 400),
    ("a-tool-result-from-assistant", "POST", MSG, _with(GOOD_A, messages=[{"role": "user", "content": "hi"}, {
        "role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]), 400),
    ("a-tool-not-object", "POST", MSG, _with(GOOD_A, tools=[{"name": "x", "input_schema": {"type": "string"}}]), 400),
    ("a-server-tool", "POST", MSG, _with(GOOD_A, tools=[{"type": "web_search_20250305", "name": "web_search"}]), 400),
    ("a-tool-choice-unknown", "POST", MSG, _with(GOOD_A, tools=[{"name": "x", "input_schema": {}}],
                                                 tool_choice={"type": "tool", "name": "y"}), 400),
    ("a-schema-bad-ref", "POST", MSG, _with(GOOD_A, output_config={"format": {"type": "json_schema", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}), 400),
    ("a-unknown-field", "POST", MSG, _with(GOOD_A, temprature=0.5), 400),
    ("a-temperature-high", "POST", MSG, _with(GOOD_A, temperature=1.5), 400),
    ("a-top-p-string", "POST", MSG, _with(GOOD_A, top_p="high"), 400),
    ("a-top-k-negative", "POST", MSG, _with(GOOD_A, top_k=-3), 400),
    ("a-stop-not-list", "POST", MSG, _with(GOOD_A, stop_sequences="END"), 400),
    ("a-system-number", "POST", MSG, _with(GOOD_A, system=42), 400),
    ("a-stream-string", "POST", MSG, _with(GOOD_A, stream="yes"), 400),
    ("a-wrong-method", "GET", MSG, None, 405),
    ("a-count-no-messages", "POST", "/v1/messages/count_tokens", {"model": "tiny-llama"}, 400),
    ("o-not-json", "POST", CHAT, b"\xff\xfe", 400),
    ("o-no-model", "POST", CHAT, _with(GOOD_O, model=...), 400),
    ("o-unknown-model", "POST", CHAT, _with(GOOD_O, model="llama-70b"), 404),
    ("o-empty-messages", "POST", CHAT, _with(GOOD_O, messages=[]), 400),
    ("o-only-system", "POST", CHAT, _with(GOOD_O, messages=[{"role": "system", "content": "x"}]), 400),
    ("o-bad-role", "POST", CHAT, _with(GOOD_O, messages=[{"role": "wizard", "content": "x"}]), 400),
    ("o-role-a-list", "POST", CHAT, _with(GOOD_O, messages=[{"role": ["user"], "content": "x"}]), 400),
    ("o-tool-no-call-id", "POST", CHAT, _with(GOOD_O, messages=[{"role": "tool", "content": "x"}]), 400),
    ("o-image-part", "POST", CHAT, _with(GOOD_O, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]), 400),
    ("o-n-9", "POST", CHAT, _with(GOOD_O, n=9), 400),
    ("o-max-tokens-zero", "POST", CHAT, _with(GOOD_O, max_tokens=0), 400),
    ("o-max-tokens-huge", "POST", CHAT, _with(GOOD_O, max_completion_tokens=10**7), 400),
    ("o-temperature-high", "POST", CHAT, _with(GOOD_O, temperature=2.5), 400),
    ("o-stop-five", "POST", CHAT, _with(GOOD_O, stop=["a", "b", "c", "d", "e"]), 400),
    ("o-custom-tool", "POST", CHAT, _with(GOOD_O, tools=[{"type": "custom", "custom": {"name": "f"}}]), 400),
    ("o-tool-name-spaces", "POST", CHAT, _with(GOOD_O, tools=[{"type": "function", "function": {"name": "a b"}}]), 400),
    ("o-response-format", "POST", CHAT, _with(GOOD_O, response_format={"type": "xml"}), 400),
    ("o-top-logprobs-alone", "POST", CHAT, _with(GOOD_O, top_logprobs=2), 400),
    ("o-top-logprobs-too-many", "POST", CHAT, _with(GOOD_O, logprobs=True, top_logprobs=21), 400),
    ("c-suffix", "POST", "/v1/completions", {"model": "tiny-llama", "prompt": "a", "suffix": "b"}, 400),
    ("c-token-prompt-past-vocabulary", "POST", "/v1/completions", {"model": "tiny-llama", "prompt": [1, 2**31]}, 400),
    ("c-token-prompts-one-empty", "POST", "/v1/completions", {"model": "tiny-llama", "prompt": [[1, 2], []]}, 400),
    ("c-prompts-mixed-with-a-number", "POST", "/v1/completions", {"model": "tiny-llama", "prompt": ["a", 3]}, 400),
    ("c-token-prompt-logit-bias", "POST", "/v1/completions", {"model": "tiny-llama", "prompt": [1],
                                                              "logit_bias": {"1": "x"}}, 400),
    ("c-max-tokens-0-no-echo", "POST", "/v1/completions", {"model": "tiny-llama", "prompt": "a", "max_tokens": 0,
                                                           "logprobs": 1}, 400),
    ("c-no-prompt", "POST", "/v1/completions", {"model": "tiny-llama"}, 400),
    ("tokenize-no-text", "POST", "/tokenize", {"add_special_tokens": True}, 400),
    ("tokenize-both-texts", "POST", "/tokenize", {"prompt": "a", "content": "a"}, 400),
    ("tokenize-messages", "POST", "/tokenize", {"messages": [{"role": "user", "content": "a"}]}, 400),
    ("tokenize-unknown-model", "POST", "/tokenize", {"model": "nope", "prompt": "a"}, 404),
    ("detokenize-text", "POST", "/detokenize", {"tokens": "abc"}, 400),
    ("detokenize-past-vocabulary", "POST", "/detokenize", {"tokens": [1, 2**31]}, 400),
    ("tokenizer-info-post", "POST", "/tokenizer_info", {}, 405),
    ("ollama-show-unknown", "POST", "/api/show", {"model": "nope"}, 404),
    ("ollama-show-no-model", "POST", "/api/show", {}, 400),
    ("ollama-chat-num-predict-0", "POST", "/api/chat", {"model": "tiny-llama", "options": {"num_predict": 0},
                                                        "messages": [{"role": "user", "content": "a"}]}, 400),
    ("ollama-pull", "POST", "/api/pull", {"model": "tiny-llama"}, 404),
    ("o-required-no-tools", "POST", CHAT, _with(GOOD_O, tool_choice="required"), 400),
    ("o-template-kwargs-not-object", "POST", CHAT, _with(GOOD_O, chat_template_kwargs=["x"]), 400),
    ("o-template-kwargs-reserved", "POST", CHAT, _with(GOOD_O, chat_template_kwargs={"messages": []}), 400),
    ("o-template-kwargs-switch", "POST", CHAT, _with(GOOD_O, chat_template_kwargs={"enable_thinking": "no"}), 400),
    ("o-stream-options-no-stream", "POST", CHAT, _with(GOOD_O, stream_options={"include_usage": True}), 400),
    ("o-seed-float", "POST", CHAT, _with(GOOD_O, seed=1.5), 400),
    ("o-unknown-field", "POST", CHAT, _with(GOOD_O, best_of=3), 400),
    ("o-wrong-method", "PUT", CHAT, GOOD_O, 405),
    ("unknown-path", "POST", "/v1/embeddings", GOOD_O, 404),
    ("models-post", "POST", "/v1/models", {}, 405),
    ("oversized-body", "POST", MSG, _with(GOOD_A, messages=[{"role": "user", "content": "x" * 70_000}]), 413),
    ("a-lone-surrogate", "POST", MSG, _with(GOOD_A, messages=[{"role": "user", "content": "a\ud800b"}]), 400),
    ("o-lone-surrogate", "POST", CHAT, _with(GOOD_O, messages=[{"role": "user", "content": "a\udfffb"}]), 400),
    ("a-surrogate-system", "POST", MSG, _with(GOOD_A, system="\ud800"), 400),
    # A lone surrogate anywhere in the body, not only in the texts a request's own checks read.
    ("o-surrogate-tool-description", "POST", CHAT, _with(GOOD_O, tools=[{"type": "function", "function": {
        "name": "f", "description": "\ud800", "parameters": {"type": "object"}}}]), 400),
    ("a-surrogate-schema-key", "POST", MSG, _with(GOOD_A, tools=[{"name": "f", "input_schema": {
        "type": "object", "properties": {"\udc00": {"type": "string"}}}}]), 400),
    ("a-tool-choice-type-list", "POST", MSG, _with(GOOD_A, tool_choice={"type": [{}]}), 400),
    # A schema that compiles but breaks llguidance's per-token limits once the answer starts.
    ("a-schema-too-costly-to-follow", "POST", MSG, _with(GOOD_A, tools=[{"name": "f", "input_schema": {
        "type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}}],
        tool_choice={"type": "tool", "name": "f"}), 400),
    ("r-previous-response", "POST", "/v1/responses", {"model": "tiny-llama", "input": "hi",
                                                      "previous_response_id": "resp_1"}, 400),
    ("r-input-image", "POST", "/v1/responses", {"model": "tiny-llama", "input": [{"type": "input_image"}]}, 400),
    ("r-unknown-model", "POST", "/v1/responses", {"model": "llama-70b", "input": "hi"}, 404),
    ("o-schema-llguidance-panics-on", "POST", CHAT, _with(GOOD_O, tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "required": "\U0001f642" * 50}}}]), 400),
    ("a-deep-array", "POST", MSG, b"[" * 60_000, 400),  # under the 64 KiB body limit of these tests
    ("a-deep-metadata", "POST", MSG, b'{"metadata": ' + b'{"a": ' * 8_000 + b"1" + b"}" * 8_001, 400),
    ("o-deep-but-valid", "POST", CHAT, json.dumps(_with(GOOD_O, metadata=json.loads("[" * 70 + "]" * 70))).encode(),
     400),
    ("o-user-not-string", "POST", CHAT, _with(GOOD_O, user=5), 400),
    ("o-name-not-string", "POST", CHAT, _with(GOOD_O, messages=[{"role": "user", "content": "hi", "name": 5}]), 400),
    ("oversized-body-openai", "POST", CHAT, _with(GOOD_O, messages=[{"role": "user", "content": "x" * 70_000}]), 413),
]
NO_AUTH = [("a-no-key", MSG, {}, 401), ("a-bad-key", MSG, {"x-api-key": "zl-wrong"}, 401),
           ("o-bad-bearer", CHAT, {"authorization": "Bearer nope"}, 401)]  # fmt: skip


def _encode(body: Any) -> bytes | None:
    return body if isinstance(body, bytes) or body is None else json.dumps(body).encode()


def _send_httpx(client: httpx.Client, base: str, method: str, path: str, body: Any,
                headers: dict[str, str]) -> tuple[int, bytes]:  # fmt: skip
    r = client.request(method, base + path, content=_encode(body),
                       headers={"content-type": "application/json", **headers})  # fmt: skip
    return r.status_code, r.content


@pytest.mark.parametrize("transport", ["tcp", "unix", "http3"])
def test_malformed_requests_get_dialect_errors_on_every_transport(tiny: tuple[RunningDaemon, DevSetup],
                                                                  transport: str) -> None:  # fmt: skip
    running, setup = tiny
    assert len(BAD) >= 40
    auth = {"x-api-key": setup.api_key}
    if transport == "http3":
        session = niquests.Session(disable_http1=True, disable_http2=True)
        base = f"https://localhost:{running.port('http3')}"

        def send(method: str, path: str, body: Any, headers: dict[str, str]) -> tuple[int, bytes]:
            r = session.request(method, base + path, data=_encode(body), verify=str(setup.ca_cert),
                                headers={"content-type": "application/json", **headers})  # fmt: skip
            assert r.http_version == 30
            return int(r.status_code or 0), r.content or b""
    else:
        if transport == "unix":
            client = httpx.Client(transport=httpx.HTTPTransport(uds=str(setup.unix_socket)))
            base = "http://localhost"
        else:
            client = httpx.Client(verify=trust(setup))
            base = f"https://localhost:{running.port('tcp')}"

        def send(method: str, path: str, body: Any, headers: dict[str, str]) -> tuple[int, bytes]:
            return _send_httpx(client, base, method, path, body, headers)

    for case_id, method, path, body, expected in BAD:
        status, data = send(method, path, body, auth)
        try:
            check_error(path, status, data, expected)
        except AssertionError as exc:
            raise AssertionError(f"{transport} {case_id}: {exc}") from None
    if transport != "unix":  # the Unix socket is authorised by its file permissions
        for case_id, path, headers, expected in NO_AUTH:
            status, data = send("POST", path, GOOD_A if path == MSG else GOOD_O, headers)
            assert status == expected, case_id
            check_error(path, status, data, expected)
    status, data = send("POST", MSG, GOOD_A, auth)  # and it serves on
    assert status == 200 and json.loads(data)["type"] == "message"


def test_32_concurrent_streams_over_one_quic_connection_and_32_tcp_connections(
    tiny: tuple[RunningDaemon, DevSetup],
) -> None:
    running, setup = tiny
    body = {"model": "tiny-llama", "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "Tell me about lists."}]}  # fmt: skip
    headers = {"x-api-key": setup.api_key}
    with niquests.Session(disable_http1=True, disable_http2=True, multiplexed=True) as s:
        url = f"https://localhost:{running.port('http3')}/v1/messages"
        lazy = [s.post(url, json=body, headers=headers, verify=str(setup.ca_cert)) for _ in range(32)]
        s.gather()
        quic_texts = {_sse_text(r.text) for r in lazy if r.status_code == 200 and r.http_version == 30}
        assert sum(1 for r in lazy if r.status_code == 200) == 32

    def one(_: int) -> str:
        with httpx.Client(verify=trust(setup)) as c:
            r = c.post(f"https://localhost:{running.port('tcp')}/v1/messages", json=body, headers=headers, timeout=60)
            assert r.status_code == 200 and r.text.rstrip().endswith('{"type": "message_stop"}')
            return _sse_text(r.text)

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        tcp_texts = set(pool.map(one, range(32)))
    assert len(quic_texts) == 1 and quic_texts == tcp_texts  # greedy: every stream the same answer


def test_client_that_goes_away_cancels_its_generation(tiny: tuple[RunningDaemon, DevSetup]) -> None:
    running, setup = tiny
    engine = running.daemon.engine
    assert engine is not None
    body = {"model": "tiny-llama", "max_tokens": 1800, "stream": True,
            "messages": [{"role": "user", "content": "Go on forever."}]}  # fmt: skip
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(setup.unix_socket))) as c, \
            c.stream("POST", "http://localhost/v1/messages", json=body) as r:  # fmt: skip
        for i, _ in enumerate(r.iter_bytes()):
            if i == 3:
                break
    deadline = time.monotonic() + 10
    while engine.workers["cpu"].depth and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.workers["cpu"].depth == 0


def test_early_refusals_and_rude_clients_leave_no_error_in_the_log(
        tiny: tuple[RunningDaemon, DevSetup], caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """A 401, 405 or 413 answered before the body is read, to a client that keeps sending or hangs
    up, is not the server's error: no ERROR line, no traceback (any client could fill the log)."""
    running, setup = tiny
    port, big = running.port("tcp"), b"x" * 200_000
    key = b"x-api-key: " + setup.api_key.encode() + b"\r\n"
    cases = [  # the request head, and whether the client closes without a TLS shutdown
        (b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: 200000\r\n\r\n", False),  # 401
        (b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n" + key + b"content-length: 200000\r\n\r\n", False),  # 413
        (b"PUT /v1/messages HTTP/1.1\r\nhost: x\r\n" + key + b"content-length: 100000\r\n\r\n", False),  # 405
        (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 200000\r\n\r\n", True),  # 401
    ]
    with caplog.at_level(logging.WARNING):
        for head, rude in cases:
            raw = socket.create_connection(("127.0.0.1", port))
            tls = trust(setup).wrap_socket(raw, server_hostname="localhost")
            tls.sendall(head + big[:1000])
            tls.settimeout(5)
            assert tls.recv(100).startswith(b"HTTP/1.1 4")
            with contextlib.suppress(OSError):
                tls.sendall(big[1000:])  # the rest of the body, after the answer
                if not rude:
                    tls.unwrap()
            tls.close()
        with niquests.Session(disable_http1=True, disable_http2=True) as session:  # the same on HTTP/3
            r = session.post(f"https://localhost:{running.port('http3')}/v1/messages", data=big, verify=str(
                setup.ca_cert), headers={"content-type": "application/json"})  # fmt: skip
            assert r.status_code in (401, 413)
        time.sleep(1.5)  # closing handshakes time out in the background
    noise = [f"{r.levelname} {r.name}: {r.getMessage()[:120]}" for r in caplog.records
             if r.levelno >= logging.ERROR or r.exc_info]  # fmt: skip
    assert not noise, noise


def test_mtls_requires_a_client_certificate_on_tcp_and_quic(tiny_bundle_path: Path, trusted_keys: Path,
                                                             tmp_path: Path) -> None:  # fmt: skip
    from appliance.tls import DevCert, make_client_cert

    root = tmp_path / "etc"
    setup = write_dev_config(root, tiny_bundle_path, trusted_keys)  # makes the CA
    tls = root / "tls"
    ca = DevCert(tls / "ca.crt", tls / "ca.key", tls / "server.crt", tls / "server.key")
    client = make_client_cert(ca, tmp_path / "client", "ops-laptop")
    text = (root / "zerolayer.toml").read_text().replace("[tls]\n", f'[tls]\nclient_ca = "{ca.ca_cert}"\n')
    (root / "zerolayer.toml").write_text(text)
    running = RunningDaemon(root).start()
    try:
        url = f"https://localhost:{running.port('tcp')}/healthz"
        with pytest.raises(httpx.TransportError), httpx.Client(verify=trust(setup)) as c:
            c.get(url)
        ctx = trust(setup)
        ctx.load_cert_chain(str(client.cert), str(client.key))
        with httpx.Client(verify=ctx) as c:
            assert c.get(url).status_code == 200
        h3 = f"https://localhost:{running.port('http3')}/healthz"
        with niquests.Session(disable_http1=True, disable_http2=True) as s:
            r = s.get(h3, verify=str(setup.ca_cert), cert=(str(client.cert), str(client.key)))
            assert r.status_code == 200 and r.http_version == 30
        with niquests.Session(disable_http1=True, disable_http2=True, retries=0) as s, \
                pytest.raises(niquests.exceptions.RequestException):  # fmt: skip
            s.get(h3, verify=str(setup.ca_cert), timeout=5)
    finally:
        running.stop()


@pytest.mark.demo
def test_second_turn_on_one_quic_connection_finds_the_flow_digests_and_starts_sooner(
    demo: tuple[RunningDaemon, DevSetup],
) -> None:
    running, setup = demo
    url = f"https://localhost:{running.port('http3')}/v1/messages"
    headers = {"x-api-key": setup.api_key, "zerolayer-debug": "1"}  # the dev key may see traces
    story = "The appliance decides locally where each request runs and what it reuses. " * 60

    def turn(s: niquests.Session, messages: list[dict[str, str]]) -> tuple[float, list[str], str]:
        started = time.monotonic()
        r = s.post(url, headers=headers, verify=str(setup.ca_cert), stream=True,
                   json={"model": MODEL, "max_tokens": 8, "stream": True, "messages": messages})  # fmt: skip
        assert r.status_code == 200 and r.http_version == 30
        first, trace, text = 0.0, [], ""
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "zerolayer_debug":
                trace += event["lines"]
            elif event["type"] == "content_block_delta":
                first = first or time.monotonic() - started
                text += event["delta"]["text"]
        return first, trace, text

    with niquests.Session(disable_http1=True, disable_http2=True) as s:  # one QUIC connection, reused
        history = [{"role": "user", "content": story + "What does it decide?"}]
        ttft1, trace1, answer = turn(s, history)
        history += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Say it shorter."}]
        ttft2, trace2, _ = turn(s, history)
    cache_line = next(line for line in trace2 if line.startswith("[DEBUG] Cache lookup"))
    found = int(cache_line.split("found ")[1].split("/")[0])
    assert "found 0/0 digests" in next(line for line in trace1 if line.startswith("[DEBUG] Cache lookup"))
    assert cache_line.startswith(f"[DEBUG] Cache lookup: found {found}/10 digests") and found > 0
    assert any(line.startswith("[DEBUG] Flow: udp 127.0.0.1:") for line in trace2)
    assert ttft2 < ttft1, (ttft1, ttft2)
