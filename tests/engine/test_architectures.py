"""Every architecture the firmware build supports, checked as the Llama fixture is
(tests/engine/test_engine.py): a tiny random-weight model made locally from a transformers config,
built to fp32 firmware; our prefill logits against transformers within 1e-4, greedy tokens identical
for 32 steps, sharded prefill and a prefix reused from the pool identical to one pass, rows of
different lengths decoded together identical to each alone, and a long prompt prefilled on the
prefill lane beside a decoding stream identical to each alone. Mistral's sliding window and Gemma
3's sliding layers are 16 positions wide and the conversation is several times longer, so every
check runs past the window; Qwen3 has per-head norms, Phi-3 partial rotary, and gpt-oss experts,
attention sinks and a clamped SwiGLU. The RoPE scaling kinds the build serves (build.ROPE_TYPES)
each have a fixture: Llama 3.1's, linear (a Llama's, and Gemma 3's on its global layers only), YaRN
with transformers' default blend, HunYuan's fixed-alpha NTK, dynamic NTK (InternLM3's) and Phi-3's
LongRoPE. Each family's chat template renders the same token ids as transformers'
apply_chat_template, system prompt and (for Qwen2.5's) tools included."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import numpy as np
import pytest

import firmware
from appliance.engine import Engine, EngineConfig, GenerationRequest, Message, ModelSession, TextDelta
from appliance.engine.chat import ChatTemplate, Prompt
from appliance.engine.request import ThoughtDelta, TokenLogprob
from appliance.engine.session import MASK_WIDTH_STEP
from appliance.engine.tokenizer import TextTokenizer
from appliance.engine.tools import OutputRules, PastCall, Tool
from firmware.toolchain.build import UNEXPORTED_OPTIONS
from firmware.toolchain.gpt_families import GPT_FAMILIES
from firmware.toolchain.tiny import ARCHITECTURES, reference_class, reference_dir, tiny_bundle, tiny_hf_dir

OTHERS = sorted(set(ARCHITECTURES) - {"llama"})  # the Llama fixture has its own module
CONVERSATION = (
    Message("user", "Explain the for statement and how the else clause of a loop works."),
    Message("assistant", "The for statement iterates over the items of any sequence, in order."),
    Message("user", "And what does break do inside a while loop with an else clause?"),
)
SHORT = (Message("user", "What does the with statement do?"),)
WEATHER = Tool("get_weather", "The weather in a city now.",
               {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


@pytest.fixture(scope="module", params=OTHERS)
def arch(request: pytest.FixtureRequest, trusted_keys: Path) -> Iterator[tuple[str, firmware.Bundle, object]]:
    import torch
    import transformers

    name = str(request.param)
    bundle = firmware.load(tiny_bundle(name), trusted_keys)
    hf = getattr(transformers, reference_class(name)).from_pretrained(reference_dir(name), dtype=torch.float32).eval()
    yield name, bundle, hf


def _ids(bundle: firmware.Bundle, messages: tuple[Message, ...] = CONVERSATION) -> list[int]:
    tok = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    return ChatTemplate(bundle.chat_template, tok).prompt(messages).ids


def _hf_logits(model: object, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()  # type: ignore[operator,no-any-return]


def _window(name: str) -> int | None:
    config = json.loads((tiny_hf_dir(name) / "config.json").read_text())
    return config.get("sliding_window")  # type: ignore[no-any-return]


def test_the_windowed_architectures_are_checked_past_their_window() -> None:
    assert _window("mistral") == _window("gemma3") == 16
    gemma = json.loads((tiny_hf_dir("gemma3") / "config.json").read_text())
    assert set(gemma["layer_types"]) == {"sliding_attention", "full_attention"}  # interleaved
    assert len(_ids_for("mistral")) > 4 * 16 and len(_ids_for("gemma3")) > 4 * 16


def _ids_for(name: str) -> list[int]:
    return _folder_template(name).prompt(CONVERSATION).ids


def _folder_template(name: str) -> ChatTemplate:
    """The chat template and tokenizer of the tiny model's Hugging Face folder, as the build packs them."""
    from firmware.toolchain.build import read_chat_template

    folder = tiny_hf_dir(name)
    tok = TextTokenizer(folder / "tokenizer.json", folder / "tokenizer_config.json")
    return ChatTemplate(read_chat_template(folder), tok)


def test_prefill_logits_and_32_greedy_steps_match_transformers(arch: tuple[str, firmware.Bundle, object]) -> None:
    name, bundle, hf = arch
    ids = _ids(bundle)
    ref = _hf_logits(hf, ids)
    session = ModelSession(bundle)
    cache = session.new_cache(len(ids) + 32)
    logits = session.forward(cache, np.array(ids, dtype=np.int64))
    assert np.abs(logits - ref[-1]).max() <= 1e-4, name
    ref_ids, ours = list(ids), []
    for _ in range(32):
        ref_ids.append(int(_hf_logits(hf, ref_ids)[-1].argmax()))
        ours.append(int(logits.argmax()))
        logits = session.forward(cache, np.array([ours[-1]], dtype=np.int64))
    assert ours == ref_ids[len(ids) :], name


def test_sharded_and_prefix_reused_generation_equal_one_pass(arch: tuple[str, firmware.Bundle, object]) -> None:
    name, bundle, _ = arch
    ids = np.array(_ids(bundle), dtype=np.int64)
    session = ModelSession(bundle)
    one = session.forward(session.new_cache(len(ids)), ids)
    cache = session.new_cache(len(ids))
    for start in range(0, len(ids), 7):  # shards of 7: several cross the window's edge
        logits = session.forward(cache, ids[start : start + 7])
    assert np.abs(logits - one).max() <= 1e-4, name

    request = GenerationRequest(CONVERSATION, max_tokens=16, temperature=0.0)
    cold = Engine(bundle, EngineConfig(prefix_cache_bytes=0))
    warm = Engine(bundle, EngineConfig(prefix_cache_bytes=16 << 20, prefix_block_tokens=8))

    async def text(engine: Engine) -> tuple[str, int]:
        stream = engine.submit(request)
        out = "".join([e.text async for e in stream if isinstance(e, TextDelta)])
        assert stream.finished is not None
        return out, stream.finished.trace.reused_tokens

    try:
        expected, _ = asyncio.run(text(cold))
        first, _ = asyncio.run(text(warm))
        again, reused = asyncio.run(text(warm))
    finally:
        cold.close()
        warm.close()
    # (A hybrid model's pool keeps whole rows with their states: the same prompt again reuses the
    # one kept where its messages end; its next turn, below.)
    assert reused > 0, name
    assert first == again == expected, name


@pytest.mark.parametrize("name", ["lfm2", "lfm3", "qwen3_5"])
def test_a_hybrid_model_s_next_turn_reuses_the_last_one_whole_with_its_states(name: str, trusted_keys: Path) -> None:
    """The pool keeps a hybrid model's row where its messages end and as its answer left it, each
    with the recurrent states there: the conversation's next turn begins with one of them (the
    messages, where the template writes the answer otherwise than the model did: Qwen3.5's drops
    the empty thought), and answers as a cold engine does, down to each token's log probability."""
    bundle = firmware.load(tiny_bundle(name), trusted_keys)
    cold = Engine(bundle, EngineConfig(prefix_cache_bytes=0))
    warm = Engine(bundle, EngineConfig(prefix_block_tokens=8))

    async def turn(engine: Engine, request: GenerationRequest) -> tuple[str, list[tuple[str, float]], int]:
        out, tokens = "", []
        stream = engine.submit(request)
        async for event in stream:
            if isinstance(event, TextDelta):
                out += event.text
            elif isinstance(event, TokenLogprob):
                tokens.append((event.token, event.logprob))
        assert stream.finished is not None
        return out, tokens, stream.finished.trace.reused_tokens

    try:
        first = GenerationRequest(CONVERSATION, max_tokens=12, temperature=0.0, logprobs=0)
        answer, _, reused = asyncio.run(turn(warm, first))
        assert reused == 0
        then = (*CONVERSATION, Message("assistant", answer), Message("user", "And what does continue do?"))
        second = dataclasses.replace(first, messages=then)
        _, warm_tokens, reused = asyncio.run(turn(warm, second))
        _, cold_tokens, _ = asyncio.run(turn(cold, second))
    finally:
        cold.close()
        warm.close()
    history = warm.prepare(first).history_end  # the first turn's messages at least
    assert history is not None and reused >= history > 0, name
    _same_answers([warm_tokens], [cold_tokens], name)


