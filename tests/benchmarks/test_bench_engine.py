"""bench/engine.py's comparison with og.Generator on the tiny model, so the two-process pairing
behind the README's decode row cannot rot: both orders run, their pairs are pooled, and the two
sides' greedy answers are compared."""

from __future__ import annotations

from pathlib import Path

import firmware
from bench.engine import Report, Sizes, versus_og


def test_each_side_is_made_first_in_a_process_of_its_own_and_the_pairs_pooled(
    tiny_bundle_path: Path, trusted_keys: Path
) -> None:
    report = Report([], [], [])
    sizes = Sizes(prefill=(16,), decode_prompt=8, decode_steps=4)
    versus_og(firmware.load(tiny_bundle_path, trusted_keys), sizes, reps=3, threads=1, report=report)
    assert [r.what for r in report.rows] == ["prefill, 16-token prompt: ours / og.Generator",
                                             "decode, 4 new tokens after 8: ours / og.Generator"]  # fmt: skip
    assert all(r.ours > 0 and r.base > 0 for r in report.rows)
    decode_note = next(n for n in report.notes if n.startswith("Decode, each pair's ratio"))
    with_ours_first, with_og_first = decode_note.split("; ")
    # reps=3 gives two pairs in each process
    assert with_ours_first.count("x") == 2 and "our session made first" in with_ours_first
    assert with_og_first.count("x") == 2 and "og's model made first" in with_og_first
    assert "chose the same 5 tokens" in " ".join(report.notes)  # fp32 on both sides: the same greedy answer
