"""What a generation is asked for, and the events it yields. No HTTP here."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

from appliance.engine.errors import InvalidRequest
from appliance.engine.tools import CallArguments, CallStart, OutputRules, PastCall
from appliance.engine.trace import Trace

ROLES = ("system", "user", "assistant")
MAX_MESSAGES = 2048  # a conversation longer than this is refused before it is rendered
MAX_STOP_SEQUENCES = 16
MAX_TEMPLATE_VARIABLES = 32
# What the engine itself gives a chat template: a client's variable of one of these names is refused.
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools"})
MAX_STOP_SEQUENCE_CHARS = 256
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024  # tokens one request may bias (OpenAI's logit_bias)
LOGIT_BIAS = 100.0  # a bias is from -LOGIT_BIAS (the token is never chosen) to LOGIT_BIAS (always, where allowed)


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    calls: tuple[PastCall, ...] = ()  # an assistant's calls after its text, written in the model's call format
    results: tuple[tuple[str, bool], ...] = ()  # a user's tool results (text, is_error), before its text
    # An assistant's thought before its text and calls, as a client sends it back: the chat template
    # decides whether the model sees it again (Qwen3's shows those of the turn's tool calls, gpt-oss's
    # the analysis before a call).
    thought: str = ""


@dataclass(frozen=True)
class GenerationRequest:
    messages: tuple[Message, ...]
    max_tokens: int = 256
    system: str | None = None
    # None: the firmware's own default (genai_config.json "search"; greedy for SmolLM2).
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one
    # OpenAI's penalties on tokens already generated, and the multiplicative one llama.cpp and vLLM take.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, what is added to its logit before sampling)
    # The model's end of sequence is not chosen before min_tokens, nor at all with ignore_eos (vLLM's:
    # answers of a set length, as benchmark clients ask); stop sequences and a grammar's end still end it.
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_sequences: tuple[str, ...] = ()
    # max_tokens caps the answer where the context (or a device's KV room for one request) leaves
    # fewer positions after the prompt: there it is as many as are left (Ollama's num_predict -1).
    fit_context: bool = False
    seed: int | None = None
    output: OutputRules = field(default_factory=OutputRules)  # tools, tool choice, a JSON schema
    logprobs: int | None = None  # None: none; k: each token's log probability and the k most likely
    # The same for each prompt token after the first, given those before it (a plain completion's
    # scoring: what evaluation harnesses ask of the Completions API with echo); then max_tokens may be 0.
    prompt_logprobs: int | None = None
    # A plain completion: this text as it is, or these token ids (as the model's tokenizer numbers
    # them), no chat template (messages empty).
    raw_prompt: str | tuple[int, ...] | None = None
    # A reasoning model's thought (reasoning.py): None leaves its chat template's default; True or
    # False asks the template to think first or not (`enable_thinking`, as Qwen3's and SmolLM3's read).
    thinking: bool | None = None
    thinking_budget: int | None = None  # thought tokens at most; then it answers
    # Further variables for the chat template, as a client names them (vLLM's chat_template_kwargs:
    # DeepSeek V3.1's reads `thinking`); the settings above override theirs.
    template_variables: tuple[tuple[str, object], ...] = ()
    reasoning_effort: str | None = None  # low, medium or high: the template's `reasoning_effort` (gpt-oss reads it)
    # Chain digests the client's flow saw last time (the kernel layer keeps them per connection).
    prior_digests: tuple[bytes, ...] = ()
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])

    def prepares_quickly(self, limit_chars: int = 2048) -> bool:
        """Whether rendering and tokenizing it is too little work to send to a thread: a short
        prompt and no grammar to compile (a thread hop costs a small request a turn of the event
        loop, and on HTTP/3 a datagram of its own for the ACK)."""
        if self.output.constrained or len(self.messages) > 4:  # a render per message boundary
            return False
        text = (self.raw_prompt if isinstance(self.raw_prompt, str) else "") + (self.system or "")
        calls = sum(len(c.name) + len(c.arguments) for m in self.messages for c in m.calls)
        calls += sum(len(r) for m in self.messages for r, _ in m.results)
        return len(text) + calls + sum(len(m.content) for m in self.messages) <= limit_chars

    def validate(self) -> None:
        """Check what needs no tokenizer; raise InvalidRequest naming the parameter."""
        if self.raw_prompt is not None:
            if self.messages:
                raise InvalidRequest("a plain completion has a prompt, not messages", "prompt")
            if isinstance(self.raw_prompt, str):
                _check_text(self.raw_prompt, "prompt", "prompt")
            elif not self.raw_prompt or not all(
                    isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.raw_prompt):  # fmt: skip
                raise InvalidRequest("prompt: must be text or a non-empty list of token ids", "prompt")
        elif not self.messages:
            raise InvalidRequest("messages must contain at least one message", "messages")
        if len(self.messages) > MAX_MESSAGES:
            raise InvalidRequest(f"at most {MAX_MESSAGES} messages are allowed ({len(self.messages)} sent)",
                                 "messages")  # fmt: skip
        for i, m in enumerate(self.messages):
            if m.role not in ROLES:
                raise InvalidRequest(f"messages[{i}].role {m.role!r} is not one of {', '.join(ROLES)}", "messages")
            if not isinstance(m.content, str):
                raise InvalidRequest(f"messages[{i}].content must be text", "messages")
            _check_text(m.content, f"messages[{i}].content", "messages")
            for call in m.calls:
                if m.role != "assistant" or not isinstance(call, PastCall):
                    raise InvalidRequest(f"messages[{i}]: only an assistant's turn has calls", "messages")
                _check_text(call.name, f"messages[{i}] call name", "messages")
                _check_text(call.arguments, f"messages[{i}] call arguments", "messages")
            for result, _ in m.results:
                if m.role != "user":
                    raise InvalidRequest(f"messages[{i}]: only a user's turn has tool results", "messages")
                _check_text(result, f"messages[{i}] tool result", "messages")
        if self.system is not None:
            _check_text(self.system, "system", "system")
        if len(self.template_variables) > MAX_TEMPLATE_VARIABLES:
            raise InvalidRequest(f"chat_template_kwargs: at most {MAX_TEMPLATE_VARIABLES} variables",
                                 "chat_template_kwargs")  # fmt: skip
        for name, _ in self.template_variables:
            if not isinstance(name, str) or not name.isidentifier() or name in RESERVED_TEMPLATE_VARIABLES:
                raise InvalidRequest(f"chat_template_kwargs: {name!r} is not a variable a client may set (a name, "
                                     f"not one of {', '.join(sorted(RESERVED_TEMPLATE_VARIABLES))})",
                                     "chat_template_kwargs")  # fmt: skip
        least = 0 if self.prompt_logprobs is not None else 1  # a scored prompt may be all there is to it
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < least:
            raise InvalidRequest(f"max_tokens must be an integer of at least {least}", "max_tokens")
        if self.temperature is not None:
            _check_number(self.temperature, "temperature", 0.0, 2.0)
        if self.top_p is not None:
            _check_number(self.top_p, "top_p", 0.0, 1.0)
            if self.top_p == 0.0:
                raise InvalidRequest("top_p must be greater than 0", "top_p")
        top_k = self.top_k
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
            raise InvalidRequest("top_k must be a non-negative integer (0 disables it)", "top_k")
        _check_number(self.min_p, "min_p", 0.0, 1.0)
        _check_number(self.frequency_penalty, "frequency_penalty", -2.0, 2.0)
        _check_number(self.presence_penalty, "presence_penalty", -2.0, 2.0)
        _check_number(self.repetition_penalty, "repetition_penalty", 0.01, 10.0)
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise InvalidRequest("min_tokens must be a non-negative integer", "min_tokens")
        if self.min_tokens > self.max_tokens:
            raise InvalidRequest(f"min_tokens ({self.min_tokens}) must not be more than max_tokens "
                                 f"({self.max_tokens})", "min_tokens")  # fmt: skip
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise InvalidRequest(f"logit_bias: at most {MAX_LOGIT_BIAS} tokens may be biased", "logit_bias")
        for token, bias in self.logit_bias:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise InvalidRequest(f"logit_bias: {token!r} is not a token id", "logit_bias")
            _check_number(bias, "logit_bias", -LOGIT_BIAS, LOGIT_BIAS)
        for lp, param in ((self.logprobs, "top_logprobs"), (self.prompt_logprobs, "logprobs")):
            if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= MAX_TOP_LOGPROBS):
                raise InvalidRequest(f"{param} must be an integer from 0 to {MAX_TOP_LOGPROBS}", param)
        if self.prompt_logprobs is not None and self.raw_prompt is None:
            raise InvalidRequest("a prompt's log probabilities are for a plain completion's prompt", "logprobs")
        budget = self.thinking_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 2):
            raise InvalidRequest("thinking_budget must be an integer of at least 2 (the thought's tags)",
                                 "thinking_budget")  # fmt: skip
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidRequest("seed must be an integer", "seed")
        if len(self.stop_sequences) > MAX_STOP_SEQUENCES:
            raise InvalidRequest(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed", "stop_sequences")
        for s in self.stop_sequences:
            if not isinstance(s, str) or not s or len(s) > MAX_STOP_SEQUENCE_CHARS:
                raise InvalidRequest(
                    f"each stop sequence must be a non-empty string of at most {MAX_STOP_SEQUENCE_CHARS} characters",
                    "stop_sequences",
                )
            _check_text(s, "stop_sequences", "stop_sequences")


def _check_text(text: str, where: str, param: str) -> None:
    """Text the tokenizer can take: valid Unicode (JSON's \\ud800 escapes can make lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{where}: character {exc.start} is a lone surrogate (U+{ord(text[exc.start]):04X}), "
                             "not a Unicode character", param) from None