def _hybrid(bundle: firmware.Bundle) -> bool:
    """The model has recurrent layers (a state per sequence, no keys and values there)."""
    return bool(bundle.model.state_names)


def test_rows_of_different_lengths_decode_together_as_each_alone(arch: tuple[str, firmware.Bundle, object]) -> None:
    """One decode run over two rows, one far past the window and one inside it: each row's mask
    gives the operator its own length, and so its own window."""
    name, bundle, _ = arch
    prompts = [np.array(_ids(bundle, m), dtype=np.int64) for m in (CONVERSATION, SHORT)]
    session = ModelSession(bundle)
    alone = []
    for ids in prompts:
        cache = session.new_cache(len(ids) + 12)
        logits, tokens = session.forward(cache, ids), []
        for _ in range(12):
            tokens.append(int(logits.argmax()))
            logits = session.forward(cache, np.array(tokens[-1:], dtype=np.int64))
        alone.append(tokens)
    slots = session.new_slots(2, max(len(p) for p in prompts) + 12)
    lengths = np.array([len(p) for p in prompts], dtype=np.int64)
    last = np.array([int(session.forward(slots.row(i), p).argmax()) for i, p in enumerate(prompts)], dtype=np.int64)
    together: list[list[int]] = [[], []]
    for _ in range(12):
        for i in range(2):
            together[i].append(int(last[i]))
        logits = session.decode(slots, last, lengths)
        lengths += 1
        last = logits.argmax(axis=1).astype(np.int64)
    assert together == alone, name


def test_the_decode_mask_widens_in_steps_unless_its_width_picks_the_rotary_factors(
        arch: tuple[str, firmware.Bundle, object]) -> None:  # fmt: skip
    """A decode's mask may be wider than its longest row (bound once every MASK_WIDTH_STEP
    positions) only where its width is nothing but the attention's total length: a LongRoPE
    graph compares the width with the original context to pick its rotary factors; BLOOM's and
    MPT's make their ALiBi bias from it (a range of key positions, which the check does not follow)."""
    name, bundle, _ = arch
    step = ModelSession(bundle).mask_width_step
    assert step == (1 if name in ("phi3_longrope", "bloom", "mpt") else MASK_WIDTH_STEP), name


async def _answer(engine: Engine, request: GenerationRequest, started: asyncio.Event | None = None,
                  prompt: Prompt | None = None) -> list[tuple[str, float]]:  # fmt: skip
    """A request's tokens and their log probabilities (a thought's text, where its template opens
    one the tiny model never ends: Apriel's, which has none); `started` is set at its second token."""
    tokens = []
    async for event in engine.submit(request, prompt=prompt):
        if isinstance(event, TokenLogprob | ThoughtDelta):
            tokens.append((event.token, event.logprob) if isinstance(event, TokenLogprob) else (event.text, 0.0))
            if started is not None and len(tokens) == 2:
                started.set()
    return tokens


async def _begun(started: asyncio.Event, decoding: asyncio.Task[Any]) -> None:
    """Until the stream `decoding` has its second token (`started`); one that ends before it fails
    the test, which would otherwise wait for it forever."""
    waiting = asyncio.ensure_future(started.wait())
    await asyncio.wait({waiting, decoding}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    assert started.is_set(), "the stream ended before its second token"


def _same_answers(together: list[list[tuple[str, float]]], alone: list[list[tuple[str, float]]], name: str) -> None:
    """The same tokens, down to each token's log probability (a random tiny model keeps its greedy
    tokens through a stale key or state; their probabilities show it)."""
    for got, want in zip(together, alone, strict=True):
        assert [t for t, _ in got] == [t for t, _ in want], name
        assert np.allclose([p for _, p in got], [p for _, p in want], rtol=0, atol=1e-5), name


def _held_until(done: Any, decode: Any, pause_s: float = 0.01) -> Any:
    """`decode`, each call `pause_s` later until `done()`: a stream whose answer would end in a few
    milliseconds is still decoding when a newcomer arrives (the answers do not change)."""

    def held(*args: Any) -> Any:
        if not done():
            time.sleep(pause_s)
        return decode(*args)

    return held


def _alone_then_beside(engine: Engine, requests: tuple[GenerationRequest, ...], patch: Any,
                       beside: Any) -> tuple[list[list[tuple[str, float]]], list[list[tuple[str, float]]]]:  # fmt: skip
    """Each request's answer alone, then `patch()` and the answers `beside()` gives; the engine is
    closed after."""
    try:
        alone = [asyncio.run(_answer(engine, r)) for r in requests]
        patch()
        together = asyncio.run(beside())
    finally:
        engine.close()
    return alone, together


def test_a_long_prompt_on_the_prefill_lane_beside_a_decoding_stream_answers_as_alone(
    arch: tuple[str, firmware.Bundle, object],
) -> None:
    """The lane computes in a staging row and copies it into the slot row (appliance/engine/lane.py):
    past a sliding window, with per-head norms or partial rotary, the newcomer's answer and the
    stream's are what each gives alone, down to each token's log probability (a random tiny model
    keeps its greedy tokens through a stale key; their probabilities show it)."""
    name, bundle, _ = arch
    engine = Engine(bundle, EngineConfig(prefix_cache_bytes=0, intra_op_threads=2))
    worker = engine.workers["cpu"]
    if _hybrid(bundle):  # no lane (the chunks run between the steps instead: test_a_hybrid_model_s_...)
        engine.close()
        assert worker.lane is None, name
        return
    assert worker.lane is not None
    stream = GenerationRequest(SHORT, max_tokens=200, temperature=0.0, logprobs=0)
    long = GenerationRequest((Message("user", "Explain every loop statement. " * 40),), max_tokens=8,
                             temperature=0.0, logprobs=0)  # fmt: skip
    ranges: list[tuple[int, int]] = []
    real_run = worker.lane.run

    def run(owner, cache, ids, start, end, *rest):  # type: ignore[no-untyped-def]
        ranges.append((start, end))
        return real_run(owner, cache, ids, start, end, *rest)

    # Rendered beforehand, so the newcomer reaches the scheduler as soon as the stream has its second
    # token, while even a tiny model's short answer (9 tokens, some) is still decoding; and each of
    # the stream's steps waits a little until the lane has begun (13 tokens took InternLM3's 3 ms).
    long_prompt = engine.prepare(long)

    def patch() -> None:
        worker.lane.run = run
        for session in {id(s): s for s in (worker.session, worker.decode_half) if s is not None}.values():
            session.decode = _held_until(lambda: bool(ranges), session.decode)

    async def beside() -> list[list[tuple[str, float]]]:
        started = asyncio.Event()
        decoding = asyncio.create_task(_answer(engine, stream, started))
        await _begun(started, decoding)
        newcomer = await _answer(engine, long, prompt=long_prompt)
        return [await decoding, newcomer]

    alone, together = _alone_then_beside(engine, (stream, long), patch, beside)
    # The newcomer's prompt went to the lane (the stream's ran alone); whether the lane or, once the
    # stream ended, the steps finished it depends on the machine's speed.
    assert ranges and ranges[0][0] == 0, name
    _same_answers(together, alone, name)


def test_a_hybrid_model_s_prompt_chunked_beside_a_decoding_stream_answers_as_alone(trusted_keys: Path) -> None:
    """Qwen3.5's recurrent layers advance their state in every run over a row. A newcomer takes the
    slot a finished request left below a decoding stream's, so each of the stream's steps pads
    along the newcomer's row while its prompt runs in chunks between them: the row must keep the
    state its own chunks made. Both answers are what each gives alone, to each token's log
    probability."""
    from appliance.plan import memory_need

    bundle = firmware.load(tiny_bundle("qwen3_5"), trusted_keys)
    config = EngineConfig(intra_op_threads=2, max_active_per_device=2)
    # The daemon's memory plan counts what the engine holds: the weights once (no lane), the pool.
    planned, without = memory_need(bundle, config), memory_need(bundle, dataclasses.replace(config, prefill_lane=False))
    assert planned.prefix == config.prefix_cache_bytes > 0 and planned.weights == without.weights
    engine = Engine(bundle, dataclasses.replace(config, prefix_cache_bytes=0))  # every prompt runs in chunks
    worker = engine.workers["cpu"]
    assert worker.lane is None
    # ...and its slots: keys and values of the attention layers only, and each slot's states.
    session, slots = worker.session, worker.kv
    assert session.kv_layers == 1 < bundle.model.num_layers and session.states
    held = slots.rows * (slots.row_bytes + sum(spec.row_bytes for spec in session.states))
    assert planned.kv == held
    budget = worker.scheduler.budget
    budget.short_step, budget.max_tokens = 0.0, 4  # the prompt in chunks of at most 4, never whole
    first = GenerationRequest((Message("user", "Describe the import system in detail."),), max_tokens=3,
                              temperature=0.0)  # fmt: skip
    stream = GenerationRequest(SHORT, max_tokens=120, temperature=0.0, logprobs=0)
    long = GenerationRequest((Message("user", "Explain every loop statement. " * 12),), max_tokens=8,
                             temperature=0.0, logprobs=0)  # fmt: skip
    padded: list[list[int]] = []
    real_decode = worker.session.decode

    def decode(slots, tokens, lengths, keep=()):  # type: ignore[no-untyped-def]
        padded.append(list(keep))
        return real_decode(slots, tokens, lengths, keep)

    async def beside() -> list[list[tuple[str, float]]]:
        done = asyncio.create_task(_answer(engine, first))  # slot 0, soon free again
        started = asyncio.Event()
        decoding = asyncio.create_task(_answer(engine, stream, started))  # slot 1
        await done
        await _begun(started, decoding)
        newcomer = await _answer(engine, long)  # slot 0: below the stream's
        return [await decoding, newcomer]

    alone, together = _alone_then_beside(engine, (stream, long), lambda: setattr(worker.session, "decode", decode),
                                         beside)  # fmt: skip
    assert sum(keep == [0] for keep in padded) >= 5  # the newcomer's row padded along, chunk after chunk
    _same_answers(together, alone, "qwen3_5")


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
@pytest.mark.parametrize("system", [None, "You answer in one short sentence."])
def test_chat_template_renders_the_token_ids_transformers_renders(name: str, system: str | None) -> None:
    """The family's template (a system prompt folded into the first user turn where the family
    has no system role: Mistral, Gemma) through our Jinja environment and tokenizer, against
    transformers' apply_chat_template on the Hugging Face folder (or, for a layout transformers does
    not read, on the one it was written from)."""
    from transformers import AutoTokenizer

    prompt = _folder_template(name).prompt(CONVERSATION, system=system)
    docs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": m.role, "content": m.content} for m in CONVERSATION
    ]
    assert prompt.ids == hf_chat_ids(AutoTokenizer.from_pretrained(reference_dir(name)), docs)
    if system and name in ("mistral", "gemma3"):  # no system role: folded into the first user turn
        assert "system" not in prompt.text and system in prompt.text


