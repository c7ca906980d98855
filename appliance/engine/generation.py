"""One request's generation: its prompt, sampler, stop sequences and KV row. The worker starts it
in a slot, runs its prompt chunks with prefill() and feeds it its row of each batched decode step
with decoded(); each returns the events produced. It never blocks on I/O."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from appliance.engine.chat import Prompt
from appliance.engine.constraint import Constraint
from appliance.engine.prefix_cache import DIGESTS_PER_FLOW, PrefixCache, block_digests
from appliance.engine.reasoning import Calls, Kind, MarkerSplit, NoThought, ThoughtSplit
from appliance.engine.request import (
    Event,
    Finished,
    GenerationRequest,
    Prefilled,
    PromptLogprobs,
    TextDelta,
    ThoughtDelta,
    TokenLogprob,
)
from appliance.engine.sampling import Sampler, penalize
from appliance.engine.session import KVCache, ModelSession
from appliance.engine.shards import plan_shards
from appliance.engine.stops import StopMatcher
from appliance.engine.tokenizer import StreamDecoder, TextTokenizer
from appliance.engine.tools import RepeatGuard, TextPart, call_parser
from appliance.engine.trace import Trace

# A hybrid model's row is kept at its messages' end only where that many pool blocks are not
# reused yet: a cut costs the prefill one more run (about a decode step), a few blocks saved repay it.
HISTORY_SNAPSHOT_MIN_BLOCKS = 4
# A prompt's scoring holds at most this much of every position's logits (float32) at a time: its
# ranges run through the model in pieces of as many positions (on a vocabulary of 150k, 55).
SCORE_LOGITS_BYTES = 32 << 20


@dataclass(frozen=True)
class ShardPolicy:
    max_tokens_per_shard: int
    split_algorithm: str


class Generation:
    def __init__(
        self,
        request: GenerationRequest,
        prompt: Prompt,
        session: ModelSession,
        tokenizer: TextTokenizer,
        prefix_cache: PrefixCache | None,
        shard_policy: ShardPolicy,
        trace: Trace,
    ) -> None:
        self.request = request
        # OpenAI's logit_bias, added to the model's logits before penalties, grammar and sampling.
        self.bias_ids = np.array([t for t, _ in request.logit_bias], dtype=np.int64)
        self.biases = np.array([b for _, b in request.logit_bias], dtype=np.float32)
        self.prompt = prompt
        self.session = session
        self.prefix_cache = prefix_cache
        self.shard_policy = shard_policy
        self.trace = trace
        self.eos = set(session.facts.eos_token_ids)
        self.eos_ids = np.fromiter(self.eos, dtype=np.int64)
        facts = session.facts
        self.sampler = Sampler(
            facts.default_temperature if request.temperature is None else request.temperature,
            facts.default_top_k if request.top_k is None else request.top_k,
            facts.default_top_p if request.top_p is None else request.top_p,
            request.seed,
            request.min_p,
        )
        self.answer_constraint = prompt.constraint  # the output grammar, if the request has one
        # Where a call is a message of its own (harmony's), its grammar, and the parser reads only it.
        self.call_constraint = prompt.call_constraint
        # Tool calls are parsed out of the output only where the grammar lets the model write them.
        rules = request.output
        calls_only = rules.choice.mode in ("required", "tool")
        own_message = self.call_constraint is not None
        self.calls = (call_parser(prompt.call_format, calls_only or own_message, rules.tools)
                      if rules.calls_allowed else None)  # fmt: skip
        self.marker_id = prompt.call_format.marker_id  # the token calls begin with, where the format has one
        self.repeats = RepeatGuard()
        self.tokenizer = tokenizer
        # (A format that reads special tokens in the answer's text, Gemma 4's, has them kept there.)
        self.decoder = StreamDecoder(tokenizer, prompt.call_format.kept if self.calls is not None else None)
        fmt = prompt.thought_format
        calls: Calls = "none" if not own_message else "required" if calls_only else "auto"
        # Thinking switched off where the template opens a thought all the same (DeepSeek-R1's
        # distills', Apriel's): the thought is closed at once.
        budget = 0 if request.thinking is False else request.thinking_budget
        self.thought: ThoughtSplit = NoThought() if fmt is None else fmt.split(prompt.ids, budget, calls)
        # A thought written as text ends at its marker: its text is held back while it could still become it.
        # (on a line of its own, the line break is the marker's too)
        marker = self.thought.fmt if isinstance(self.thought, MarkerSplit) else None
        self.marker = StopMatcher(("\n" + marker.marker, marker.marker)) if marker is not None else None
        # What the template asks the model to end its answer with ends the turn, shown nowhere.
        self.answer_end = marker.answer_end if marker is not None else ""
        self.stops = StopMatcher((*request.stop_sequences, *((self.answer_end,) if self.answer_end else ())))
        self._after_marker = ""  # what the token that ended the marker wrote after it: the answer's
        self.cache: KVCache | None = None
        self.generated: list[int] = []
        self.next_token: int | None = None
        self._answer_begun = False
        self.done = False
        self.resuming = False  # moved to another device mid-request: rebuild KV, then keep decoding
        self.snapshot_at: int | None = None  # a hybrid model's row goes to the pool when prefilled this far
        self._prefill_started = 0.0
        self._prompt_scores: list[TokenLogprob] = []  # the prompt's, as its ranges run (prompt_logprobs)
        self._pieces: dict[int, str] = {}  # token texts the log probabilities named so far
        block = prefix_cache.block_tokens if prefix_cache is not None else 0
        self.digests = block_digests(prompt.ids, block) if block else []
        trace.digests = self.digests[-DIGESTS_PER_FLOW:]

    @property
    def constraint(self) -> Constraint | None:
        """The grammar that holds the next answer token: a call's in a call's own message, else the answer's."""
        return self.call_constraint if self.thought.calling else self.answer_constraint

    @property
    def kv_tokens(self) -> int:
        """KV positions this request may fill: the prompt and every token it may generate."""
        return len(self.prompt.ids) + self.request.max_tokens

    @property
    def scoring(self) -> bool:
        """Its prompt's log probabilities are still to compute: every position runs through the
        LM head, none is reused from the pool, and none runs on the prefill lane."""
        return self.request.prompt_logprobs is not None and not self.resuming

    def migrate(self, session: ModelSession, why: str) -> None:
        """Continue on another session: its KV cache is rebuilt from the prompt and the tokens
        already produced, and decoding goes on from there, so the stream has no gap or repeat."""
        self.session = session
        self.cache = None
        self.resuming = bool(self.generated)
        self.trace.notes.append(f"Fallback: {why}; re-run on {session.device} from {len(self.prompt.ids)} prompt "
                                f"tokens and {len(self.generated)} sent")  # fmt: skip
        self.trace.device = f"{self.trace.device}->{session.device}"

    def _ids(self) -> list[int]:
        # On a resume, everything whose KV was computed: the prompt and all but the last token sent.
        return self.prompt.ids + self.generated[:-1] if self.resuming else self.prompt.ids

    def start(self, cache: KVCache) -> list[tuple[int, int]]:
        """Take a slot's KV row: import what the prefix pool has, return the prompt ranges left to
        prefill (the shard plan over what was not reused)."""
        ids = self._ids()
        self.cache = cache
        self._prefill_started = time.perf_counter()
        reused = 0
        prior = self.request.prior_digests
        if prior and not self.resuming:
            chain = set(self.digests)
            self.trace.prior_digests_total = len(prior)
            self.trace.prior_digests_found = sum(1 for d in prior if d in chain)
        self._prompt_scores.clear()
        if self.prefix_cache is not None and not self.scoring:
            # Tokens must run to produce logits, so never reuse the whole prompt; and two at least,
            # since a lone token's logits differ from a prompt's (scheduler.MIN_CHUNK_TOKENS).
            block = self.prefix_cache.block_tokens
            digests = block_digests(ids, block) if self.resuming else self.digests
            if self.session.states:  # a hybrid model's entry is reused whole, with its states
                hit = self.prefix_cache.lookup_with_states(digests, ids, len(ids) - 2)
            else:
                hit = self.prefix_cache.lookup(digests, max(0, len(ids) - 2) // block)
            if hit is not None:
                self.session.import_prefix(cache, hit.segments, hit.tokens, hit.states)
                reused = hit.tokens
        self.trace.reused_tokens = reused
        # A hybrid model's row is kept whole with its states, so it is also kept where the messages
        # end: the conversation's next turn begins with them (a prompt's end, with the generation
        # prompt's tokens, may not be). That costs the prefill a cut, paid where it saves a turn more.
        cut = self.prompt.history_end
        if (self.session.states and self.prefix_cache is not None and not self.resuming and cut is not None
                and reused + HISTORY_SNAPSHOT_MIN_BLOCKS * self.prefix_cache.block_tokens <= cut <= len(ids) - 2):
            self.snapshot_at = cut
        bounds = [reused, len(ids)] if self.snapshot_at is None else [reused, self.snapshot_at, len(ids)]
        policy = self.shard_policy
        plans = [plan_shards(a, b, policy.max_tokens_per_shard, policy.split_algorithm, self.prompt.message_starts)
                 for a, b in itertools.pairwise(bounds)]  # fmt: skip
        shards = [s for plan in plans for s in plan.shards]
        self.trace.shards = len(shards)
        self.trace.shard_size = self.shard_policy.max_tokens_per_shard
        self.trace.shard_reason = plans[0].reason
        return shards

    @property
    def prompt_end(self) -> int:
        """Positions to prefill in all (on a resume, the prompt and the answer but its last token)."""
        return len(self._ids())

    def prompt_ids(self, start: int, end: int) -> np.ndarray:
        """The tokens of prompt positions [start, end) (on a resume, of the prompt and the answer)."""
        return np.asarray(self._ids()[start:end], dtype=np.int64)

    def prefill(self, start: int, end: int) -> list[Event]:
        """Run prompt positions [start, end) into the KV row; after the last, choose the first token."""
        assert self.cache is not None and self.cache.length == start
        if self.scoring:
            logits = self._score(start, end)
        else:
            logits = self.session.forward(self.cache, self.prompt_ids(start, end))
        if end == self.snapshot_at:
            self._remember_prefix()
        return self.prefilled(end, logits)

    def _score(self, start: int, end: int) -> np.ndarray:
        """Run prompt positions [start, end) with every position's logits, in pieces of a bounded
        size (never a lone token last: its run takes another path); keep the log probability of
        the token each position is followed by. Returns the last position's logits."""
        assert self.cache is not None and self.request.prompt_logprobs is not None
        ids = self.prompt.ids
        step = max(2, SCORE_LOGITS_BYTES // (4 * self.session.facts.vocab_size))
        a = start
        while a < end:
            b = end if end - (a + step) < 2 else a + step
            logits = self.session.forward_every(self.cache, self.prompt_ids(a, b))
            following = ids[a + 1 : b + 1]  # (the prompt's last position is followed by the answer)
            self._prompt_scores.extend(self._logprobs(logits[: len(following)], following,
                                                      self.request.prompt_logprobs))  # fmt: skip
            a = b
        return np.array(logits[-1])

    def prefilled(self, end: int, logits: np.ndarray, remembered: bool = False) -> list[Event]:
        """The KV row holds the prompt up to `end` (run here, or on the prefill lane), `logits` those
        of its last position; after the whole prompt, choose the first token. `remembered`: the
        prompt is in the prefix pool already (the lane put it there)."""
        if end < self.prompt_end:
            return []
        if self.resuming:  # the next token is already chosen (and sent): decode it next
            self.resuming = False
            return []
        self.trace.prefill_ms = (time.perf_counter() - self._prefill_started) * 1000
        # Offered now, not only at the end: a request with the same prefix (the same system prompt
        # and tools, another sample of this prompt) that arrives while this one decodes reuses it.
        if not remembered and self.snapshot_at is None:  # (a hybrid's row is kept at its messages' end)
            self._remember_prefix()
        events: list[Event] = [Prefilled(self.trace)]
        if self.request.prompt_logprobs is not None:
            events.insert(0, PromptLogprobs(self._piece(self.prompt.ids[0]), tuple(self._prompt_scores)))
            self._prompt_scores = []
            if self.request.max_tokens == 0:  # the prompt's scores were all it asked for
                self.done = True
                return [*events, self._finished("max_tokens", None)]
        events.extend(self._step(logits))
        return events

    @property
    def decode_input(self) -> int:
        """The token the next decode step feeds (the last one chosen)."""
        assert self.next_token is not None
        return self.next_token

    def decoded(self, logits: np.ndarray, step_ms: float) -> list[Event]:
        """One decode step ran for this request (its row of a batch): advance and choose."""
        assert self.cache is not None
        self.cache.length += 1
        self.trace.record_token(step_ms)
        return self._step(logits)

    def _choose(self, logits: np.ndarray) -> int:
        """The next token: the request's biases and penalties, then the grammar's mask, then the sampler."""
        forced = self.thought.forced()
        if forced is not None:
            return forced
        req = self.request
        no_end = req.ignore_eos or len(self.generated) < req.min_tokens
        if self.bias_ids.size or no_end:
            logits = logits.copy()  # (the model's own stay as they were, for the log probabilities)
            np.add.at(logits, self.bias_ids, self.biases)
            if no_end:
                logits[self.eos_ids] = -np.inf
        if req.frequency_penalty or req.presence_penalty or req.repetition_penalty != 1.0:
            logits = penalize(logits, self.generated, self.prompt.ids, req.frequency_penalty, req.presence_penalty,
                              req.repetition_penalty)  # fmt: skip
        if self.answer_constraint is None and self.call_constraint is None:
            return self.sampler(logits)
        gate = self.thought.gate()
        if gate.free:  # a thought under a grammar: the answer the grammar holds must still come
            free = logits.copy()
            free[self.eos_ids] = -np.inf
            return self.sampler(free)
        constraint = self.constraint if gate.grammar else None
        if constraint is not None:
            allowed = constraint.apply(logits)
        else:  # a header's tokens; or a text answer no grammar holds, beside calls that one does
            allowed = logits.copy() if gate.grammar else np.full_like(logits, -np.inf)
        if gate.also:
            also = np.fromiter(gate.also, dtype=np.int64)
            allowed[also] = logits[also]
        token = self.sampler(allowed)
        if constraint is not None and token not in gate.also:
            constraint.accept(token)
        return token

    def _logprobs(self, logits: np.ndarray, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
        """Row i's log probability of tokens[i] and its `top` most likely tokens, most likely first:
        the model's own (before penalties, grammar and temperature)."""
        peak = logits.max(axis=1, keepdims=True)
        logz = peak[:, 0] + np.log(np.exp(logits - peak).sum(axis=1, dtype=np.float64))
        rows = np.arange(len(tokens))
        own = logits[rows, np.asarray(tokens, dtype=np.int64)] - logz
        best = np.argpartition(-logits, top, axis=1)[:, :top] if top else np.zeros((len(tokens), 0), dtype=np.int64)
        best = np.take_along_axis(best, np.argsort(-np.take_along_axis(logits, best, 1), axis=1, kind="stable"), 1)
        alternatives = np.take_along_axis(logits, best, 1) - logz[:, None]
        piece = self._piece
        return [TokenLogprob(piece(int(t)), float(own[i]),
                             tuple((piece(int(j)), float(lp)) for j, lp in zip(best[i], alternatives[i], strict=True)))
                for i, t in enumerate(tokens)]  # fmt: skip

    def _piece(self, token: int) -> str:
        piece = self._pieces.get(token)
        if piece is None:
            if len(self._pieces) >= 4096:  # (a long prompt's alternatives: bounded)
                self._pieces.clear()
            piece = self._pieces[token] = self.tokenizer.decode([token])
        return piece

    def _step(self, logits: np.ndarray) -> list[Event]:
        """Choose the next token from these logits and take it: its log probability (when asked
        for), then the text or call it makes, or the end."""
        token = self._choose(logits)
        if token in self.eos:
            return self._finish("end_turn", None, self.decoder.flush())
        was_thinking = self.thought.thinking
        kind = self.thought.take(token)
        top = self.request.logprobs
        events: list[Event] = [] if top is None or kind != "answer" else [*self._logprobs(logits[None], [token], top)]
        return events + self._advance(token, kind, was_thinking)

    def _advance(self, token: int, kind: Kind, was_thinking: bool = False) -> list[Event]:
        self.generated.append(token)
        self.next_token = token
        if kind != "answer":
            events = self._thought(token, kind, was_thinking)
            if len(self.generated) >= self.request.max_tokens:  # what the decoder holds goes where it belongs
                return events + self._finish("max_tokens", None, self.decoder.flush())
            return events
        if self.calls is not None and token == self.marker_id:
            self.calls.mark()  # the token that calls begin with (decoding drops it)
        text, matched = self.stops.push(self._answer_text(self.decoder.push(token)))
        if matched is not None:
            return self._finish(*self._stopped(matched), text, flush=False)
        constraint = self.constraint
        if constraint is not None and constraint.finished:  # only the end can follow: save a step
            return self._finish("end_turn", None, text + self.decoder.flush())
        if len(self.generated) >= self.request.max_tokens:
            return self._finish("max_tokens", None, text + self.decoder.flush())
        events = self._parts(text)
        if self.repeats.repeated:  # the model wrote a call of this turn again: the turn's calls are all here
            return events + self._finish("end_turn", None, "", flush=False)
        return events

    def _thought(self, token: int, kind: Kind, was_thinking: bool) -> list[Event]:
        """A thought's token: its text; or a tag, which is not shown. A tag after a thought ends
        what the decoder held of it; after answer text, what is held waits for the answer's next token."""
        if kind == "thought":
            text = self.decoder.push(token)
            if self.marker is not None:
                text, matched = self.marker.push(text)
                if matched is not None and isinstance(self.thought, MarkerSplit):
                    self.thought.end()
                    self._after_marker = self.marker.rest
            return [ThoughtDelta(text)] if text else []
        held = self.decoder.flush() if was_thinking else ""
        return [ThoughtDelta(held)] if held else []

    def _answer_text(self, text: str) -> str:
        """The answer's text; the blank lines a model writes after its close tag are the tag's, not the answer's."""
        text, self._after_marker = self._after_marker + text, ""
        if self.thought.answered and not self._answer_begun:
            text = text.lstrip()
            self._answer_begun = bool(text)
        return text

    def _parts(self, text: str, last: bool = False) -> list[Event]:
        """Output text as events: text deltas, or tool calls where the request allows them."""
        if self.calls is None or (self.call_constraint is not None and not self.thought.calling):
            return [TextDelta(text)] if text else []
        parts = self.calls.push(text) + (self.calls.flush() if last else [])
        parts = self.repeats.admit(parts, self.calls.complete) + (self.repeats.rest() if last else [])
        return [TextDelta(p.text) if isinstance(p, TextPart) else p for p in parts]

    def _stopped(self, matched: str) -> tuple[str, str | None]:
        """Why the answer stopped at `matched`: a stop sequence of the request's, or the end it was asked for."""
        return ("end_turn", None) if matched == self.answer_end else ("stop_sequence", matched)

    def _finish(self, reason: str, stop: str | None, text: str, flush: bool = True) -> list[Event]:
        events: list[Event] = []
        if self.thought.thinking:  # it ended mid-thought: what was held is the thought's
            if self.marker is not None:
                text = self.marker.push(text)[0] + self.marker.flush()
            if text:
                events.append(ThoughtDelta(text))
            text = ""
        else:
            text = self._answer_text(text)
        if flush:
            text, matched = self.stops.push(text)
            if matched is not None:
                reason, stop = self._stopped(matched)
            else:
                text += self.stops.flush()
        events.extend(self._parts(text, last=True))
        if reason == "max_tokens" and self.repeats.repeated:  # what max_tokens cut off was a repeat, dropped
            reason = "end_turn"
        if reason == "end_turn" and self.calls is not None and self.calls.complete:
            reason = "tool_use"
        self.done = True
        self._remember_prefix()
        events.append(self._finished(reason, stop))
        return events

    def cancel(self) -> Finished:
        self.done = True
        self._remember_prefix()
        return self._finished("cancelled", None)

    def _finished(self, reason: str, stop: str | None) -> Finished:
        self.release()
        return Finished(reason, stop, len(self.prompt.ids), len(self.generated), self.trace, self.thought.tokens)

    def remember_prompt(self, cache: KVCache) -> None:
        """Offer the pool the whole prompt from `cache`, a row holding it (the lane's, on its own
        thread: the pool copies under its own lock, and nothing else touches this request meanwhile)."""
        if not self.resuming:
            self._remember_prefix(cache)

    def _remember_prefix(self, cache: KVCache | None = None) -> None:
        """Offer the pool every full block whose KV was computed: prompt and answer so far (from
        `cache`, by default its own row). A hybrid model's row is offered whole, with its states:
        they hold exactly the positions computed."""
        cache = cache or self.cache
        if self.prefix_cache is None or cache is None:
            return
        tokens = (self.prompt.ids + self.generated)[: cache.length]
        block = self.prefix_cache.block_tokens
        digests = block_digests(tokens, block)
        if digests:
            row, session = cache, self.session
            states = cache.slots.read_states(cache.row) if session.states else None
            self.prefix_cache.store(digests, lambda start, end: session.export_span(row, start, end),
                                    tokens[len(digests) * block :], states)  # fmt: skip

    def release(self) -> None:
        self.cache = None

    def abort(self) -> None:
        """A run failed: nothing more happens for this request here."""
        self.release()
        self.done = True
