"""Choosing the next token from logits: greedy, or temperature with top-k and top-p."""

from __future__ import annotations

import numpy as np


class Sampler:
    """Seeded per request, so the same seed gives the same output."""

    def __init__(self, temperature: float, top_k: int = 0, top_p: float = 1.0, seed: int | None = None) -> None:
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.seed = seed
        self._rng: np.random.Generator | None = None  # made on first use: greedy requests never need it

    @property
    def rng(self) -> np.random.Generator:
        if self._rng is None:  # seeding from OS entropy costs tens of µs on every request otherwise
            self._rng = np.random.default_rng(self.seed)
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
        probs /= probs.sum()
        if self.top_p < 1.0:
            # Keep the smallest head of the distribution whose mass reaches top_p (at least one token).
            keep = int(np.searchsorted(np.cumsum(probs), self.top_p)) + 1
            candidates, probs = candidates[:keep], probs[:keep] / probs[:keep].sum()
        return int(candidates[self.rng.choice(len(candidates), p=probs)])