def test_a_template_that_takes_tools_gets_them_as_transformers_passes_them() -> None:
    """Qwen2.5's template lists the tools in its system turn (after the system prompt, or its
    default one); ours renders it from the request's tools as apply_chat_template(tools=...) does."""
    from transformers import AutoTokenizer

    template = _folder_template("qwen2")
    assert template.takes_tools
    hf = AutoTokenizer.from_pretrained(tiny_hf_dir("qwen2"))
    for system in (None, "You answer in one short sentence."):
        prompt = template.prompt(CONVERSATION, system=system, output=OutputRules(tools=(WEATHER,)))
        docs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": m.role, "content": m.content} for m in CONVERSATION
        ]
        assert prompt.ids == hf_chat_ids(hf, docs, tools=[WEATHER.as_function()])
        assert '"name": "get_weather"' in prompt.text and "<tools>" in prompt.text


# Hermes' calls; Mistral Small's [TOOL_CALLS]name[ARGS]; gpt-oss's messages to a function and back;
# Qwen3.5's parameters; LFM2's Python calls, which its template takes as the assistant's text
@pytest.mark.parametrize("name", ["qwen2", "mistral3_vl", "gpt_oss", "qwen3_5", "lfm2"])
def test_earlier_calls_and_results_reach_a_model_as_its_template_writes_calls_and_tool_messages(name: str) -> None:
    from transformers import AutoTokenizer

    thought = "Two cities: two calls."  # gpt-oss's template shows it before the call (the others, not)
    turns = (Message("user", "Weather in Paris and Rome?"),
             Message("assistant", "", (PastCall("get_weather", '{"city": "Paris"}'),
                                       PastCall("get_weather", '{"city": "Rome"}')), thought=thought),
             Message("user", "", results=(("18 C", False), ("down", True))))  # fmt: skip
    template = _folder_template(name)
    prompt = template.prompt(turns, output=OutputRules(tools=(WEATHER,)))
    calls = [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
             for city in ("Paris", "Rome")]  # fmt: skip
    docs = [{"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": "", "thinking": thought, "tool_calls": calls},
            {"role": "tool", "content": "18 C"}, {"role": "tool", "content": "Error: down"}]  # fmt: skip
    if name == "lfm2":
        docs[1] = {"role": "assistant", "content": '<|tool_call_start|>[get_weather(city="Paris"), '
                                                  'get_weather(city="Rome")]<|tool_call_end|>'}  # fmt: skip
    hf = AutoTokenizer.from_pretrained(tiny_hf_dir(name))
    assert prompt.ids == hf_chat_ids(hf, docs, tools=[WEATHER.as_function()])
    assert (f"<|channel|>analysis<|message|>{thought}<|end|>" in prompt.text) == (name == "gpt_oss")
    if name == "gpt_oss":  # its template refuses a thought beside text and a call: the thought is left out
        said = template.prompt((turns[0], dataclasses.replace(turns[1], content="Checking."), turns[2]))
        assert thought not in said.text and "<|channel|>analysis<|message|>Checking.<|end|>" in said.text


# Phi-4-mini-instruct's way (abridged): the tools ride on the system message, not the `tools` variable.
TOOLS_ON_THE_SYSTEM_MESSAGE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
    "message['tools'] is not none %}{{ '<|system|>' + message['content'] + '<|tool|>' + message['tools'] + "
    "'<|/tool|><|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def test_a_template_takes_tools_where_it_shows_them_not_where_it_names_them() -> None:
    names = ("qwen2", "llama_rope_llama3", "mistral", "llama")
    shown = {name: (_folder_template(name).takes_tools, _folder_template(name).takes_tool_role) for name in names}
    assert shown == {"qwen2": (True, True), "llama_rope_llama3": (True, True), "mistral": (True, True),
                     "llama": (False, False)}  # fmt: skip
    tok = _folder_template("llama").tokenizer
    assert not ChatTemplate(TOOLS_ON_THE_SYSTEM_MESSAGE, tok).takes_tools  # its model would never see them
    assert not ChatTemplate("{# no tools here #}{{ messages[0]['content'] }}{{ tools | length / 0 }}", tok).takes_tools


