"""Where a path's time goes: py-spy samples the daemon and the client while one client runs
requests back to back on one path, and the functions with the most samples (own and anywhere on
the stack) are listed per process.

Run: python -m bench.protocol.profile [--seconds S] [--max-tokens N] [--out FILE] PATH...
(default h3-warm, 15 s, max_tokens 1); needs py-spy (`pip install py-spy`). Only samples holding
the GIL count (--gil), so the daemon's ONNX Runtime threads are left out: the figures are the
Python work of the request path. py-spy slows both processes; compare shares, not times.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from bench.protocol.load import Point
from bench.protocol.servers import REPO, Stack, start_stack, stop_stack

RATE = 250


def _frame(f: str) -> str:
    """'func (path/to/file.py:12)' -> 'func (file.py)'."""
    name, _, where = f.partition(" (")
    return f"{name} ({where.split(':')[0].split('/')[-1]})" if where else f


def top(collapsed: Path, n: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """Total samples, and the top `n` frames by own samples and by samples anywhere on the stack
    (of those on fewer than 70% of the stacks)."""
    own: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";")]
        k = int(count)
        total += k
        own[frames[-1]] += k
        for f in set(frames):
            anywhere[f] += k
    # Frames on most stacks (the event loop, main) say nothing; list the ones below them.
    inner = [(f, k) for f, k in anywhere.most_common() if k < 0.7 * total]
    return total, own.most_common(n), inner[:n]


def profile(stack: Stack, work: Path, path: str, seconds: float, max_tokens: int, spy: str) -> list[str]:
    spec, out = work / f"{path}-spec.json", work / f"{path}-out.json"
    point = Point(path, 1, max_tokens, 1_000_000, seconds, warmup=20)
    spec.write_text(json.dumps({"target": asdict(stack.target), "points": [asdict(point)],
                                "server_pgids": stack.pids()}))  # fmt: skip
    client = subprocess.Popen([sys.executable, "-m", "bench.protocol.load", str(spec), str(out)], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    time.sleep(3)  # past the client's imports and warm-up
    record = seconds - 5
    pids = {"daemon": stack.pids()["zerolayer"], "client": client.pid}
    spies = [subprocess.Popen([spy, "record", "--gil", "--nonblocking", "-r", str(RATE), "-f", "raw", "-d",
                               f"{record:.0f}", "-o", str(work / f"{path}-{name}.txt"), "-p", str(pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name, pid in pids.items()]  # fmt: skip
    for p in spies:
        p.wait(record + 30)
    client.wait(seconds + 60)
    result = json.loads(out.read_text())[0]
    n = len(result["samples"])
    each = result["wall"] / max(n, 1) * 1000
    lines = [f"## {path}, max_tokens {max_tokens}", "",
             f"{n} requests in {result['wall']:.1f} s under py-spy ({each:.2f} ms each); load average "
             f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; sampled {record:.0f} s at {RATE} Hz.", ""]  # fmt: skip
    for name in pids:
        total, own, anywhere = top(work / f"{path}-{name}.txt", 20)
        lines += [f"{name}: {total} samples holding the GIL ({total / RATE / record * 100:.0f}% of the time)", "",
                  "| own samples | % | function | | anywhere on the stack | % | function |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for (f1, k1), (f2, k2) in zip(own, anywhere, strict=False):
            lines.append(f"| {k1} | {k1 / max(total, 1) * 100:.1f} | `{f1}` | | {k2} | {k2 / max(total, 1) * 100:.1f} "
                         f"| `{f2}` |")  # fmt: skip
        lines.append("")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("paths", nargs="*", default=["h3-warm"])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--max-tokens", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the tables here (markdown)")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.path.exists(spy):
        raise SystemExit("needs py-spy: pip install py-spy")
    from firmware.toolchain.devkit import dev_trusted_keys
    from firmware.toolchain.tiny import tiny_bundle

    work = Path(tempfile.mkdtemp(prefix="zl-profile-"))
    stack = start_stack(work / "stack", tiny_bundle(), dev_trusted_keys())
    lines = ["# Protocol benchmark profiles (py-spy)", "",
             f"`python -m bench.protocol.profile --seconds {args.seconds:.0f} --max-tokens {args.max_tokens} "
             f"{' '.join(args.paths)}`: one client, loopback, tiny firmware. Only samples holding the GIL count.",
             ""]  # fmt: skip
    try:
        for path in args.paths:
            lines += profile(stack, work, path, args.seconds, args.max_tokens, spy)
    finally:
        stop_stack(stack)
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
