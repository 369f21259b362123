"""Preemption: taking borrowed room back for a project under its guarantee.

A borrowed job chosen by admission (``fair_share.victims``) is moved RUNNING -> PREEMPTED
with its deadline (now + ``RAYDOCK_PREEMPTION_GRACE_S``) before anything else happens, so
a restarted server finishes what this one started. Then the job is told: a marker file in
its storage prefix (``preempt-<attempt>``, named to the driver in ``RAYDOCK_PREEMPT_URI``)
that the training loop checks as it trains and answers with a checkpoint
(``trainers/preemption.py``). The monitor stops the Ray job once that checkpoint is in,
or at the deadline; when Ray says it stopped, the job goes back to QUEUED
(``lifecycle.decide``) and its next attempt resumes from the last checkpoint. It is not a
failure and uses none of the job's retries.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from api.schemas import JobStatus
from service import lifecycle
from service.db.event_models import CheckpointRow
from service.db.leases import Fence
from service.db.models import JobRow, aware, utcnow
from service.eventlog.log import record
from service.files import storage

log = logging.getLogger("raydock.preemption")


def marker_uri(prefix: str, attempt: int) -> str:
    """Where an attempt's preemption marker goes (per attempt: a requeued job's next
    attempt never sees the last one's)."""
    return storage.join(prefix, marker_name(attempt))


def marker_name(attempt: int) -> str:
    return f"{storage.LAUNCH_DIR}/preempt-{attempt}"


class Preemptions:
    """``storage_path``: where the jobs' prefixes are (the markers go there); ``grace_s``:
    how long a preempted job has to checkpoint before its Ray job is stopped."""

    def __init__(self, sessions: sessionmaker, storage_path: str, grace_s: float):
        self.sessions = sessions
        self.storage_path = storage_path
        self.grace_s = grace_s
        self._told: set[tuple[str, int]] = set()  # markers written by this process

    def preempt(self, job_ids: list[str], for_job: str, for_project: str, fence: Fence | None = None) -> list[str]:
        """Move these borrowed jobs to PREEMPTED (the state first), then tell each; returns those moved.
        With ``fence`` (the monitor's lease), only while it is held (else LeaseLost, nothing moved)."""
        moved = []
        deadline = utcnow() + timedelta(seconds=self.grace_s)
        reason = (
            f"preempted: project {for_project} needs its guarantee back (job {for_job}); "
            f"checkpointing, then back in the queue (within {self.grace_s:g}s)"
        )
        with self.sessions.begin() as s:
            if fence is not None:
                fence.hold(s)
            for job_id in job_ids:
                job = s.get(JobRow, job_id)
                if job is None or job.status != JobStatus.RUNNING.value:
                    continue
                if lifecycle.transition(
                    s, job, JobStatus.PREEMPTED, reason=reason, also={"preempt_deadline": deadline}
                ):
                    record(s, "preempted", job_id=job_id, attempt=job.attempt, for_job=for_job, project=for_project)
                    moved.append((job_id, job.attempt))
        for job_id, attempt in moved:
            self.tell(job_id, attempt)
        return [m[0] for m in moved]

    def tell(self, job_id: str, attempt: int) -> None:
        """Write the attempt's marker (once per process: a restarted server writes it again)."""
        if (job_id, attempt) in self._told:
            return
        try:
            prefix = storage.job_prefix(self.storage_path, job_id)
            storage.write_private(prefix, marker_name(attempt), b"preempted\n")
            self._told.add((job_id, attempt))
        except OSError as exc:  # the deadline still stops it; the next tick tries again
            log.warning("job %s: could not write its preemption marker: %s", job_id, exc)

    def stop_due(self, job_id: str) -> bool:
        """Whether a PREEMPTED job's Ray job is to be stopped now: its checkpoint since the
        preemption is in, or its grace window is over. Tells the job again if need be."""
        with self.sessions() as s:
            job = s.get(JobRow, job_id)
            if job is None or job.preempt_deadline is None:
                return True
            attempt, deadline = job.attempt, aware(job.preempt_deadline)
            since = deadline - timedelta(seconds=self.grace_s)
            saved = s.scalar(
                select(CheckpointRow.id)
                .where(
                    CheckpointRow.job_id == job_id, CheckpointRow.attempt == attempt, CheckpointRow.created_at >= since
                )
                .limit(1)
            )
        self.tell(job_id, attempt)
        return saved is not None or utcnow() >= deadline