# Llama 3.1's way with earlier calls (abridged): one a turn, or the template refuses the conversation.
ONE_CALL_A_TURN = (
    "{%- if tools %}{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "
    "name and its value}.' }}{%- for t in tools %}{{- t | tojson }}{%- endfor %}{%- endif %}"
    "{%- for message in messages %}{%- if message.tool_calls %}"
    "{%- if not message.tool_calls | length == 1 %}"
    "{{- raise_exception('This model only supports single tool-calls at once!') }}{%- endif %}"
    "{%- set call = message.tool_calls[0].function %}"
    "{{- '<|assistant|>{\"name\": \"' + call.name + '\", \"parameters\": ' + (call.arguments | tojson) + '}<|end|>' }}"
    "{%- else %}{{- '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}"
)


def test_earlier_calls_a_template_refuses_as_tool_calls_reach_it_as_text_in_its_format() -> None:
    from appliance.engine.tools import LLAMA3_JSON

    template = ChatTemplate(ONE_CALL_A_TURN, _folder_template("llama").tokenizer)
    assert template.takes_tool_calls and template.call_format is LLAMA3_JSON
    paris, rome = PastCall("get_weather", '{"city": "Paris"}'), PastCall("get_weather", '{"city": "Rome"}')
    for calls, written in (((paris,), '<|assistant|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|end|>'),
                           ((paris, rome), '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                                           '{"name": "get_weather", "parameters": {"city": "Rome"}}')):  # fmt: skip
        turns = (Message("user", "Weather?"), Message("assistant", "", calls, thought="Two cities."))
        assert written in template.prompt((*turns, Message("user", "And?")), output=OutputRules((WEATHER,))).text


@pytest.mark.parametrize("name", ["gemma3", "mistral"])
def test_a_template_that_wants_roles_to_alternate_gets_turns_of_one_role_as_one(name: str) -> None:
    from appliance.engine.errors import InvalidRequest

    template = _folder_template(name)
    two = template.prompt((Message("user", "Here is the context."), Message("user", "What now?")))
    assert two.text == template.prompt((Message("user", "Here is the context.\n\nWhat now?"),)).text
    # Tool results, then a question, from a client: one user turn with both.
    turns = (Message("user", "Weather?"), Message("assistant", "", (PastCall("get_weather", "{}"),)),
             Message("user", "", results=(("18 C", False),)), Message("user", "And tomorrow?"))  # fmt: skip
    assert "And tomorrow?" in template.prompt(turns).text
    with pytest.raises(InvalidRequest, match="alternate"):  # what combining cannot mend stays the template's refusal
        template.prompt((Message("assistant", "Hello!"), Message("user", "Hi.")))


@pytest.mark.parametrize(("name", "in_place"), [("qwen2", True), ("llama_rope_llama3", True), ("gemma3", False),
                                              ("mistral", False)])  # fmt: skip
def test_a_system_message_later_on_is_where_the_template_puts_it_or_heads_the_next_user_turn(name: str,
                                                                                             in_place: bool) -> None:
    template = _folder_template(name)
    hello = (Message("user", "Hi."), Message("assistant", "Hello."))
    text = template.prompt((*hello, Message("system", "Answer in French."), Message("user", "And now?"))).text
    folded = template.prompt((*hello, Message("user", "Answer in French.\n\nAnd now?"))).text
    assert "Answer in French." in text and (text == folded) != in_place


# Gemma 2's template as published (abridged): no system role, and it says so.
NO_SYSTEM_ROLE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{{ '<start_of_turn>' + message['role'] + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def test_a_template_without_a_system_role_gets_system_prompts_at_the_head_of_the_next_user_turn() -> None:
    """Gemma 2's refused every request with a system prompt (or tools, which reach it in one)."""
    template = ChatTemplate(NO_SYSTEM_ROLE, _folder_template("llama").tokenizer)
    turns = (Message("user", "Hi."), Message("assistant", "Hello."), Message("system", "In French."),
             Message("user", "And now?"))  # fmt: skip
    assert template.prompt(turns, system="Be brief.").text == template.prompt(
        (Message("user", "Be brief.\n\nHi."), turns[1], Message("user", "In French.\n\nAnd now?"))).text
    assert "get_weather" in template.prompt(SHORT, output=OutputRules(tools=(WEATHER,))).text


# Llama 3.1's way with tools (abridged): they go in the first user message, and the template refuses
# a conversation without one, as it refuses the system message alone.
TOOLS_IN_THE_FIRST_USER_MESSAGE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system = '' %}{%- endif %}"
    "{{- '<|system|>' + system + '<|end|>' }}{%- if tools %}{%- if messages | length == 0 %}"
    "{{- raise_exception(\"Cannot put tools in the first user message when there's no first user message!\") }}"
    "{%- endif %}{{- '<|user|>' + (tools | tojson) + messages[0]['content'] + '<|end|>' }}"
    "{%- set messages = messages[1:] %}{%- endif %}"
    "{%- for message in messages %}{{- '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}"
)


def test_a_template_that_refuses_the_conversation_s_first_messages_alone_still_renders_it_whole() -> None:
    """Message boundaries come from rendering the conversation's first messages alone; Llama
    3.1's template refuses the system message alone when there are tools, and every request
    with both was refused for it. Where the system message ends is not known; where each of the
    others does is."""
    template = ChatTemplate(TOOLS_IN_THE_FIRST_USER_MESSAGE, _folder_template("llama").tokenizer)
    prompt = template.prompt(CONVERSATION, system="Be brief.", output=OutputRules(tools=(WEATHER,)))
    assert "Be brief." in prompt.text and "get_weather" in prompt.text
    ends = [len(template.tokenizer.encode(prompt.text[:prompt.text.index(said) + len(said) + len("<|end|>")])[0])
            for said in (m.content for m in CONVERSATION)]  # fmt: skip
    assert prompt.message_starts == ends


# What newer templates use of transformers' environment beyond the families' own templates.
RICH_TEMPLATE = """{{ bos_token }}{% set today = strftime_now('%d %b %Y') %}
{% for m in messages %}
{% if m.role == 'robot' %}{{ raise_exception('no robots') }}{% endif %}
<|{{ m.role }}|>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}
{{ m.content }}{% endif %}
{% endfor %}
{% if tools %}{{ tools | tojson(indent=2, sort_keys=True, ensure_ascii=False) }}
{{ tools | tojson(separators=(',', ':')) }}{% endif %}
Today is {{ today }}.{% if add_generation_prompt %}<|assistant|>{% endif %}"""


def test_templates_using_more_of_transformers_environment_render_as_transformers_renders() -> None:
    """A `{% generation %}` block, strftime_now, tojson's options and raise_exception, as
    templates of models people bring use them (one that used `{% generation %}` did not compile)."""
    from transformers import AutoTokenizer

    from appliance.engine.errors import InvalidRequest

    folder = tiny_hf_dir("qwen2")
    template = ChatTemplate(RICH_TEMPLATE, TextTokenizer(folder / "tokenizer.json", folder / "tokenizer_config.json"))
    hf = AutoTokenizer.from_pretrained(folder)
    docs = [{"role": m.role, "content": m.content} for m in CONVERSATION]
    tools = [{"type": "function", "function": {"name": "f", "description": "é", "parameters": {"type": "object"}}}]
    ours = template.render(docs, add_generation_prompt=True, tools=tools)
    assert ours == hf.apply_chat_template(docs, chat_template=RICH_TEMPLATE, tools=tools, tokenize=False,
                                          add_generation_prompt=True)  # fmt: skip
    assert "Today is " in ours and '"description": "é"' in ours and "<|assistant|>" in ours
    with pytest.raises(InvalidRequest, match="no robots"):
        template.render([{"role": "robot", "content": "beep"}], add_generation_prompt=True)
    with pytest.raises(ValueError, match="chat template does not compile: Encountered unknown tag 'nonsense'"):
        ChatTemplate("{% nonsense %}", template.tokenizer)


# SmolVLM's and LLaVA's way: each message's content a list of typed parts, a string's characters
# (which have no type) writing nothing.
PARTS_TEMPLATE = """{% for message in messages %}<|im_start|>{{ message['role'] | capitalize }}:
{%- for part in message['content'] %}{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}\
 {{ part['text'] }}{% endif %}{% endfor %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>Assistant:{% endif %}"""


def test_a_template_that_reads_content_as_parts_gets_each_message_as_a_text_part() -> None:
    from transformers import AutoTokenizer

    folder = tiny_hf_dir("qwen2")
    template = ChatTemplate(PARTS_TEMPLATE, TextTokenizer(folder / "tokenizer.json", folder / "tokenizer_config.json"))
    assert template.takes_parts and not ChatTemplate(RICH_TEMPLATE, template.tokenizer).takes_parts
    docs = [{"role": m.role, "content": [{"type": "text", "text": m.content}]} for m in CONVERSATION]
    ours = template.prompt(CONVERSATION, system="Be brief.")
    docs.insert(0, {"role": "system", "content": [{"type": "text", "text": "Be brief."}]})
    hf = AutoTokenizer.from_pretrained(folder)
    assert ours.ids == hf_chat_ids(hf, docs, chat_template=PARTS_TEMPLATE)
    assert "User: Explain the for statement" in ours.text and ours.text.endswith("<|im_start|>Assistant:")


def hf_chat_ids(tokenizer: Any, docs: list[dict[str, str]], **kwargs: Any) -> list[int]:
    out = tokenizer.apply_chat_template(docs, tokenize=True, add_generation_prompt=True, **kwargs)
    if not isinstance(out, list):  # transformers 5 returns the encoding
        out = out["input_ids"]
    return [int(i) for i in out]


def test_a_genai_folder_with_window_sized_caches_is_refused(tmp_path: Path) -> None:
    """The engine binds caches of the whole capacity; a folder exported with the builder's
    window-sized caches for its sliding layers would read and write the wrong positions."""
    from firmware.errors import BundleError
    from firmware.toolchain.build import BuildOptions, build

    src = tmp_path / "genai"
    src.mkdir()
    (src / "genai_config.json").write_text(json.dumps({"model": {"decoder": {
        "sliding_window": {"window_size": 16, "layers": [0, 2]}}}}))  # fmt: skip
    with pytest.raises(BundleError, match=r"sliding-window layers \[0, 2\] keep window-sized caches"):
        build(src, tmp_path / "out", BuildOptions(precision="fp32"))


def test_a_model_with_layers_of_another_kind_is_refused_before_export(tmp_path: Path) -> None:
    from firmware.errors import BundleError
    from firmware.toolchain.build import BuildOptions, build

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama4_text", "sliding_window": 16,
                                                "layer_types": ["chunked_attention", "full_attention"]}))  # fmt: skip
    with pytest.raises(BundleError, match="layers of kind chunked_attention are not supported"):
        build(hf, tmp_path / "out", BuildOptions(precision="fp32"))
    # Recurrent layers only where their export was checked (Qwen3.5's, Qwen3-Next's), not MiniMax's, say.
    (hf / "config.json").write_text(json.dumps({"model_type": "minimax", "architectures": ["MiniMaxForCausalLM"],
                                                "layer_types": ["linear_attention", "full_attention"]}))  # fmt: skip
    with pytest.raises(BundleError, match="layers of kind linear_attention are not supported"):
        build(hf, tmp_path / "out", BuildOptions(precision="fp32"))
    # Nemotron-H's blocks, as published (a letter each): Mamba, MLP and attention ones are the
    # nemotron_h fixture, experts' ones (Nemotron 3's "E") nemotron_h_moe's; experts mixed by scores
    # not scaled to sum to 1 are not what the export computes, there or in GLM-4.5's and DeepSeek
    # V3's layers (the glm4_moe and deepseek_v3 fixtures; their choice within groups is built: the
    # config sweep's grouped variants), nor DeepSeek V2's groups ranked by their best score.
    nemotron = {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"],
                "hybrid_override_pattern": "M-M*-ME"}  # fmt: skip
    glm = {"model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"]}
    deepseek = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]}
    for config in (nemotron, glm, deepseek):
        (hf / "config.json").write_text(json.dumps(config | {"norm_topk_prob": False}))
        with pytest.raises(BundleError, match=r"norm_topk_prob false"):
            build(hf, tmp_path / "out", BuildOptions(precision="fp32"))
    (hf / "config.json").write_text(json.dumps({
        "model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"], "n_group": 8, "topk_group": 3,
        "topk_method": "group_limited_greedy"}))  # fmt: skip
    with pytest.raises(BundleError, match=r"best 3 of 8 groups by their best score"):
        build(hf, tmp_path / "out", BuildOptions(precision="fp32"))


