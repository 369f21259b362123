"""What one job's events may store. Each kind of row a job's events make (metric reports,
trial reports, trials, worker-group starts, checkpoints, exploits) is capped per job, on a
counter kept on the job row, so checking a bound never counts a table. An event past a
bound is dropped and counted on the job like any refused event, its reason naming the
setting to raise. A job record lists only its newest worker restarts and counts them all,
so no job row grows with what its workers send.
"""

from __future__ import annotations

from typing import Any

from service.settings.events import EventSettings

MAX_RESTART_REASON = 1000  # characters of a worker failure kept on the job record


class Dropped(Exception):
    """An event refused; its message is the reason stored on the job."""


# kind -> (the job row's counter, the events setting that bounds it, what it counts)
_COUNTERS = {
    "metrics": ("metrics_stored", "max_metrics_per_job", "metric reports"),
    "trial_reports": ("trial_metrics_stored", "max_trial_reports_per_job", "trial reports"),
    "trials": ("trials_stored", "max_trials_per_job", "trials"),
    "worker_groups": ("worker_groups_stored", "max_worker_groups_per_job", "worker-group starts"),
    "checkpoints": ("checkpoints_stored", "max_checkpoints_per_job", "checkpoints"),
    "exploits": ("exploits_stored", "max_exploits_per_job", "exploits"),
}


def room(limits: EventSettings, job: Any, kind: str) -> None:
    """Raise ``Dropped`` when the job already stores as many rows of ``kind`` as allowed."""
    column, field, what = _COUNTERS[kind]
    cap = getattr(limits, field)
    if (getattr(job, column) or 0) >= cap:
        raise Dropped(
            f"the job already stores {cap} {what}, the most {limits.env_name(field)} allows; this event was not stored"
        )


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
