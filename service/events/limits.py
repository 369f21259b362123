"""What one job's events may store. Each kind of row a job's events make (metric reports,
trial reports, trials, worker-group starts, checkpoints, exploits) is capped per job, on a
counter kept on the job row, so checking a bound never counts a table. An event past a
bound is dropped and counted on the job like any refused event, its reason naming the
setting to raise. A job record lists only its newest worker restarts and counts them all,
so no job row grows with what its workers send.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_RESTART_REASON = 1000  # characters of a worker failure kept on the job record


class Dropped(Exception):
    """An event refused; its message is the reason stored on the job."""


@dataclass(frozen=True)
class EventLimits:
    metrics: int = 1_000_000
    trial_reports: int = 1_000_000
    trials: int = 10_000
    worker_groups: int = 10_000
    checkpoints: int = 100_000
    exploits: int = 100_000
    restarts_kept: int = 10
    log_events: int = 10_000  # event-log rows the job's own events make (service/eventlog/log.py)

    @classmethod
    def from_settings(cls, settings: Any) -> EventLimits:
        return cls(
            metrics=settings.max_metrics_per_job,
            trial_reports=settings.max_trial_reports_per_job,
            trials=settings.max_trials_per_job,
            worker_groups=settings.max_worker_groups_per_job,
            checkpoints=settings.max_checkpoints_per_job,
            exploits=settings.max_exploits_per_job,
            restarts_kept=settings.max_restarts_kept,
            log_events=settings.max_log_events_per_job,
        )


# kind -> (the job row's counter, the setting that bounds it, what it counts)
_COUNTERS = {
    "metrics": ("metrics_stored", "RAYDOCK_MAX_METRICS_PER_JOB", "metric reports"),
    "trial_reports": ("trial_metrics_stored", "RAYDOCK_MAX_TRIAL_REPORTS_PER_JOB", "trial reports"),
    "trials": ("trials_stored", "RAYDOCK_MAX_TRIALS_PER_JOB", "trials"),
    "worker_groups": ("worker_groups_stored", "RAYDOCK_MAX_WORKER_GROUPS_PER_JOB", "worker-group starts"),
    "checkpoints": ("checkpoints_stored", "RAYDOCK_MAX_CHECKPOINTS_PER_JOB", "checkpoints"),
    "exploits": ("exploits_stored", "RAYDOCK_MAX_EXPLOITS_PER_JOB", "exploits"),
}


def room(limits: EventLimits, job: Any, kind: str) -> None:
    """Raise ``Dropped`` when the job already stores as many rows of ``kind`` as allowed."""
    column, setting, what = _COUNTERS[kind]
    cap = getattr(limits, kind)
    if (getattr(job, column) or 0) >= cap:
        raise Dropped(f"the job already stores {cap} {what}, the most {setting} allows; this event was not stored")


def stored(job: Any, kind: str) -> None:
    """Count one more row of ``kind`` on the job."""
    column = _COUNTERS[kind][0]
    setattr(job, column, (getattr(job, column) or 0) + 1)


def add_restart(job: Any, attempt: int, at: float, reason: str, keep: int) -> None:
    """Record a worker failure: the newest ``keep`` stay listed, every one is counted.
    The same failure seen on both channels (log and push) is recorded once."""
    entry = {"attempt": attempt, "at": at, "reason": reason[:MAX_RESTART_REASON]}
    kept = list(job.restarts or [])
    if entry in kept:
        return
    job.restarts = [*kept, entry][-keep:]
    job.restarts_total = max(job.restarts_total or 0, len(kept)) + 1