def test_olmo_with_clamped_attention_inputs_is_refused_before_export(tmp_path: Path) -> None:
    # The builder exports OLMo without its clip_qkv clamp: a tiny OLMo with clip_qkv 0.5 was off
    # transformers' logits by far more than 1e-4.
    from firmware.errors import BundleError
    from firmware.toolchain.build import BuildOptions, build

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "olmo", "architectures": ["OlmoForCausalLM"],
                                                "clip_qkv": 8.0}))  # fmt: skip
    with pytest.raises(BundleError, match=r"clip_qkv 8\.0 .* left out by the ONNX Runtime GenAI model builder"):
        build(hf, tmp_path / "out", BuildOptions(precision="fp32"))


def test_a_graph_taking_an_input_the_engine_does_not_feed_is_refused(tmp_path: Path, trusted_keys: Path) -> None:
    """Such a graph would load, and fail at its first run (as HunYuan's, which takes position_ids,
    did before the engine fed them)."""
    import onnx

    def add_input(model: Any, facts: object) -> None:
        model.graph.input.append(onnx.helper.make_tensor_value_info("token_type_ids", onnx.TensorProto.INT64, [1, "s"]))

    _refused_at_build_and_start(tmp_path, trusted_keys, add_input,
                                "the graph takes token_type_ids, which the engine does not feed")  # fmt: skip


def _refused_at_build_and_start(tmp_path: Path, trusted_keys: Path, edit: Any, refusal: str) -> None:
    """A copy of the tiny Qwen2 bundle with its graph edited by edit(model, facts) is refused by the
    build's load check and when a session is made, with `refusal` in both messages."""
    import shutil

    import onnx

    from appliance.engine.session import ModelSession
    from firmware.errors import BundleError
    from firmware.toolchain.build import check_loads

    bundle = firmware.load(tiny_bundle("qwen2"), trusted_keys)
    folder = tmp_path / "bundle"
    shutil.copytree(bundle.root, folder)
    graph_dir, facts = bundle.graph("cpu")
    model = onnx.load(str(graph_dir / facts.onnx_file))
    edit(model, facts)
    onnx.save(model, str(folder / facts.onnx_file))
    with pytest.raises(BundleError, match=re.escape(refusal)):
        check_loads(folder)
    with pytest.raises(ValueError, match=re.escape(refusal)):
        ModelSession(dataclasses.replace(bundle, root=folder))


def test_a_graph_whose_keys_and_values_differ_in_shape_is_refused(tmp_path: Path, trusted_keys: Path) -> None:
    """The engine's KV slots hold a layer's keys and values in two buffers of one shape (layers may
    differ from each other, as Gemma 4's do): a graph whose past values are wider than its keys is
    refused at the build's check and when a session is made."""

    def widen(model: Any, facts: Any) -> None:
        past = next(i for i in model.graph.input if i.name == facts.past_value_name % 1)
        past.type.tensor_type.shape.dim[1].dim_value = facts.num_kv_heads
        past.type.tensor_type.shape.dim[3].dim_value = 2 * facts.head_size

    facts = firmware.load(tiny_bundle("qwen2"), trusted_keys).model
    odd = f"layer 1: keys {facts.num_kv_heads} heads of {facts.head_size}, values {facts.num_kv_heads} heads of " \
          f"{2 * facts.head_size}"
    _refused_at_build_and_start(tmp_path, trusted_keys, widen, f"keys and values differ in shape ({odd}")


