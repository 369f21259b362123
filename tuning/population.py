"""Keeps a PBT population in step: a trial that reaches a perturbation point waits
there (its Train run simply blocks on its next report) until every running trial has
reached it too. Without this, trials whose epochs take less time than the spread of
their start-up times finish before the slowest one starts, and PBT never has two live
scores to compare; Tune's own synchronous mode gets there by pausing every trial,
which restarts its whole Train run at every round.

One ``Population`` actor per search lives in the search driver's job (it goes with it);
the driver tells it which trials run (a clone restarting from its donor counts), each
trial's trainable tells it how far it got. ``LoopEnd`` is the budget of a population
whose loop's own end is its budget.
"""

from __future__ import annotations

import time

import ray
from ray import tune

POLL_S = 0.2
# Longest a trial waits for stragglers: a trial that cannot start in this long is
# failing anyway (its worker group times out), and the others go on without it.
ALIGN_TIMEOUT_S = 300.0


@ray.remote(num_cpus=0)
class Population:
    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.running: set[str] = set()

    def set_running(self, trial_ids: list[str]) -> None:
        self.running = set(trial_ids)

    def arrive(self, trial_id: str, time_: float) -> None:
        self.times[trial_id] = max(time_, self.times.get(trial_id, float("-inf")))

    def slowest(self) -> float:
        """The least progress among running trials (-inf for one not reported yet)."""
        return min((self.times.get(t, float("-inf")) for t in self.running), default=float("inf"))


class Alignment:
    """The trainable's side: after forwarding a report, wait at perturbation points."""

    def __init__(self, population, trial_id: str, interval: float, budget: float | None, should_stop=None) -> None:
        self.population, self.trial_id = population, trial_id
        self.should_stop = should_stop  # a trainable Tune may reset meanwhile: it must return at once
        self.interval, self.budget = interval, float("inf") if budget is None else budget
        self.last: float | None = None

    def after_report(self, time_: float) -> None:
        crossed = (
            time_ % self.interval == 0 if self.last is None else time_ // self.interval > self.last // self.interval
        )
        self.last = time_
        ray.get(self.population.arrive.remote(self.trial_id, time_))
        if not crossed or time_ >= self.budget:
            return
        point = (time_ // self.interval) * self.interval
        deadline = time.monotonic() + ALIGN_TIMEOUT_S
        while time.monotonic() < deadline and ray.get(self.population.slowest.remote()) < point:
            if self.should_stop is not None and self.should_stop():
                raise SystemExit(0)
            time.sleep(POLL_S)


class LoopEnd(tune.Stopper):
    """The budget of a population whose loop's own end is its budget: the reports the
    first trial made when its loop returned. A PBT clone of a loop that never restores
    from a checkpoint runs the loop from its start again while its count goes on from
    the donor's, so without this it could be cloned, and start over, forever."""

    def __init__(self) -> None:
        self.length: int | None = None

    def __call__(self, trial_id: str, result: dict) -> bool:
        count = result.get("training_iteration", 0)
        if result.get("done") and self.length is None:
            self.length = count
        return self.length is not None and count >= self.length

    def stop_all(self) -> bool:
        return False
