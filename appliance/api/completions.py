"""OpenAI's legacy Completions (`/v1/completions`): a prompt continued as plain text, no chat
template; what evaluation harnesses and older clients call. Errors and the model list are the
OpenAI dialect's."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any, Self

from appliance.api.dialect import Call
from appliance.api.errors import ApiError
from appliance.api.fields import Hint, check_hints, get_bool, get_int, reject_unknown
from appliance.api.openai import (
    GUIDED,
    OpenAIDialect,
    StreamEncoder,
    common_fields,
    finish_reason,
    guided_output,
    usage,
)
from appliance.api.tools import Answer, CallOut
from appliance.engine import Finished, GenerationRequest
from appliance.engine.request import MAX_TOP_LOGPROBS, PromptLogprobs, TokenLogprob
from appliance.engine.tools import OutputRules

_HINTS: dict[str, Hint] = {"user": str, "metadata": dict}
_KNOWN = {"model", "prompt", "max_tokens", "temperature", "top_p", "stop", "seed", "n", "stream", "stream_options",
          "frequency_penalty", "presence_penalty", "logprobs", "echo", "top_k", "min_p", "repetition_penalty",
          "best_of", "logit_bias", "min_tokens", "ignore_eos", "structured_outputs", *_HINTS, *GUIDED}  # fmt: skip
_UNSUPPORTED = {
    "suffix": "suffix (insertion) is not supported by this server",
}
DEFAULT_MAX_TOKENS = 16  # the Completions API's own default
MAX_PROMPTS = 64  # prompts in one request (each takes a slot or waits for one, as its own request would)
MAX_ANSWERS = 64  # choices in one request: prompts times n


def _prompts(doc: dict[str, Any]) -> list[str | tuple[int, ...]]:
    """The prompts: a text, token ids as the model's tokenizer numbers them (as evaluation harnesses
    send what they tokenized), or a list of either (several prompts, answered together)."""
    prompt = doc.get("prompt")
    if isinstance(prompt, str) or _token_ids(prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _token_ids(p) for p in prompt):
        prompts = prompt
    else:
        raise ApiError(400, "prompt: must be a string, a list of token ids, or a list of either (several prompts)",
                       param="prompt")  # fmt: skip
    if len(prompts) > MAX_PROMPTS:
        raise ApiError(400, f"prompt: at most {MAX_PROMPTS} prompts in one request ({len(prompts)} sent)",
                       param="prompt")  # fmt: skip
    out: list[str | tuple[int, ...]] = []
    for i, p in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        if not p:
            raise ApiError(400, f"{where}: must not be empty", param="prompt")
        if isinstance(p, list) and min(p) < 0:
            raise ApiError(400, f"{where}: {min(p)} is not a token id", param="prompt")
        out.append(tuple(p) if isinstance(p, list) else p)
    return out


def _token_ids(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def parse_request(doc: dict[str, Any], served: Sequence[str]) -> Call:
    reject_unknown(doc, _KNOWN, _UNSUPPORTED)
    check_hints(doc, _HINTS)
    common = common_fields(doc, served)
    if get_int(doc, "best_of", minimum=1) not in (None, 1):
        raise ApiError(400, "best_of: only best_of=1 is supported by this server", param="best_of")
    logprobs = get_int(doc, "logprobs", minimum=0)
    if logprobs is not None and logprobs > MAX_TOP_LOGPROBS:
        raise ApiError(400, f"logprobs: at most {MAX_TOP_LOGPROBS}", param="logprobs")
    echo = get_bool(doc, "echo")
    max_tokens = get_int(doc, "max_tokens", minimum=0)
    if max_tokens == 0 and not (echo and logprobs is not None):
        raise ApiError(400, "max_tokens: 0 generates nothing; it is for scoring the prompt (with echo and "
                       "logprobs)", param="max_tokens")  # fmt: skip
    prompts = _prompts(doc)
    if common.n * len(prompts) > MAX_ANSWERS:
        raise ApiError(400, f"prompt: {len(prompts)} prompts of n={common.n} choices each are over {MAX_ANSWERS} "
                       "choices in one request", param="prompt")  # fmt: skip
    # With echo, logprobs scores the prompt too (as evaluation harnesses ask for a text's likelihood).
    output = guided_output(doc, OutputRules())
    requests = [GenerationRequest(messages=(), raw_prompt=prompt, logprobs=logprobs, output=output,
                                  prompt_logprobs=logprobs if echo else None,
                                  max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
                                  **common.sampling) for prompt in prompts]  # fmt: skip
    return Call(requests[0], common.stream, common.model, common.include_usage, echo=echo, n=common.n,
                more_prompts=tuple(requests[1:]))  # fmt: skip


def legacy_logprobs(tokens: Sequence[TokenLogprob], offset: int, first: str | None = None) -> dict[str, Any]:
    """The legacy shape: parallel lists, each step's alternatives as a token -> logprob map, and
    where each token starts in the text. `first`: a scored prompt's first token, which has no log
    probability (null, as OpenAI's)."""
    steps: list[tuple[str, float | None, dict[str, float] | None]] = [] if first is None else [(first, None, None)]
    steps += [(t.token, t.logprob, dict(t.top)) for t in tokens]
    offsets, at = [], offset
    for token, _, _ in steps:
        offsets.append(at)
        at += len(token)
    return {"tokens": [s[0] for s in steps], "token_logprobs": [s[1] for s in steps],
            "top_logprobs": [s[2] for s in steps], "text_offset": offsets}  # fmt: skip


def response(completion_id: str, model: str, call: Call, choices: Sequence[tuple[Answer, Finished]]
             ) -> dict[str, Any]:  # fmt: skip
    def choice(index: int, answer: Answer, done: Finished) -> dict[str, Any]:
        echo, prompt, logprobs = call.echo_texts[index // call.n] if call.echo else "", answer.prompt, None
        if prompt is not None:  # the prompt's tokens, then the answer's
            logprobs = legacy_logprobs([*prompt.tokens, *(answer.logprobs or ())], 0, prompt.first)
        elif answer.logprobs is not None:
            logprobs = legacy_logprobs(answer.logprobs, len(echo))
        return {"index": index, "text": echo + answer.text, "logprobs": logprobs,
                "finish_reason": finish_reason(done)}  # fmt: skip

    return {"id": completion_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [choice(i, answer, done) for i, (answer, done) in enumerate(choices)],
            "usage": usage(*(done for _, done in choices), per_prompt=call.n)}  # fmt: skip


class CompletionStream(StreamEncoder):
    """Engine events -> `text_completion` chunks; the usage chunk, `[DONE]`, the comments and the
    errors are Chat Completions'."""

    OBJECT = "text_completion"

    def __init__(self, completion_id: str, model: str, call: Call) -> None:
        super().__init__(completion_id, model, call.include_usage)
        self.per_prompt = call.n
        self.echoes = call.echo_texts if call.echo else ()  # each prompt's
        self.echo = self.echoes[0] if self.echoes else ""  # this choice's prompt's
        # The echo goes with the prompt's log probabilities where they are asked for, else at once.
        self.scored = call.request.prompt_logprobs is not None
        self.offset = len(self.echo)  # where the next token starts in the whole text

    def choice(self, index: int) -> Self:
        other = super().choice(index)
        other.echo = self.echoes[index // (self.per_prompt or 1)] if self.echoes else ""
        other.offset = len(other.echo)
        return other

    def _choice(self, text: str, logprobs: dict[str, Any] | None = None, finish: str | None = None
                ) -> dict[str, Any]:  # fmt: skip
        return {"index": self.index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def start(self) -> bytes:
        return self._chunk([self._choice(self.echo)]) if self.echo and not self.scored else b""

    def prompt_logprobs(self, scores: PromptLogprobs) -> bytes:
        logprobs = legacy_logprobs(scores.tokens, 0, scores.first)
        self.offset = sum(len(token) for token in logprobs["tokens"])
        return self._chunk([self._choice(self.echo, logprobs)])

    def delta(self, text: str) -> bytes:
        return self._chunk([self._choice(text)])

    def call_start(self, call: CallOut) -> bytes:
        return b""  # a plain completion has no tools

    def call_arguments(self, call: CallOut, piece: str) -> bytes:
        return b""

    def logprob(self, token: TokenLogprob) -> bytes:
        out = self._chunk([self._choice("", legacy_logprobs([token], self.offset))])
        self.offset += len(token.token)
        return out

    def _last(self, done: Finished) -> dict[str, Any]:
        return self._choice("", finish=finish_reason(done))


class CompletionsDialect(OpenAIDialect):
    """`/v1/completions`: the prompt as it is, the answer as `text`."""

    def parse(self, doc: dict[str, Any], served: Sequence[str]) -> Call:
        return parse_request(doc, served)

    def response(self, model: str, call: Call, choices: Sequence[tuple[Answer, Finished]]) -> dict[str, Any]:
        return response("cmpl-" + uuid.uuid4().hex[:24], model, call, choices)

    def stream(self, model: str, input_tokens: int, call: Call) -> CompletionStream:
        return CompletionStream("cmpl-" + uuid.uuid4().hex[:24], model, call)


COMPLETIONS = CompletionsDialect()