def test_gemma4_s_layers_of_two_shapes_get_slots_of_their_own_and_the_plan_counts_them(trusted_keys: Path) -> None:
    """Gemma 4's global layers have fewer, wider heads than its sliding ones: each layer's slots take
    its own shape from the graph, and the daemon's memory plan counts what they hold."""
    from appliance.plan import memory_need

    bundle = firmware.load(tiny_bundle("gemma4"), trusted_keys)
    config = EngineConfig(intra_op_threads=2, max_active_per_device=2, prefill_lane=False)
    engine = Engine(bundle, config)
    try:
        worker = engine.workers["cpu"]
        session, slots = worker.session, worker.kv
        f = bundle.model
        assert session.kv_shapes == [(f.num_kv_heads, f.head_size)] * 5 + [(1, 2 * f.head_size)]
        assert [shape[1:] for shape in slots.shapes][-2:] == [[2, slots.capacity, 16], [1, slots.capacity, 32]]
        assert memory_need(bundle, config).kv == slots.rows * slots.row_bytes
    finally:
        engine.close()


def test_gemma4_e_s_sharing_layers_write_their_source_s_buffers_and_take_no_memory(trusted_keys: Path) -> None:
    """Gemma 4 E2B's last layers attend over the keys and values of the last earlier layer of their
    type: they have no past inputs, and their attention operators' presents are bound to that
    layer's buffers, so their keys take no memory (the plan counts three layers of six)."""
    from appliance.plan import memory_need

    bundle = firmware.load(tiny_bundle("gemma4_e"), trusted_keys)
    config = EngineConfig(intra_op_threads=2, max_active_per_device=2, prefill_lane=False)
    engine = Engine(bundle, config)
    try:
        session, slots = engine.workers["cpu"].session, engine.workers["cpu"].kv
        assert session.kv_layers == 3 and len(slots.shapes) == 3
        # layers 3 and 4 (sliding) read layer 1's, layer 5 (full) layer 2's
        assert session.shared_kv == [(f"present.{i}.key", f"present.{i}.value", source)
                                     for i, source in ((3, 1), (4, 1), (5, 2))]  # fmt: skip
        assert memory_need(bundle, config).kv == slots.rows * slots.row_bytes
        # A run's presents are the buffers themselves (ONNX Runtime allocates none to copy into).
        cache = session.new_cache(64)
        session.forward(cache, np.arange(3, 10, dtype=np.int64))
        own = [pointer for pair in cache.slots.pointers for pointer in pair]
        shared = [pointer for source in (1, 1, 2) for pointer in cache.slots.pointers[source]]
        outputs = cache.slots.bindings[(session, 0, 1)].binding.get_outputs()[1:]  # after the logits
        assert [value.data_ptr() for value in outputs] == own + shared
    finally:
        engine.close()


def test_gemma4_e_s_per_layer_table_is_quantized_in_a_quantized_build(tmp_path: Path, trusted_keys: Path,
                                                                       dev_key: Path) -> None:  # fmt: skip
    """A row of layers x width per token (some two billion values in E2B) stays no float table in an int8
    bundle: 8-bit blocks (GatherBlockQuantized), and the logits stay near the float build's."""
    import onnx

    from firmware.toolchain.build import BuildOptions, build

    out = tmp_path / "int8"
    build(tiny_hf_dir("gemma4_e"), out, BuildOptions(precision="int8"), key=dev_key, progress=lambda _: None)
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    gathers = [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
    assert [n.input[0] for n in gathers] == ["model.embed_tokens_per_layer.qweight"]
    assert {a.name: a.i for a in gathers[0].attribute}["bits"] == 8
    assert "model.embed_tokens_per_layer.weight" not in {i.name for i in graph.initializer}
    ids = np.arange(3, 60, dtype=np.int64)
    want = ModelSession(firmware.load(tiny_bundle("gemma4_e"), trusted_keys))
    got = ModelSession(firmware.load(out, trusted_keys))
    a, b = (s.forward(s.new_cache(64), ids) for s in (want, got))
    assert int(a.argmax()) == int(b.argmax()) and float(np.abs(a - b).max()) < 1.0


def test_gemma4_e_s_fp16_cuda_graph_runs_within_fp16_of_the_float_one(tmp_path: Path, trusted_keys: Path,
                                                                     dev_key: Path) -> None:  # fmt: skip
    """In the fp16 graph a GPU runs, the residual stream stays fp32 (as Gemma's norms keep it) and the
    per-layer inputs are fp16: the block between them casts (run here on the CPU provider)."""
    from firmware.toolchain.build import BuildOptions, build

    out = tmp_path / "both"
    build(tiny_hf_dir("gemma4_e"), out, BuildOptions(precision="fp32", cuda_graph=True), key=dev_key,
          progress=lambda _: None)  # fmt: skip
    ids = np.arange(3, 60, dtype=np.int64)
    exact = ModelSession(firmware.load(tiny_bundle("gemma4_e"), trusted_keys))
    half = ModelSession(firmware.load(out, trusted_keys), "cpu", target="cuda")
    a, b = (s.forward(s.new_cache(64), ids) for s in (exact, half))
    assert half.kv_dtype == np.float16 and len(half.shared_kv) == 3
    assert float(np.abs(a - b).max()) <= 0.05 and int(a.argmax()) == int(b.argmax())


@pytest.mark.parametrize(("text", "refused"), [
    ({"hidden_size_per_layer_input": 0, "enable_moe_block": True}, "use GeGLU experts"),
])  # fmt: skip
def test_what_of_gemma4_the_export_leaves_out_is_refused_before_export(tmp_path: Path, text: dict[str, Any],
                                                                       refused: str) -> None:  # fmt: skip
    from firmware.errors import BundleError
    from firmware.toolchain.build import BuildOptions, build

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"architectures": ["Gemma4ForConditionalGeneration"],
                                                "model_type": "gemma4", "text_config": {
        "model_type": "gemma4_text", "head_dim": 256, "global_head_dim": 512, **text}}))  # fmt: skip
    with pytest.raises(BundleError, match=re.escape(refused)):
        build(hf, tmp_path / "out", BuildOptions(precision="fp32"))


@pytest.mark.parametrize("entry", UNEXPORTED_OPTIONS, ids=[f"{e[0]}-{e[1]}" for e in UNEXPORTED_OPTIONS])
def test_an_option_the_export_leaves_out_is_refused_before_export(tmp_path: Path, entry: tuple[str, ...]) -> None:
    """StableLM 2 12B's query and key norms and parallel residual, Command R+'s query and key norms,
    a Phi with query and key norms: each would be built without (a tiny Phi-2 with them was 0.88 off
    transformers), so each is refused, naming the option."""
    from firmware.errors import BundleError
    from firmware.toolchain.build import BuildOptions, build

    model_type, option, _, family = entry
    classes = {"stablelm": "StableLmForCausalLM", "cohere": "CohereForCausalLM", "phi": "PhiForCausalLM",
               "lfm2": "Lfm2ForCausalLM", **GPT_FAMILIES}
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"architectures": [classes[model_type]], "model_type": model_type,
                                                option: True}))  # fmt: skip
    with pytest.raises(BundleError, match=rf"{option} \(.*\) is not exported for {re.escape(family)}; not supported"):
        build(hf, tmp_path / "out", BuildOptions(precision="fp32"))


def test_a_hunyuan_whose_experts_differ_by_layer_is_refused_before_export(tmp_path: Path) -> None:
    """HunYuan's configs may give the experts' counts per layer; the export takes one for every layer
    (the hunyuan_moe fixture's list of one count builds, as its matrix tests show)."""
    from firmware.errors import BundleError
    from firmware.toolchain.build import BuildOptions, build

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"architectures": ["HunYuanMoEV1ForCausalLM"],
                                                "model_type": "hunyuan_v1_moe", "moe_topk": [2, 4]}))  # fmt: skip
    with pytest.raises(BundleError, match=re.escape("its moe_topk differs by layer ([2, 4])")):
        build(hf, tmp_path / "out", BuildOptions(precision="fp32"))