def _check_number(value: object, name: str, lo: float, hi: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a number", name)
    if not lo <= value <= hi:
        raise InvalidRequest(f"{name} must be between {lo} and {hi}", name)


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ThoughtDelta:
    """Text of a reasoning model's thought, before its answer (reasoning.py)."""

    text: str


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability under the model (before sampling settings), and the
    most likely alternatives at that step, most likely first."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class PromptLogprobs:
    """Each prompt token's log probability given the tokens before it, with the most likely
    alternatives there (GenerationRequest.prompt_logprobs); the first token has none. Sent once,
    before Prefilled."""

    first: str  # the first token's text
    tokens: tuple[TokenLogprob, ...]  # the others, in order


@dataclass(frozen=True)
class Prefilled:
    """Sent once the prompt is in the KV cache, before the first delta: what the engine decided."""

    trace: Trace


@dataclass(frozen=True)
class Finished:
    stop_reason: str  # "end_turn" | "tool_use" | "max_tokens" | "stop_sequence" | "cancelled"
    stop_sequence: str | None
    input_tokens: int
    output_tokens: int
    trace: Trace
    thought_tokens: int = 0  # of output_tokens, those of the thought (its tags included)


# CallStart and CallArguments (appliance/engine/tools.py): a tool call as it is generated.
Event = TextDelta | ThoughtDelta | CallStart | CallArguments | TokenLogprob | PromptLogprobs | Prefilled | Finished
