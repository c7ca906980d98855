"""The client side of a run: points (path, concurrency, max_tokens) measured one after another in
this process, which does nothing else, so its CPU time is the client's.

Each point: one worker per concurrent client, each with its own Path (its own connections);
every worker warms up (opens, runs `warmup` requests), then all start together and issue requests
back to back until the point has its requests or its time bound passes (then it is marked cut
short). Server CPU is read from /proc for the servers' process groups over the same interval.

Run by the orchestrator as `python -m bench.protocol.load SPEC.json OUT.json`, inside the client's
network namespace for the lossy link.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path as FsPath
from typing import Any

from bench.protocol.paths import EnginePath, Http3Path, HttpsPath, Path, Sample, Target, UnixPath

TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Point:
    path: str
    concurrency: int
    max_tokens: int
    requests: int  # the goal
    seconds: float  # the bound
    warmup: int = 2  # per worker, not measured


@dataclass
class PointResult:
    point: Point
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    client_cpu: float = 0.0
    server_cpu: dict[str, float] = field(default_factory=dict)
    cut_short: bool = False
    notes: list[str] = field(default_factory=list)


def group_cpu(pgids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) of every live process in each server's process group."""
    out = dict.fromkeys(pgids, 0.0)
    by_pgid = {pgid: name for name, pgid in pgids.items()}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = by_pgid.get(int(fields[2]))  # field 5 (pgrp), counted after the command name
        if name is not None:
            out[name] += (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
    return out


class Factory:
    def __init__(self, target: Target) -> None:
        self.target = target
        self.tls = ssl.create_default_context(cafile=target.ca_file)
        self.ca_pem = FsPath(target.ca_file).read_bytes()
        self._engine: Any = None

    def engine(self) -> Any:
        if self._engine is None:
            from appliance.engine import Engine, EngineConfig
            from firmware import load
            from firmware.toolchain.devkit import dev_trusted_keys

            self._engine = Engine(load(FsPath(self.target.bundle), dev_trusted_keys()), EngineConfig())
            self._engine.warm()
        return self._engine

    def make(self, name: str) -> Path:
        t = self.target
        if name.startswith("layered-") or name.startswith("tcp-"):
            return HttpsPath(t, reuse=name.endswith("-reuse"), layered=name.startswith("layered"), tls=self.tls)
        if name.startswith("h3-"):
            return Http3Path(t, name.removeprefix("h3-"), self.ca_pem)
        if name == "unix":
            return UnixPath(t)
        if name == "engine":
            return EnginePath(self.engine())
        raise ValueError(f"unknown path {name!r}")

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()


async def run_point(factory: Factory, point: Point, server_pgids: dict[str, int]) -> PointResult:
    result = PointResult(point)
    paths = [factory.make(point.path) for _ in range(point.concurrency)]
    go = asyncio.Event()
    ready = 0
    budget = [point.requests]
    deadline = [0.0]

    async def worker(path: Path) -> None:
        nonlocal ready
        await path.open()
        for _ in range(point.warmup):
            await path.request(point.max_tokens)
        ready += 1
        if ready == len(paths):
            deadline[0] = time.perf_counter() + point.seconds
            go.set()
        await go.wait()
        while budget[0] > 0 and time.perf_counter() < deadline[0]:
            budget[0] -= 1
            try:
                wall = time.time()
                sample = await path.request(point.max_tokens)
                sample.start_wall = wall
                result.samples.append(sample)
            except Exception as exc:
                result.errors.append(f"{type(exc).__name__}: {exc}"[:300])

    tasks = [asyncio.create_task(worker(p)) for p in paths]

    async def measure() -> None:
        await go.wait()
        cpu0, srv0, t0 = time.process_time(), group_cpu(server_pgids), time.perf_counter()
        await asyncio.gather(*tasks, return_exceptions=True)
        result.wall = time.perf_counter() - t0
        result.client_cpu = time.process_time() - cpu0
        srv1 = group_cpu(server_pgids)
        result.server_cpu = {k: srv1[k] - srv0[k] for k in srv0}

    measuring = asyncio.create_task(measure())
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.gather(*tasks)), point.seconds + 120)
    except Exception as exc:  # a worker failed while warming up: the point has no measurement
        result.errors.append(f"{type(exc).__name__}: {exc}"[:300])
        go.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    if not measuring.done():
        await asyncio.wait_for(measuring, 30)
    result.cut_short = budget[0] > 0
    for p in paths:
        await p.close()
        for attr in ("early_rejected", "full_handshakes"):
            if getattr(p, attr, 0):
                result.notes.append(f"{attr.replace('_', ' ')}: {getattr(p, attr)}")
    return result


async def run(target: Target, points: list[Point], server_pgids: dict[str, int]) -> list[PointResult]:
    factory = Factory(target)
    out = []
    try:
        for point in points:
            r = await run_point(factory, point, server_pgids)
            out.append(r)
            ttft = sorted(s.ttft for s in r.samples)
            med = f"{ttft[len(ttft) // 2] * 1000:.2f} ms" if ttft else "-"
            print(f"  {point.path:14} c={point.concurrency:<3} max_tokens={point.max_tokens:<3} "
                  f"{len(r.samples):5} requests in {r.wall:5.1f} s, TTFT P50 {med}"
                  f"{', cut short' if r.cut_short else ''}{f', {len(r.errors)} errors' if r.errors else ''}",
                  flush=True)  # fmt: skip
    finally:
        factory.close()
    return out


def main(spec_file: str, out_file: str) -> int:
    spec = json.loads(FsPath(spec_file).read_text())
    target = Target(**spec["target"])
    points = [Point(**p) for p in spec["points"]]
    results = asyncio.run(run(target, points, spec.get("server_pgids", {})))
    FsPath(out_file).write_text(json.dumps([asdict(r) for r in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