@pytest.mark.parametrize(("option", "refusal"), [({"norm_topk_prob": False}, "norm_topk_prob false"),
                                                 ({"mlp_only_layers": [0]}, "dense layers"),
                                                 ({"decoder_sparse_step": 2}, "dense layers")])
def test_a_qwen3_next_that_qwen3_5_s_layers_do_not_compute_is_refused_before_export(
        tmp_path: Path, option: dict[str, Any], refusal: str) -> None:  # fmt: skip
    """Qwen3.5's routing always renormalizes the chosen experts' weights and puts experts in every
    layer; a Qwen3-Next config that does otherwise would be built wrong."""
    from firmware.errors import BundleError
    from firmware.toolchain.build import BuildOptions, build

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
                                                **option}))  # fmt: skip
    with pytest.raises(BundleError, match=f"Qwen3-Next with {refusal}"):
        build(hf, tmp_path / "out", BuildOptions(precision="fp32"))


def test_opt_with_its_norms_after_each_sublayer_is_refused_before_export(tmp_path: Path) -> None:
    """opt-350m normalizes each sublayer's output after the residual sum, which the export (its
    norms before each sublayer) does not: refused, naming the option."""
    from firmware.errors import BundleError
    from firmware.toolchain.build import BuildOptions, build

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"architectures": ["OPTForCausalLM"], "model_type": "opt",
                                                "do_layer_norm_before": False}))  # fmt: skip
    with pytest.raises(BundleError, match=r"do_layer_norm_before: false.*not supported"):
        build(hf, tmp_path / "out", BuildOptions(precision="fp32"))


@pytest.mark.parametrize(("rope", "refused"), [
    ({"rope_parameters": {"rope_type": "proportional", "rope_theta": 1e4}}, "RoPE scaling 'proportional' is not "
                                                                             "exported"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 8.0},
                          "full_attention": {"rope_type": "linear", "factor": 8.0}}},
     "RoPE scaling 'linear' on its sliding_attention layers"),
])  # fmt: skip
def test_rope_scaling_the_export_does_not_compute_as_transformers_is_refused_before_export(
        tmp_path: Path, rope: dict[str, object], refused: str) -> None:  # fmt: skip
    """A kind no tiny model checks is not served; Gemma 3's local layers rotate plainly in the
    export (builder_shim.gemma3_plain_local_rope). The kinds that are checked, HunYuan's fixed-alpha
    "dynamic", dynamic NTK (served only as far as it rotates plainly) and Phi-3's old name for
    LongRoPE pass."""
    from firmware.errors import BundleError
    from firmware.toolchain.build import BuildOptions, _rope_types, build, exact_positions

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], **rope}))
    with pytest.raises(BundleError, match=refused):
        build(hf, tmp_path / "out", BuildOptions(precision="fp32"))
    assert _rope_types({"rope_scaling": {"type": "dynamic", "alpha": 1000.0}}) == [(None, "ntk_alpha")]
    dynamic = {"rope_scaling": {"type": "dynamic", "factor": 6.0}, "max_position_embeddings": 32768}
    assert _rope_types(dynamic) == [(None, "dynamic")] and exact_positions(dynamic) == (32768, ANY)
    assert _rope_types({"rope_scaling": {"type": "su", "short_factor": [1.0]}}) == [(None, "longrope")]
    assert _rope_types({}) == [(None, "default")]


def test_every_checked_rope_scaling_has_a_tiny_model() -> None:
    """ROPE_TYPES is what the matrix checks: each kind is some fixture's."""
    from firmware.toolchain.build import ROPE_TYPES, _rope_types

    configs = [extra.get("text_config", extra) for _, _, extra in ARCHITECTURES.values()]
    kinds = {kind for config in configs if isinstance(config, dict) for _, kind in _rope_types(config)}
    assert kinds == set(ROPE_TYPES)


def test_a_graph_that_opens_but_cannot_run_is_refused_at_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:  # fmt: skip
    """A Phi-3 rotating three quarters of heads of 32 (24 dimensions: a table of 12 per position)
    exports and opens, and GroupQueryAttention refuses it at its first run (its table's width must
    be a multiple of 8; Phi-4-mini's 96 of 128 is). The build runs a prompt and a token through
    the graph, so such a bundle is never shipped to fail on every request."""
    from firmware.errors import BundleError
    from firmware.toolchain import tiny
    from firmware.toolchain.build import BuildOptions, build

    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}
    monkeypatch.setitem(tiny.ARCHITECTURES, "phi3_odd_rotary", ("Phi3Config", "Phi3ForCausalLM", {
        "num_attention_heads": 2, "num_key_value_heads": 1, "rope_parameters": rope}))  # fmt: skip
    tiny.make_tiny_hf(tmp_path / "hf", arch="phi3_odd_rotary")
    with pytest.raises(BundleError, match=r"opens it but cannot run it: .*GroupQueryAttention.*multiple of 8"):
        build(tmp_path / "hf", tmp_path / "out", BuildOptions(precision="fp32"))


@pytest.mark.parametrize(("providers", "runs_here"), [
    ([], True), ([{"cpu": {}}], True), ([{"cuda": {"enable_cuda_graph": "0"}}], False), ([{"dml": {}}], False),
])  # fmt: skip
def test_the_build_runs_only_a_cpu_graph(tmp_path: Path, providers: list[object], runs_here: bool) -> None:
    """A GPU graph is not run on the build host (it runs where its provider is; the daemon warms
    each session up at start)."""
    from firmware.toolchain.build import _provider_options

    doc = {"model": {"decoder": {"session_options": {"provider_options": providers}}}}
    (tmp_path / "genai_config.json").write_text(json.dumps(doc))
    assert (not _provider_options(tmp_path)) == runs_here


def _gemma3n_as_published(folder: Path, drop: str | None = None) -> None:
    """The gemma3n_text fixture as Google publishes Gemma 3n: the image-audio-and-text checkpoint
    (Gemma3nForConditionalGeneration), the language model's weights under model.language_model,
    tied to no LM head of its own, beside a tower's (which no build reads); `drop` leaves one of the
    language model's weights out."""
    import shutil

    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    source = tiny_hf_dir("gemma3n_text")
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("config.json", "model.safetensors"))
    config = transformers.Gemma3nConfig(text_config=json.loads((source / "config.json").read_text())).to_dict()
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["Gemma3nForConditionalGeneration"]}))
    weights = {f"model.language_model.{k.removeprefix('model.')}": v
               for k, v in load_file(source / "model.safetensors").items() if k != "lm_head.weight" and k != drop}
    save_file({**weights, "model.audio_tower.conformer.0.norm.weight": torch.ones(4)}, folder / "model.safetensors")


def test_gemma3n_as_published_builds_its_language_model_alone(tmp_path: Path, trusted_keys: Path) -> None:
    """Gemma 3n is published whole (Gemma3nForConditionalGeneration, whose vision tower's class
    needs timm, which the build has not): the build reads its language model's weights alone and
    answers as the language model saved alone does; one of them missing is refused, not filled
    with the random values transformers' loader would put there."""
    from firmware.errors import BundleError
    from firmware.toolchain.build import BuildOptions, build
    from firmware.toolchain.devkit import ensure_dev_key

    _gemma3n_as_published(tmp_path / "hf")
    build(tmp_path / "hf", tmp_path / "out", BuildOptions(precision="fp32"), key=ensure_dev_key(),
          progress=lambda _: None)  # fmt: skip
    ids = _ids(firmware.load(tiny_bundle("gemma3n_text"), trusted_keys))
    whole = ModelSession(firmware.load(tmp_path / "out", trusted_keys), last_position_logits=False).all_logits(
        np.array(ids, dtype=np.int64))  # fmt: skip
    alone = ModelSession(firmware.load(tiny_bundle("gemma3n_text"), trusted_keys),
                         last_position_logits=False).all_logits(np.array(ids, dtype=np.int64))  # fmt: skip
    assert np.abs(whole - alone).max() <= 1e-5
    _gemma3n_as_published(tmp_path / "broken", drop="model.layers.1.laurel.linear_left.weight")
    with pytest.raises(BundleError, match=r"no weights for .*laurel\.linear_left"):
        build(tmp_path / "broken", tmp_path / "out2", BuildOptions(precision="fp32"), key=ensure_dev_key(),
              progress=lambda _: None)  # fmt: skip


