"""The models being served, by name: each a verified bundle with an engine of its own (its sessions,
its scheduler, its slots). Requests route by name. A reload adds, replaces and retires models; a
retired engine takes no new request, finishes the streams it has, then closes, so the other models'
streams never notice."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from appliance.engine import Engine

log = logging.getLogger(__name__)


@dataclass
class Served:
    """One model: the name clients ask for, its engine, and where its bundle was configured."""

    name: str
    engine: Engine
    source: Path  # the configured path (a store link such as .../current): what a reload compares
    key: str | None = None  # its [firmware.bundles] name; None: firmware.path's bundle

    @property
    def loaded(self) -> Path:
        """The bundle directory the engine runs (the link resolved when it was loaded)."""
        return self.engine.bundle.root


class ServedModels:
    def __init__(self) -> None:
        self._models: dict[str, Served] = {}
        self._retiring: set[asyncio.Task[None]] = set()

    @classmethod
    def of(cls, *engines: Engine) -> ServedModels:
        """Engines served under their bundles' own names."""
        models = cls()
        for engine in engines:
            models.put(Served(engine.model_name, engine, engine.bundle.root))
        return models

    def __iter__(self) -> Iterator[Served]:
        return iter(list(self._models.values()))

    def __len__(self) -> int:
        return len(self._models)

    def names(self) -> list[str]:
        return list(self._models)

    def get(self, name: str) -> Served | None:
        return self._models.get(name)

    def engine(self, name: str) -> Engine | None:
        served = self._models.get(name)
        return served.engine if served is not None else None

    def first(self) -> Served:
        return next(iter(self._models.values()))

    def put(self, served: Served) -> Served | None:
        """Serve a model (new requests go to it at once); returns the one it replaced, if any."""
        old = self._models.get(served.name)
        self._models[served.name] = served
        return old

    def remove(self, name: str) -> Served | None:
        return self._models.pop(name, None)

    def retire(self, served: Served, drain_timeout: float) -> asyncio.Task[None]:
        """Close a model that no longer takes requests once its streams end (or the timeout passes)."""
        task = asyncio.create_task(self._drain(served, drain_timeout), name=f"retire-{served.name}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        return task

    @staticmethod
    async def _drain(served: Served, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        engine = served.engine
        while engine.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if engine.in_flight:
            log.warning("model %s retired with %d requests still running after %.0f s: they are cut off",
                        served.name, engine.in_flight, timeout)  # fmt: skip
        await asyncio.to_thread(engine.close)
        log.info("model %s (%s %s) retired and closed", served.name, engine.bundle.name, engine.bundle.version)

    async def wait_retired(self) -> None:
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)

    def alive(self) -> bool:
        return bool(self._models) and all(s.engine.alive() for s in self._models.values())

    def healthy(self, stall_limit: float, now: float) -> bool:
        return all(s.engine.healthy(stall_limit, now) for s in self._models.values())

    @property
    def queued(self) -> int:
        return sum(s.engine.queued for s in self._models.values())

    def close(self) -> None:
        for served in self._models.values():
            served.engine.close()
