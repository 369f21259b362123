"""One periodic unit of background work: a name, a cadence, a step, its own error budget
and its own figures (runs, failures, the last run's duration).

A unit is something the runner (``runner.py``) can start and stop on its own, so a unit
that fails again and again costs only itself: after ``budget`` failures in a row it says
so loudly once and waits longer between runs (doubling, at most ``max_backoff_s``), and
goes back to its cadence at its first success. A wakeable unit (``min_gap_s`` set) runs
early when ``wake()`` is called, at most once per gap.

A leased unit (the default) runs on one replica at a time: the runner starts it only while
this replica holds its lease. A fenced one's step is called with the lease's fence (its
token), which its writes check in their own transactions, so a replica that lost the
lease while paused is refused."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

log = logging.getLogger("raydock.background")


@dataclass
class Periodic:
    name: str
    every_s: float | Callable[[], float]  # a callable is read before each wait
    step: Callable[[], Any]  # a plain function runs on a worker thread, a coroutine function on the loop
    budget: int = 5  # failures in a row before it logs loudly and backs off
    max_backoff_s: float = 60.0
    min_gap_s: float | None = None  # wakeable: woken runs are at least this far apart
    own_thread: bool = False  # runs on an event loop of its own thread (its work never waits for the API's loop)
    on_stop: Callable[[], Awaitable[None] | None] | None = None  # after its last run, on its loop
    leased: bool = True  # False: it runs on every replica (it keeps this replica's own state)
    fenced: bool = False  # its step takes the fence of the lease it runs under (None without leases)
    # Raised by a fenced step whose lease moved on: said as a warning, not counted as a failure.
    lost: tuple[type[BaseException], ...] = ()
    fence: Any = field(default=None, init=False)  # set by the runner as it starts the unit
    runs: int = field(default=0, init=False)
    failures: int = field(default=0, init=False)
    failures_in_row: int = field(default=0, init=False)
    last_duration_s: float | None = field(default=None, init=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)
    _wake: asyncio.Event | None = field(default=None, init=False, repr=False)

    def cadence_s(self) -> float:
        return self.every_s() if callable(self.every_s) else self.every_s

    def wake(self) -> None:
        """Run soon rather than at the next cadence; safe from any thread."""
        loop, event = self._loop, self._wake
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    async def run_once(self) -> bool:
        """One step, counted: whether it succeeded."""
        started = time.perf_counter()
        try:
            args = (self.fence,) if self.fenced else ()
            if inspect.iscoroutinefunction(self.step):
                await self.step(*args)
            else:
                await asyncio.to_thread(self.step, *args)
        except self.lost as exc:  # the runner stops it at its next claim; the new holder does the work
            ok = True
            self.failures_in_row = 0
            log.warning("background unit %s: its lease moved on; nothing written: %s", self.name, exc)
        except Exception:  # noqa: BLE001 - a unit outlives any one bad step, and never stops another
            ok = False
            self.failures += 1
            self.failures_in_row += 1
            log.exception("background unit %s failed (%d in a row)", self.name, self.failures_in_row)
            if self.failures_in_row == self.budget:
                log.error(
                    "background unit %s failed %d times in a row: it now waits up to %gs between runs",
                    self.name,
                    self.budget,
                    self.max_backoff_s,
                )
        else:
            ok = True
            if self.failures_in_row >= self.budget:
                log.warning("background unit %s runs again after %d failures", self.name, self.failures_in_row)
            self.failures_in_row = 0
        self.runs += 1
        self.last_duration_s = time.perf_counter() - started
        return ok

    def pause_s(self) -> float:
        """The wait before the next run: its cadence, longer while it is over its budget."""
        every = self.cadence_s()
        over = self.failures_in_row - self.budget
        if over < 0:
            return every
        return max(every, min(max(every, 1.0) * 2 ** (over + 1), self.max_backoff_s))

    async def wait(self) -> None:
        """Until the next run: the pause, cut short by a wake (a gap apart at least)."""
        if self._wake is None:
            self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        pause = self.pause_s()
        if self.min_gap_s is None or self.failures_in_row >= self.budget:
            await asyncio.sleep(pause)
            return
        # A burst of wakes runs it at most every min_gap_s.
        await asyncio.sleep(self.min_gap_s)
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=max(pause - self.min_gap_s, 0))
        except TimeoutError:
            pass
        self._wake.clear()