def test_ministral3_is_served_only_as_far_as_its_export_is_exact(trusted_keys: Path) -> None:
    """Past its original context Ministral 3 scales its queries by position, which the export
    leaves out: a tiny one matched transformers within 2.9e-6 inside its original 64 positions and
    was 4.9e-4 off past them. The bundle's context stops at the original one (here 1024, inside
    which the matrix checks it), so no request reaches past it."""
    from firmware.toolchain.build import exact_positions

    for name in ("ministral3_vl", "ministral3"):  # and its language model saved alone
        bundle = firmware.load(tiny_bundle(name), trusted_keys)
        config = json.loads((tiny_hf_dir(name) / "config.json").read_text())
        assert config.get("text_config", config)["max_position_embeddings"] == 2048
        exact = exact_positions(config)
        assert exact is not None and exact[0] == bundle.model.context_length == 1024, name
    assert exact_positions(json.loads((tiny_hf_dir("mistral3_vl") / "config.json").read_text())) is None


def test_longrope_outside_phi3_is_served_inside_its_original_context() -> None:
    """LongRoPE turns to its long factors past the original context; only Phi-3's builder class
    follows it there, any other's export rotates by the short factors (the config sweep's MiniCPM3
    LongRoPE variant matches transformers inside), so its context stops at the original one."""
    from firmware.toolchain.build import exact_positions

    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
            "original_max_position_embeddings": 4096}  # fmt: skip
    minicpm3 = {"model_type": "minicpm3", "max_position_embeddings": 32768, "rope_parameters": rope}
    assert exact_positions(minicpm3) == (4096, ANY)
    assert exact_positions(minicpm3 | {"model_type": "phi3"}) is None  # (its class switches the factors)
    published = {"model_type": "minicpm3", "max_position_embeddings": 32768,  # (MiniCPM3-4B's: never past)
                 "rope_scaling": {**rope, "type": "longrope", "original_max_position_embeddings": 32768}}
    assert exact_positions(published) == (32768, ANY)  # (its whole context: nothing capped)


def test_llama4_is_served_inside_one_chunk_and_before_its_queries_scale_by_position(
        tmp_path: Path, trusted_keys: Path, dev_key: Path) -> None:  # fmt: skip
    """Llama 4's rotated layers attend within chunks (attention_chunk_size) and its others scale their
    queries by position from floor_scale on (attn_temperature_tuning); the export does neither (the
    llama4 fixture matches transformers inside both), so the bundle serves no position past them."""
    import shutil

    from firmware.toolchain.build import BuildOptions, build, exact_positions

    config = json.loads((tiny_hf_dir("llama4") / "config.json").read_text())
    assert exact_positions(config) == (8191, ANY)  # (position 8191 is the first whose queries scale)
    assert exact_positions(config | {"attn_temperature_tuning": False}) == (8192, ANY)
    assert exact_positions(config | {"attention_chunk_size": None, "attn_temperature_tuning": False}) is None
    hf = tmp_path / "hf"
    shutil.copytree(tiny_hf_dir("llama4"), hf)
    (hf / "config.json").write_text(json.dumps(config | {"attention_chunk_size": 1024}))
    build(hf, tmp_path / "out", BuildOptions(precision="fp32"), key=dev_key, progress=lambda _: None)
    assert firmware.load(tmp_path / "out", trusted_keys).model.context_length == 1024


TRANSFORMERS_4_52_LLAVA = {"language_model.model.": "model.language_model.", "language_model.lm_head.": "lm_head."}


@pytest.mark.parametrize("keys", [TRANSFORMERS_4_52_LLAVA, {}], ids=["saved-by-transformers-4.52-on", "as-published"])
def test_an_image_and_text_checkpoint_s_language_model_is_read_alone_wherever_it_keeps_it(tmp_path: Path,
                                                                                        keys: dict[str, str]) -> None:
    """LLaVA's weights under `language_model.model.` (as published, and as transformers 5 saves
    them) or `model.language_model.` (as transformers 4.52 to 4.57 saved them): the language model
    alone, its weights the checkpoint's; under a prefix of neither, refused (no weight is left to
    the loader's random values)."""
    import shutil

    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from firmware.toolchain import builder_shim

    source = tmp_path / "llava"
    shutil.copytree(tiny_hf_dir("llava"), source)
    stored = load_file(str(source / "model.safetensors"))

    def renamed(mapping: dict[str, str]) -> dict[str, Any]:
        out = {}
        for key, value in stored.items():
            for old, new in mapping.items():
                key = new + key.removeprefix(old) if key.startswith(old) else key
            out[key] = value
        return out

    save_file(renamed(keys), str(source / "model.safetensors"), metadata={"format": "pt"})
    llava = transformers.LlavaForConditionalGeneration.from_pretrained(tiny_hf_dir("llava"), dtype=torch.float32)
    text = builder_shim.language_model_alone(transformers.AutoConfig.from_pretrained(source))
    assert text.architectures == ["LlamaForCausalLM"] and text.model_type == "llama"
    model = builder_shim._language_model(str(source), text, transformers.LlamaForCausalLM,
                                         builder_shim.LANGUAGE_MODEL_KEYS, "LLaVA")  # fmt: skip
    ours, theirs = model.state_dict(), llava.state_dict()
    assert ours["lm_head.weight"].equal(theirs["lm_head.weight"])
    for key, value in ours.items():
        assert value.equal(theirs[key.replace("model.", "model.language_model.", 1)]), key
    save_file(renamed({"language_model.": "text."}), str(source / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"no weights for .* of LLaVA's language model"):
        builder_shim._language_model(str(source), text, transformers.LlamaForCausalLM,
                                     builder_shim.LANGUAGE_MODEL_KEYS, "LLaVA")  # fmt: skip


# Templates that write an assistant's content after its calls: plainly (None would read "None"), or
# where it is not None, as DeepSeek-R1's distills' do (an empty answer of its own for "").
CONTENT_WRITTEN = ("{{- tools | tojson if tools else '' }}{%- for m in messages %}{%- if m.tool_calls %}"
                   "{{- '<calls>' + m.tool_calls[0].function.name + '</calls>' }}{%- endif %}"
                   "{{- '<|' + m.role + '|>' ~ m.content ~ '<|end|>' }}{%- endfor %}")
CONTENT_IF_NOT_NONE = CONTENT_WRITTEN.replace("{{- '<|' + m.role", "{%- if m.content is not none %}{{- '<|' + m.role"
                                              ).replace("'<|end|>' }}", "'<|end|>' }}{%- endif %}")


@pytest.mark.parametrize(("template", "content", "written"), [
    (CONTENT_WRITTEN, "", "<calls>get_weather</calls><|assistant|><|end|>"),
    (CONTENT_IF_NOT_NONE, None, "<calls>get_weather</calls><|user|>"),
])  # fmt: skip
def test_a_turn_of_calls_alone_reaches_the_template_without_content_where_it_takes_none(
    template: str, content: str | None, written: str
) -> None:
    """As OpenAI's clients send such a turn (content null) and transformers passes it on, unless the
    template would write None as text."""
    chat = ChatTemplate(template, _folder_template("llama").tokenizer)
    assert chat.takes_tool_calls and chat.calls_content == content
    turns = (Message("user", "Weather?"), Message("assistant", "", (PastCall("get_weather", "{}"),)),
             Message("user", "And?"))  # fmt: skip
    assert written in chat.prompt(turns).text and "None" not in chat.prompt(turns).text
