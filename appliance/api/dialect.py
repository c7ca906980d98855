"""What differs between the APIs the app speaks, behind one interface: a request body into a
generation call, a whole answer and a stream out, errors in the dialect's own JSON, the status a
full queue gets, and the model list. The app holds no `if anthropic` branch; each dialect is an
object (appliance/api/anthropic.py, appliance/api/openai.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self

from appliance.api.errors import ApiError
from appliance.api.tools import Answer, CallOut
from appliance.engine import ContextOverflow, Finished, GenerationRequest
from appliance.engine.request import PromptLogprobs, TokenLogprob


@dataclass(frozen=True)
class Call:
    """A parsed generation request and how the client wants the answer."""

    request: GenerationRequest
    stream: bool
    model: str  # the served model the request named
    include_usage: bool = False  # OpenAI's stream_options.include_usage
    echo: bool = False  # the answer repeats the prompt before its own (the Completions API's echo)
    n: int = 1  # choices sampled from each prompt (OpenAI's n)
    # The Completions API's further prompts, answered together: choices n..2n-1 are the second's, and so on.
    more_prompts: tuple[GenerationRequest, ...] = ()
    echo_texts: tuple[str, ...] = ()  # each prompt as the model read it (the app fills them in once it has)

    @property
    def requests(self) -> tuple[GenerationRequest, ...]:
        """One per prompt, in order."""
        return (self.request, *self.more_prompts)

    @property
    def choices(self) -> int:
        return self.n * len(self.requests)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    version: str
    created: int  # unix seconds


class StreamEncoder(Protocol):
    """Engine events -> the dialect's server-sent events. One encoder writes one choice; `choice(i)`
    gives the encoder of another choice of the same answer (n > 1); `end` comes once, after every
    choice's `finish_choice`."""

    content_type: bytes  # of the stream's body

    def choice(self, index: int) -> Self: ...

    def start(self) -> bytes: ...

    def delta(self, text: str) -> bytes: ...

    def thought(self, text: str) -> bytes:
        """Text of a reasoning model's thought, before its answer (each dialect has its own field or block)."""
        ...

    def call_start(self, call: CallOut) -> bytes: ...

    def call_arguments(self, call: CallOut, piece: str) -> bytes: ...

    def logprob(self, token: TokenLogprob) -> bytes: ...

    def prompt_logprobs(self, scores: PromptLogprobs) -> bytes:
        """A scored prompt's log probabilities (only a plain completion asks for them)."""
        ...

    def debug(self, lines: list[str]) -> bytes: ...

    def finish_choice(self, done: Finished) -> bytes: ...

    def end(self, *choices: Finished) -> bytes: ...

    def error(self, err: ApiError) -> bytes: ...


class Dialect(Protocol):
    name: str  # "anthropic" or "openai": the metrics' api label
    busy_status: int  # what a full queue answers: Anthropic 529 overloaded, OpenAI 429

    def parse(self, doc: dict[str, Any], served: Sequence[str]) -> Call:
        """The request, refused with 404 (naming the served models) when its model is not one of them."""
        ...

    def response(self, model: str, call: Call, choices: Sequence[tuple[Answer, Finished]]) -> dict[str, Any]:
        """The whole answer: one (answer, how it ended) per choice, in order."""
        ...

    def new_call(self, name: str) -> CallOut:
        """A tool call the model began, with an id in the dialect's style."""
        ...

    def stream(self, model: str, input_tokens: int, call: Call) -> StreamEncoder: ...

    def error_body(self, err: ApiError) -> bytes: ...

    def overflow(self, exc: ContextOverflow) -> ApiError:
        """A prompt and max_tokens past the context, worded as the API's own servers word it: the
        clients of each recognise it (Claude Code lowers max_tokens on Anthropic's and retries;
        LiteLLM and LangChain take OpenAI's for a context-window error)."""
        ...

    def models(self, models: list[ModelInfo]) -> dict[str, Any]: ...

    def model(self, model: ModelInfo) -> dict[str, Any]:
        """One model, as `models.retrieve` reads it."""
        ...
