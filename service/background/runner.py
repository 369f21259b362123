"""The runner of the background units: ``start(unit)``, ``stop(unit)`` and ``units()``.

Each unit runs alone (an asyncio task on the server's loop, or on a loop of its own thread
when it asks for one), so one unit's failures or slowness never hold up another. After
each run the runner reports it through ``observe(name, ok, seconds)``, which the
composition root points at the /metrics counters.

Given ``leases`` (the store's, service/db/leases.py), ``start_all`` runs a leased unit only
while this replica holds its lease: a keeper claims them every quarter of the TTL (every
second while it lacks some), starts what it took, stops what it lost (or could not renew in
time), and ``stop_all`` releases them all at once so another replica takes them at its next
claim."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
from typing import Callable, Protocol

from service.background.periodic import Periodic

log = logging.getLogger("raydock.background")

STOP_WAIT_S = 15.0  # a unit on its own thread is waited for this long at stop
RENEWS_PER_TTL = 4  # a holder renews its leases this often per TTL
WAITING_EVERY_S = 1.0  # a replica without every lease claims this often: a dead holder's are taken within TTL + 1 s


class Leases(Protocol):
    """What the runner asks of the store's leases (service/db/leases.py)."""

    ttl_s: float

    def claim(self, names: list[str]) -> dict[str, object]: ...  # name -> the fence held now

    def release(self) -> None: ...


class _Thread:
    def __init__(self, runner: "Runner", unit: Periodic) -> None:
        self.loop = asyncio.new_event_loop()
        self.task: asyncio.Task | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(runner, unit), name=f"raydock-{unit.name}", daemon=True)

    def _main(self, runner: "Runner", unit: Periodic) -> None:
        asyncio.set_event_loop(self.loop)
        self.task = self.loop.create_task(runner._loop_of(unit))
        self.ready.set()
        with contextlib.suppress(asyncio.CancelledError):
            self.loop.run_until_complete(self.task)
        self.loop.close()

    def stop(self) -> None:
        self.ready.wait()
        if not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):  # it ended meanwhile
                self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(STOP_WAIT_S)


class Runner:
    def __init__(
        self, observe: Callable[[str, bool, float], None] = lambda name, ok, seconds: None, leases: Leases | None = None
    ) -> None:
        self.observe = observe
        self.leases = leases
        self._units: dict[str, Periodic] = {}
        self._running: dict[str, asyncio.Task | _Thread] = {}
        self._keeper: asyncio.Task | None = None
        self._claim: asyncio.Future | None = None  # the keeper's claim under way

    def add(self, unit: Periodic) -> Periodic:
        """Known to the runner, not yet started."""
        if unit.name in self._units:
            raise ValueError(f"a background unit named {unit.name!r} is already added")
        self._units[unit.name] = unit
        return unit

    def units(self) -> list[Periodic]:
        return list(self._units.values())

    def running(self) -> list[str]:
        return [name for name, r in self._running.items() if not (isinstance(r, asyncio.Task) and r.done())]

    def held(self) -> list[str]:
        """The leased units this replica runs now (it holds their leases), by name."""
        return sorted(u.name for u in self.units() if u.leased and u.name in self.running())

    def start(self, unit: Periodic) -> None:
        """Start a unit (added first if it is not yet); one on the server's loop needs a running loop."""
        if unit.name not in self._units:
            self.add(unit)
        if unit.name in self._running:
            return
        if unit.own_thread:
            worker = _Thread(self, unit)
            worker.thread.start()
            self._running[unit.name] = worker
        else:
            self._running[unit.name] = asyncio.get_running_loop().create_task(
                self._loop_of(unit), name=f"raydock-{unit.name}"
            )

    def start_all(self) -> None:
        """Every unit; with leases, the leased ones as their leases are held."""
        for unit in self.units():
            if self.leases is None or not unit.leased:
                self.start(unit)
        if self.leases is not None and self._keeper is None:
            self._keeper = asyncio.get_running_loop().create_task(self._keep(self.leases), name="raydock-leases")

    async def stop(self, unit: Periodic) -> None:
        """Stop a unit after (or in) its current run; its ``on_stop`` runs on its loop."""
        running = self._running.pop(unit.name, None)
        if isinstance(running, _Thread):
            await asyncio.to_thread(running.stop)
        elif running is not None:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running

    async def stop_all(self) -> None:
        """Every unit stopped; with leases, then all of them released at once."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            if self._claim is not None:
                with contextlib.suppress(Exception):  # its failure was the keeper's to log
                    await self._claim
        for unit in reversed(self.units()):
            await self.stop(unit)
        if keeper is not None:
            try:
                await asyncio.to_thread(self.leases.release)
            except Exception:  # noqa: BLE001 - they expire on their own after one TTL
                log.exception("could not release this replica's leases; they expire after %gs", self.leases.ttl_s)

    async def _keep(self, leases: Leases) -> None:
        """Claim the leased units' leases (every TTL/RENEWS_PER_TTL, or WAITING_EVERY_S while
        some are another's) and run what is held."""
        leased = [u for u in self.units() if u.leased]
        names = [u.name for u in leased]
        held_until = float("-inf")  # monotonic: past it, a lease not renewed may be another's
        while True:
            asked = time.monotonic()
            try:
                # Shielded: a stop waits for it, so no claim commits after the release.
                self._claim = asyncio.ensure_future(asyncio.to_thread(leases.claim, names))
                held = await asyncio.shield(self._claim)
            except Exception:  # noqa: BLE001 - the store may be back at the next claim
                log.exception("could not claim the background units' leases")
                held = None if asked < held_until else {}
            else:
                held_until = asked + leases.ttl_s
            if held is not None:
                await self._follow(leased, held)
            # A replica short of some unit asks at least every second: a freed lease is taken at once.
            every = leases.ttl_s / RENEWS_PER_TTL
            await asyncio.sleep(every if held is not None and len(held) == len(names) else min(every, WAITING_EVERY_S))

    async def _follow(self, leased: list[Periodic], held: dict[str, object]) -> None:
        """Start the units whose leases are held, stop the others (and any held under an older fence)."""
        for unit in leased:
            fence = held.get(unit.name)
            running = unit.name in self._running
            if running and (fence is None or fence != unit.fence):
                log.warning("background unit %s: this replica no longer holds its lease; stopping it", unit.name)
                await self.stop(unit)
                running = False
            if fence is not None and not running:
                log.info("background unit %s runs on this replica (lease %s)", unit.name, fence)
                unit.fence = fence
                self.start(unit)

    async def _loop_of(self, unit: Periodic) -> None:
        unit._loop, unit._wake = asyncio.get_running_loop(), asyncio.Event()
        try:
            while True:
                ok = await unit.run_once()
                self.observe(unit.name, ok, unit.last_duration_s or 0.0)
                await unit.wait()
        finally:
            if unit.on_stop is not None:
                try:
                    done = unit.on_stop()
                    if inspect.isawaitable(done):
                        await done
                except Exception:  # noqa: BLE001 - stopping goes on for the other units
                    log.exception("background unit %s failed to stop cleanly", unit.name)
