"""What the int8 block size costs and buys on the demo model: fidelity against the fp32 export of
the same GGUF, and decode speed at 1 and 8 batched rows.

Each block size is a firmware built from the demo's GGUF (cached like the demo); the fp32 export is
the reference. Fidelity is measured over a fixed text (the first tokens of Python's own pydoc
topics, the same on every machine with this Python): the mean KL divergence of each position's
next-token distribution from fp32's, how often both pick the same top token, and the next-token
loss on the text itself. Speed is one decode run of 1 and of 8 rows through ModelSession.decode,
the sizes interleaved in alternating order, median of the repetitions. The README's block-size
table comes from here; the demo firmware's choice (firmware/toolchain/demo.py) is explained by it.

    .venv/bin/python -m bench.quantization    # about 5 minutes the first time (4 builds), then 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from appliance.engine.session import ModelSession
from appliance.engine.tokenizer import TextTokenizer
from bench.host import load_average, machine
from firmware import Bundle, load
from firmware.toolchain.build import DEFAULT_BLOCK_SIZE, BuildOptions, build
from firmware.toolchain.demo import DEMO_BLOCK_SIZE, DEMO_NAME, demo_bundle, demo_gguf
from firmware.toolchain.devkit import dev_trusted_keys, ensure_bundle

BLOCKS = (32, 64, 128)
TEXT_TOKENS = 1200
RESULTS = Path(__file__).resolve().parent / "results" / "quantization.md"


def firmware(precision: str, block_size: int = 32) -> Bundle:
    """The demo GGUF built at this precision and block size, cached (the demo firmware itself for its own)."""
    if precision == "int8" and block_size == DEMO_BLOCK_SIZE:
        return load(demo_bundle(), dev_trusted_keys())
    tag = f"int8-b{block_size}" if precision == "int8" else precision
    name = f"{DEMO_NAME}-{tag}"

    def make(out: Path) -> None:
        build(demo_gguf(), out, BuildOptions(precision=precision, target="cpu", name=name, block_size=block_size))

    return load(ensure_bundle(name, make), dev_trusted_keys())


def reference_text_ids(bundle: Bundle, tokens: int) -> np.ndarray:
    import pydoc_data.topics

    text = "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    tokenizer = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    return np.array(tokenizer.encode(text[: tokens * 8])[0][:tokens], dtype=np.int64)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def log_probs(bundle: Bundle, ids: np.ndarray) -> np.ndarray:
    """The model's next-token log-probabilities at every position of a fresh prompt of ids."""
    return log_softmax(ModelSession(bundle, "cpu", last_position_logits=False).all_logits(ids))


def fidelity(bundle: Bundle, ids: np.ndarray, reference: np.ndarray) -> tuple[float, float, float]:
    """(mean KL from the reference, top-1 agreement, next-token loss) over every position of ids."""
    ours = log_probs(bundle, ids)
    kl = float((np.exp(reference) * (reference - ours)).sum(-1).mean())
    agree = float((ours.argmax(-1) == reference.argmax(-1)).mean())
    return kl, agree, next_token_loss(ours, ids)


def next_token_loss(logprobs: np.ndarray, ids: np.ndarray) -> float:
    return float(-logprobs[np.arange(len(ids) - 1), ids[1:]].mean())


def decode_ms(bundles: dict[int, Bundle], reps: int) -> dict[int, tuple[float, float]]:
    """Median ms of one decode run of 1 and of 8 rows (rows after 55-90 prompt tokens), per block size."""
    rng = np.random.default_rng(0)
    lengths = np.array([60, 80, 70, 90, 55, 65, 75, 85])
    sessions = {b: ModelSession(bundle, "cpu") for b, bundle in bundles.items()}
    slots = {}
    for b, session in sessions.items():
        slots[b] = session.new_slots(8, 512)
        for row, n in enumerate(lengths):
            session.forward(slots[b].row(row), rng.integers(100, 20000, size=int(n)))
    times: dict[tuple[int, int], list[float]] = {(b, rows): [] for b in bundles for rows in (1, 8)}
    for rep in range(reps):
        for b in BLOCKS if rep % 2 == 0 else BLOCKS[::-1]:
            for rows in (1, 8):
                tokens = np.full(rows, 5, dtype=np.int64)
                sessions[b].decode(slots[b], tokens, lengths[:rows])  # warm this shape
                runs = []
                for step in range(20):
                    start = time.perf_counter()
                    sessions[b].decode(slots[b], tokens, lengths[:rows] + step)
                    runs.append(time.perf_counter() - start)
                times[(b, rows)].append(statistics.median(runs) * 1000)
    return {b: (statistics.median(times[(b, 1)]), statistics.median(times[(b, 8)])) for b in bundles}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions of the speed runs")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    start_load = load_average()
    reference_bundle = firmware("fp32")
    bundles = {b: firmware("int8", b) for b in BLOCKS}
    ids = reference_text_ids(reference_bundle, TEXT_TOKENS)
    reference = log_probs(reference_bundle, ids)
    reference_loss = next_token_loss(reference, ids)
    quality = {b: fidelity(bundle, ids, reference) for b, bundle in bundles.items()}
    speed = decode_ms(bundles, args.reps)
    one, eight = speed[DEFAULT_BLOCK_SIZE]  # the builder's default is what the others are compared with
    lines = ["| block | mean KL vs fp32 | same top token | next-token loss | decode, 1 row | decode, 8 rows | "
             "8 rows / 1 row, tokens/s |", "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for b in BLOCKS:
        kl, agree, loss = quality[b]
        ms1, ms8 = speed[b]
        of = f"x of {DEFAULT_BLOCK_SIZE}"
        lines.append(f"| {b} | {kl:.4f} | {agree:.1%} | {loss:.3f} | {ms1:.2f} ms ({one / ms1:.2f}{of}) | "
                     f"{ms8:.2f} ms ({eight / ms8:.2f}{of}) | {8 * ms1 / ms8:.2f}x |")  # fmt: skip
    table = "\n".join(lines)
    print(table)
    args.out.write_text(f"""# int8 block size on the demo model

The demo GGUF ({demo_gguf().name}) built int8 for the CPU in blocks of {", ".join(map(str, BLOCKS))}
weights, against its fp32 export over the first {len(ids)} tokens of Python's pydoc topics (fp32's
next-token loss: {reference_loss:.3f}); decode runs through ModelSession.decode, {os.cpu_count()} threads, the
sizes interleaved, median of {args.reps}. The demo firmware uses 64.

- machine: {machine()}
- load average (1, 5, 15 min): {start_load} at the start, {load_average()} at the end

{table}

Reproduce: `.venv/bin/python -m bench.quantization`
""")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
