"""The events a search sends the server, all from its driver process (where Tune's
controller runs), numbered in one sequence so the server stores each once and can
tell a newer trial status from an older one arriving late on the log channel.

- ``trial_metric``: one trial report, with the trial's values at the time;
- ``trial``: a trial's status or values changed (PENDING, RUNNING, PAUSED, TERMINATED, ERROR);
- ``exploit``: PBT cloned a donor into a trial (``tuning.schedulers``);
- ``metric``: every trial report again on the job's own series (with ``trial_id``),
  so job-level metrics, streams and progress bars follow a search too;
- ``best_trial`` / ``checkpoint``: the best trial, its values and its checkpoint
  (``tuning.search_driver``).
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import cloudpickle
import ray
from ray import tune
from ray.tune.result import AUTO_RESULT_KEYS

from api.schemas import (
    BestTrialEvent,
    Event,
    ExploitEvent,
    FailureCause,
    MetricEvent,
    TrialEvent,
    TrialMetricEvent,
    TrialStatus,
    jsonable,
)
from api.schemas.trials import better, metric_value
from trainers import events
from trainers.failures import Failure, classify, readable

# Tune's own bookkeeping in a result, beyond what the trial's loop reported.
# Its count of reports stays: the time axis of a loop that reports neither epoch nor step.
TUNE_KEYS = (frozenset(AUTO_RESULT_KEYS) - {"training_iteration"}) | {
    "done",
    "trial_id",
    "experiment_tag",
    "should_checkpoint",
    "__duplicate__",
}
ERROR_TAIL_CHARS = 3000


class SearchEvents:
    """Numbers and emits a search's events; keeps the best report seen so far."""

    def __init__(
        self, metric: str, mode: str, key: str | None = None, sink: Callable[[Event], None] = events.emit
    ) -> None:
        self.key = key or uuid.uuid4().hex
        _LIVE[self.key] = self
        self.metric, self.mode, self.sink = metric, mode, sink
        self.seq = 0
        self.metric_seq = 0
        self.best: dict[str, Any] | None = None
        self.note: str | None = None  # sent with every trial status (tuning.search_driver sets it)
        self.first_report_timeout_s: float | None = None  # the spec's; tuning.search_driver sets it
        self.failures: dict[str, Failure] = {}  # each failed trial's first failure, in order
        self.population = None  # tuning.population's actor, when the population is aligned
        self.stopped = False  # the search's Ray job is being stopped (``stop``)
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.RLock()

    def __reduce__(self):
        # Tune pickles its scheduler and callbacks (experiment state); every copy in
        # this process must share one sequence, or two events would get one number.
        # A search restored in a new attempt finds the new attempt's (the key is the job's).
        return (_live, (self.key, self.metric, self.mode))

    def _send(self, make: Callable[[int], Event]) -> None:
        with self._lock:
            self.sink(make(self.seq))
            self.seq += 1

    def report(self, trial_id: str, metrics: dict[str, Any], config: dict[str, Any]) -> None:
        metrics, config = events.sendable_metrics(metrics), jsonable(config)
        self._send(
            lambda seq: TrialMetricEvent(
                type="trial_metric", seq=seq, trial_id=trial_id, metrics=metrics, config=config
            )
        )
        with self._lock:
            self.sink(MetricEvent(type="metric", seq=self.metric_seq, metrics={**metrics, "trial_id": trial_id}))
            self.metric_seq += 1
        self.consider(trial_id, metrics, config)

    def consider(self, trial_id: str, metrics: dict[str, Any], config: dict[str, Any]) -> None:
        """Keep ``metrics`` as the best report if it is (a report of an earlier attempt
        of a resumed search is considered here without being sent again)."""
        value = metric_value(metrics.get(self.metric))
        if value is not None and (self.best is None or better(value, self.best["value"], self.mode)):
            self.best = {"trial_id": trial_id, "value": value, "metrics": metrics, "config": config}

    def stop(self) -> None:
        """The search's Ray job is being stopped (cancel, preemption, deadline): the trials
        Tune stops from now on are not ended by the search, so no status of theirs is sent
        (the job's end is theirs: CANCELLED, or they go on when it resumes)."""
        self.stopped = True

    def trial(self, trial_id: str, status: str, config: dict[str, Any], error: str | None = None) -> None:
        if self.stopped:
            return
        config = jsonable(config)
        self._send(
            lambda seq: TrialEvent(
                type="trial",
                seq=seq,
                trial_id=trial_id,
                status=status,
                config=config,
                error=error,
                note=self.note,
            )
        )

    def exploit(self, **fields: Any) -> None:
        """Tune asks the scheduler before it tells the callbacks, so an exploit is
        decided before the report that triggered it is out: hold it until then."""
        self._pending.append(fields)

    def flush_exploits(self) -> None:
        while self._pending:
            fields = self._pending.pop(0)
            for name in ("donor_time", "trial_time", "donor_metric"):
                fields[name] = metric_value(fields.get(name))
            for name in ("old_config", "donor_config", "new_config"):
                fields[name] = jsonable(fields.get(name) or {})
            fields["checkpoint_path"] = fields.get("checkpoint_path") or None
            self._send(lambda seq: ExploitEvent(type="exploit", seq=seq, **fields))

    def best_trial(self, checkpoint_path: str | None) -> None:
        """The search's best trial, once it ended (``self.best`` is set)."""
        best = self.best
        self._send(
            lambda seq: BestTrialEvent(
                type="best_trial",
                seq=seq,
                trial_id=best["trial_id"],
                value=best["value"],
                config=best["config"],
                metrics=best["metrics"],
                checkpoint_path=checkpoint_path,
            )
        )


