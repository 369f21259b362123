"""What GET /healthz says of this replica: whether its store answers (what makes it ready),
whether Ray answers (jobs wait while it does not, so it is reported, not required), and
which background units it runs (a standby holds none and is as ready).

Anyone may ask, so asking is cheap and bounded: one answer serves every caller for
``cache_s``; the checks run side by side, each within its bound (the answer comes within
the longer, 1.5 s, inside a proxy's 3 s check); a check that has not come back is not
started again (a hung database costs one thread, however often the probe asks)."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Protocol

from sqlalchemy import text
from sqlalchemy.engine import Engine

from api.schemas import HealthPublic

CACHE_S = 1.0  # one answer serves every probe and caller this long
STORE_TIMEOUT_S = 1.5  # the store's bound: a probe's own timeout is longer (docker/, kuberay/)
RAY_TIMEOUT_S = 1.0  # Ray's: a cluster that does not answer never makes the probe late


class Answers(Protocol):
    def answers(self, timeout_s: float) -> bool: ...


class Holds(Protocol):
    def held(self) -> list[str]: ...


class Health:
    def __init__(self, engine: Engine, ray: Answers, runner: Holds, cache_s: float = CACHE_S) -> None:
        self.engine, self.ray, self.runner = engine, ray, runner
        self.cache_s = cache_s
        self._last: tuple[float, HealthPublic] | None = None
        self._checks: dict[str, asyncio.Future] = {}  # each check under way
        self._lock: asyncio.Lock | None = None

    async def report(self) -> HealthPublic:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # callers at once share one check
            if self._last is not None and time.monotonic() - self._last[0] < self.cache_s:
                return self._last[1]
            store, ray = await asyncio.gather(
                self._within("store", self._store_answers, STORE_TIMEOUT_S),
                self._within("ray", self._ray_answers, RAY_TIMEOUT_S),
            )
            report = HealthPublic(
                status="ok" if store else "unavailable", store=store, ray=ray, leases=self.runner.held()
            )
            self._last = (time.monotonic(), report)
            return report

    async def _within(self, name: str, check: Callable[[], bool], timeout_s: float) -> bool:
        running = self._checks.get(name)
        if running is None or running.done():
            running = self._checks[name] = asyncio.ensure_future(asyncio.to_thread(check))
        try:
            return bool(await asyncio.wait_for(asyncio.shield(running), timeout_s))
        except Exception:  # noqa: BLE001 - a check that failed or did not come back in time: "no"
            return False

    def _store_answers(self) -> bool:
        with self.engine.connect() as c:
            return c.execute(text("SELECT 1")).scalar() == 1

    def _ray_answers(self) -> bool:
        return self.ray.answers(RAY_TIMEOUT_S)
