"""The fidelity measures of bench/quantization.py on the tiny model, so the benchmark cannot rot:
a model against its own logits is identical by every measure, and against another's it is not."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import firmware
from bench.quantization import fidelity, log_probs, next_token_loss


def test_a_model_matches_its_own_logits_and_not_anothers(tiny_bundle_path: Path, trusted_keys: Path) -> None:
    bundle = firmware.load(tiny_bundle_path, trusted_keys)
    ids = np.random.default_rng(0).integers(0, bundle.model.vocab_size, size=64).astype(np.int64)
    own = log_probs(bundle, ids)
    assert np.allclose(np.exp(own).sum(-1), 1.0)
    kl, agree, loss = fidelity(bundle, ids, own)
    assert abs(kl) < 1e-9 and agree == 1.0 and loss == next_token_loss(own, ids)
    shifted = np.roll(own, 1, axis=-1)  # every distribution moved one token over
    kl, agree, _ = fidelity(bundle, ids, shifted)
    assert kl > 0.1 and agree < 0.2