_LIVE: dict[str, SearchEvents] = {}


def _live(key: str, metric: str, mode: str) -> SearchEvents:
    return _LIVE.get(key) or SearchEvents(metric, mode, key)


def reported(result: dict[str, Any]) -> dict[str, Any]:
    """What the trial's loop reported, without Tune's bookkeeping."""
    return {k: v for k, v in result.items() if k not in TUNE_KEYS}


class SearchCallback(tune.Callback):
    """Tune callback in the search driver: trial reports and status changes out."""

    def __init__(self, out: SearchEvents) -> None:
        self.out = out
        self.running: list[str] = []
        self.sent: dict[str, tuple[str, dict]] = {}
        self.errors: dict[str, str] = {}
        self.started: dict[str, float] = {}  # trials started and not yet reporting: since when (monotonic)

    @property
    def population(self):
        """tuning.population, told which trials run: this attempt's (a restored search
        brings back this callback with the events of the attempt that saved it)."""
        return self.out.population

    def __getstate__(self) -> dict:
        # A restored search starts a new attempt: every trial's status is sent again.
        return {"out": self.out, "running": [], "sent": {}, "errors": {}, "started": {}}

    def on_trial_start(self, iteration: int, trials: list, trial, **info) -> None:
        self.started[trial.trial_id] = time.monotonic()

    def on_step_begin(self, iteration: int, trials: list, **info) -> None:
        self._stop_silent(trials)

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info) -> None:
        self.started.pop(trial.trial_id, None)
        # The result's own config: a PBT exploit may already have changed the trial's.
        self.out.report(trial.trial_id, reported(result), dict(result.get("config") or trial.config))
        self.out.flush_exploits()
        self._sync(trials)

    def on_trial_error(self, iteration: int, trials: list, trial, **info) -> None:
        failure = self.out.failures.get(trial.trial_id) or trial_failure(trial)  # ours, for a silent trial stopped
        self.out.failures.setdefault(trial.trial_id, failure)
        self.errors[trial.trial_id] = f"{failure.message}\n\n{failure.traceback}"[:ERROR_TAIL_CHARS]
        self._sync(trials)

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        self.out.flush_exploits()
        self._sync(trials)

    def on_experiment_end(self, trials: list, **info) -> None:
        self.out.flush_exploits()
        self._sync(trials)

    def _stop_silent(self, trials: list) -> None:
        """Stop a trial that has run ``first_report_timeout_s`` without a report; it
        fails saying so, on the trial and (as every trial failure) the job."""
        limit, now = self.out.first_report_timeout_s, time.monotonic()
        for trial in trials:
            since = self.started.get(trial.trial_id)
            if limit is None or since is None or trial.status != "RUNNING" or now - since < limit:
                continue
            del self.started[trial.trial_id]
            message = (
                f"The trial ran {now - since:.0f} s without reporting (first_report_timeout_s={limit:g}) and was "
                "stopped. Its loop or function must call ray.train.report / tune.report; raise "
                "first_report_timeout_s if its first report takes longer."
            )
            self.out.failures[trial.trial_id] = Failure(FailureCause.USER_CODE, message, "")
            if (actor := trial.temporary_state.ray_actor) is not None:
                ray.kill(actor, no_restart=True)

    def _sync(self, trials: list) -> None:
        for trial in trials:
            state = (trial.status, dict(trial.config))
            if self.sent.get(trial.trial_id) != state:
                self.sent[trial.trial_id] = state
                error = None
                if trial.status == TrialStatus.ERROR:
                    error = self.errors.get(trial.trial_id) or _error_text(trial)
                self.out.trial(trial.trial_id, trial.status, state[1], error)
        # A paused or pending trial is a clone restarting (the whole population runs at
        # once when trials are aligned): it will be back, so it counts as running.
        running = sorted(t.trial_id for t in trials if TrialStatus(t.status).is_live())
        if self.population is not None and running != self.running:
            self.running = running
            self.population.set_running.remote(running)


def trial_failure(trial) -> Failure:
    """The trial's root exception first, then its frames, the user's first. Tune has
    just written the error to the trial's local directory (storage gets it later)."""
    path = getattr(trial, "pickled_error_file", None)
    try:
        if path and Path(path).is_file():
            return classify(cloudpickle.loads(Path(path).read_bytes()))
    except Exception:  # noqa: BLE001 - an unreadable pickle: fall back to the text file
        pass
    path = getattr(trial, "error_file", None)
    text = readable(Path(path).read_text(errors="replace")) if path and Path(path).is_file() else ""
    return Failure(FailureCause.USER_CODE, "the trial failed", text or "no error text recorded")


def _error_text(trial) -> str:
    failure = trial_failure(trial)
    return f"{failure.message}\n\n{failure.traceback}"[:ERROR_TAIL_CHARS]
