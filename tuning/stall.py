"""The search's stall guard: a search whose trials all wait (PAUSED or PENDING) while
the cluster has room for one of them, for ``stall_timeout_s``, will never end by
itself: Tune's loop keeps its driver busy and the search holds its admission for ever.
The guard ends it FAILED, naming every trial and its state. A trial that runs (however
long its epoch) is progress; trials that wait for a busy cluster are not stalled."""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable

from ray import tune

from api.cluster_contract import SEARCH_STALL_ENV
from trainers.ray_compat import job_actor_starting
from trainers.tune_compat import places_kept

DEFAULT_STALL_S = 120.0
CHECK_EVERY_S = 1.0  # Tune's loop calls back many times a second; the guard looks once a second
WAITING = ("PAUSED", "PENDING")
FINISHED = ("TERMINATED", "ERROR")


class SearchStalled(RuntimeError):
    """Raised in the search's driver: no trial ran for the guard's time while one could."""


def stall_limit_s(spec_limit: float | None) -> float:
    """The search's own ``stall_timeout_s``, else the server's (its environment), else 120 s."""
    if spec_limit is not None:
        return spec_limit
    try:
        return float(os.environ.get(SEARCH_STALL_ENV, DEFAULT_STALL_S))
    except ValueError:
        return DEFAULT_STALL_S


def stall_reason(states: Iterable[tuple[str, str]], waited_s: float) -> str:
    """``search made no progress for 120 s: trials a, b PAUSED, c TERMINATED; no trial running``."""
    by_status: dict[str, list[str]] = {}
    for trial_id, status in states:
        by_status.setdefault(status, []).append(trial_id)
    parts = ", ".join(f"{', '.join(ids)} {status}" for status, ids in by_status.items())
    return f"search made no progress for {waited_s:.0f} s: trials {parts}; no trial running"


class StallWatch:
    """How long the search has gone with every unfinished trial waiting while one could start."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.since: float | None = None

    def check(self, states: list[tuple[str, str]], can_start: Callable[[], bool], now: float) -> str | None:
        """The reason to end the search, once it stalled for ``limit_s``; else None."""
        live = [status for _, status in states if status not in FINISHED]
        if not live or any(s not in WAITING for s in live) or not can_start():
            self.since = None  # a trial runs, the search is over, or the cluster is busy with others
            return None
        if self.since is None:
            self.since = now
        waited = now - self.since
        return stall_reason(states, waited) if waited >= self.limit_s else None


def fits(request: dict[str, float], available: dict[str, float]) -> bool:
    return all(available.get(name, 0.0) + 1e-9 >= amount for name, amount in request.items() if amount > 0)


def room_for_one(trials: list) -> bool:
    """Whether the cluster has free now what one waiting trial asks for."""
    import ray

    available = ray.available_resources()
    for trial in trials:
        if trial.status in WAITING:
            request = getattr(trial.placement_group_factory, "required_resources", None) or {}
            if fits(request, available):
                return True
    return False


def could_start(trials: list) -> bool:
    """A waiting trial would fit the cluster now (or a paused one's process is kept for
    it, ``trainers.tune_compat``), and none is starting."""
    # Tune keeps a trial it is starting (or restarting) PENDING until its trainable's actor is up.
    return (places_kept() > 0 or room_for_one(trials)) and not job_actor_starting()


class StallGuard(tune.Callback):
    """In the search's driver: raises ``SearchStalled`` from Tune's loop once the search
    stalled for ``limit_s`` (Tune then stops every trial; the driver reports the failure)."""

    def __init__(self, limit_s: float) -> None:
        self.watch = StallWatch(limit_s)
        self._next_check = 0.0

    def __getstate__(self) -> dict:
        # A restored search (a new attempt) counts from its own start.
        return {"watch": StallWatch(self.watch.limit_s), "_next_check": 0.0}

    def _progress(self, *args, **info) -> None:
        self.watch.since = None  # Tune started, restored, saved or heard from a trial: the clock starts over

    on_trial_start = on_trial_restore = on_trial_save = on_trial_result = _progress
    on_trial_complete = on_trial_error = _progress

    def on_step_begin(self, iteration: int, trials: list, **info) -> None:
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + CHECK_EVERY_S
        states = [(t.trial_id, t.status) for t in trials]
        reason = self.watch.check(states, lambda: could_start(trials), now)
        if reason is not None:
            raise SearchStalled(reason)
