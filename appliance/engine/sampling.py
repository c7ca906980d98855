"""Choosing the next token from logits: greedy, or temperature with top-k and top-p."""

from __future__ import annotations

import numpy as np


class Sampler:
    """Seeded per request, so the same seed gives the same output."""

    def __init__(self, temperature: float, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 min_p: float = 0.0) -> None:  # fmt: skip
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.min_p = min_p
        self.seed = seed
        self._rng: np.random.Generator | None = None  # made on first use: greedy requests never need it

    @property
    def rng(self) -> np.random.Generator:
        if self._rng is None:  # seeding from OS entropy costs tens of µs on every request otherwise
            # numpy takes no negative seed; clients send them (OpenAI's seed is any int64)
            seed = self.seed % 2**64 if self.seed is not None and self.seed < 0 else self.seed
            self._rng = np.random.default_rng(seed)
        return self._rng

    @property
    def greedy(self) -> bool:
        return self.temperature <= 1e-5 or self.top_k == 1

    def __call__(self, logits: np.ndarray) -> int:
        if self.greedy:
            return int(np.argmax(logits))
        x = logits.astype(np.float64) / self.temperature
        if 0 < self.top_k < x.shape[0]:
            candidates = np.argpartition(x, -self.top_k)[-self.top_k :]
        else:
            candidates = np.arange(x.shape[0])
        scores = x[candidates]
        order = np.argsort(-scores, kind="stable")
        candidates, scores = candidates[order], scores[order]
        probs = np.exp(scores - scores[0])
        if self.min_p > 0.0:  # probs[0] is the most likely token's, scaled to 1
            keep = max(1, int(np.count_nonzero(probs >= self.min_p)))
            candidates, probs = candidates[:keep], probs[:keep]
        probs /= probs.sum()
        if self.top_p < 1.0:
            # Keep the smallest head of the distribution whose mass reaches top_p (at least one token).
            keep = int(np.searchsorted(np.cumsum(probs), self.top_p)) + 1
            candidates, probs = candidates[:keep], probs[:keep] / probs[:keep].sum()
        return int(candidates[self.rng.choice(len(candidates), p=probs)])


def penalize(logits: np.ndarray, generated: list[int], prompt: list[int], frequency: float, presence: float,
             repetition: float) -> np.ndarray:
    """OpenAI's frequency and presence penalties over the tokens generated so far, and the
    multiplicative repetition penalty over prompt and answer (as Hugging Face and llama.cpp apply it)."""
    out = logits.astype(np.float32, copy=True)
    if (frequency or presence) and generated:
        ids, counts = np.unique(np.asarray(generated, dtype=np.int64), return_counts=True)
        out[ids] -= frequency * counts + presence
    if repetition != 1.0:
        seen = np.unique(np.asarray(prompt + generated, dtype=np.int64))
        scores = out[seen]
        out[seen] = np.where(scores > 0, scores / repetition, scores * repetition)
    return out
