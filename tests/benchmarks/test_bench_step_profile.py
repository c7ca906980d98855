"""bench/step_profile.py on the tiny model, so the profile behind the README's explanations cannot
rot: every run kind is timed and profiled, a node counts for the run it falls in, and the fairness
floor is read from the right rows."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import firmware
from bench.step_profile import (
    BATCH_ROWS,
    Lengths,
    MatMulShape,
    RunProfile,
    StreamsBound,
    by_run,
    daemon_pid,
    fairness_floor,
    labels,
    matmul_by_rows,
    profile_steps,
    streams_bound,
    streams_lines,
    thread_cpu,
)

SMALL = Lengths(early=8, late=24, prompt=40, early_chunk_at=8, early_chunk=8, small_chunk=2, streams=3)


def test_each_run_kind_is_timed_and_profiled(tiny_bundle_path: Path, trusted_keys: Path) -> None:
    profiles = profile_steps(firmware.load(tiny_bundle_path, trusted_keys), SMALL, reps=2, threads=1)
    assert len(profiles) == 6
    for name, p in profiles.items():
        assert p.total > 0, name
        assert p.ops["attention"] > 0 and p.ops["weight matmuls"] > 0, (name, p.ops)
        assert set(p.ops) == {"attention", "weight matmuls", "other nodes"}, name
    assert set(profiles) == set(labels(SMALL))
    before, floor, ratio = fairness_floor(profiles)
    assert before == profiles["before"].total
    assert floor == profiles["late"].total + profiles["last chunk"].total and ratio == floor / before
    assert "3 rows after 24 positions" in labels(SMALL)["late"]


def test_nodes_are_attributed_to_the_run_they_fall_in() -> None:
    runs = [{"ts": 100, "dur": 50}, {"ts": 200, "dur": 30}]
    node = {"args": {"op_name": "GroupQueryAttention"}}
    nodes = [{**node, "ts": 90, "dur": 5},  # before the first run: a warm-up, left out
             {**node, "ts": 110, "dur": 20}, {**node, "ts": 205, "dur": 10},
             {"args": {"op_name": "MatMulNBits"}, "ts": 215, "dur": 4},
             {"args": {"op_name": "Add"}, "ts": 160, "dur": 3}]  # fmt: skip
    assert by_run(runs, nodes) == [RunProfile(0.05, {"attention": 0.02}),
                                   RunProfile(0.03, {"attention": 0.01, "weight matmuls": 0.004})]  # fmt: skip


def test_the_daemon_is_found_by_its_socket_and_its_threads_cpu_read(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    accepted = threading.Thread(target=lambda: server.accept()[0].close())
    accepted.start()
    try:
        assert daemon_pid(path) == os.getpid()
    finally:
        accepted.join(5)
        server.close()
    spent = thread_cpu(os.getpid())
    assert os.getpid() in spent and all(v >= 0 for v in spent.values())


def test_the_streams_bound_reads_the_graph_and_prices_prefill_per_request(tiny_bundle_path: Path,
                                                                          trusted_keys: Path) -> None:  # fmt: skip
    bound = streams_bound(firmware.load(tiny_bundle_path, trusted_keys), threads=1, reps=1)
    assert bound.shapes == []  # the tiny model's weights are fp32 MatMul
    assert bound.prompt_tokens > bound.reused == 16 and bound.prefill_ms > 0
    # One row 4 ms, 8 rows 8 ms: decode alone allows 4x; a 32 ms prefill per 64-token answer adds
    # 0.5 ms to every token at any batch, so (4 + 0.5) / (1 + 0.5) = 3x.
    bound.prefill_ms = 32.0
    profiles = {"one row": RunProfile(4.0), "all rows": RunProfile(8.0)}
    lines = streams_lines(bound, profiles, Lengths(streams=7))
    assert "no kernel table" in lines[0]
    assert any("at most **4.00x**" in line for line in lines)
    assert any("at most **3.00x**" in line for line in lines)


def test_a_quantized_matmul_is_timed_at_every_batch() -> None:
    shape = MatMulShape(k=64, n=32, bits=8, block_size=32, accuracy_level=4, nodes=3)
    by_rows = matmul_by_rows(shape, threads=1, reps=1)
    assert set(by_rows) == set(BATCH_ROWS) and all(t > 0 for t in by_rows.values())
    bound = StreamsBound([(shape, by_rows)], prompt_tokens=40, reused=16, prefill_ms=10.0)
    lines = streams_lines(bound, {"one row": RunProfile(4.0), "all rows": RunProfile(8.0)}, Lengths(streams=7))
    assert lines[2].startswith("| 64 x 32, 8-bit, block 32 (3) |") and "(1.0x)" in lines[2]
