"""Job status and its legal moves. Status changes here and nowhere else, and Ray's job
statuses map to ours in exactly one place (``from_ray``)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.schemas import FailureCause, JobStatus
from service.store import JobRow, TransitionRow, utcnow

S = JobStatus
LEGAL: dict[JobStatus, set[JobStatus]] = {
    S.QUEUED: {S.STARTING, S.CANCELLED, S.FAILED},
    S.STARTING: {S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLING, S.CANCELLED},
    S.RUNNING: {S.SUCCEEDED, S.FAILED, S.CANCELLING, S.CANCELLED},
    S.CANCELLING: {S.CANCELLED, S.SUCCEEDED, S.FAILED},
    S.SUCCEEDED: set(),
    S.FAILED: {S.QUEUED},  # resume: a new attempt from the last checkpoint
    S.CANCELLED: {S.QUEUED},
}


class IllegalTransition(Exception):
    def __init__(self, job_id: str, current: JobStatus, target: JobStatus):
        super().__init__(f"job {job_id} cannot move from {current.value} to {target.value}")
        self.current, self.target = current, target

    def __reduce__(self):
        return (IllegalTransition, (self.args[0].split()[1], self.current, self.target))


def transition(
    session: Session,
    job: JobRow,
    target: JobStatus,
    *,
    reason: str | None = None,
    cause: FailureCause | None = None,
    error: str | None = None,
) -> bool:
    """Move ``job`` to ``target``. Returns False (and changes nothing) when the job is
    already there; raises IllegalTransition for a move the lifecycle forbids."""
    current = JobStatus(job.status)
    if current == target:
        return False
    if target not in LEGAL[current]:
        raise IllegalTransition(job.id, current, target)
    job.status = target.value
    job.status_reason = reason
    now = utcnow()
    if target == S.RUNNING and job.started_at is None:
        job.started_at = now
    if target == S.QUEUED:
        job.queued_at = now
        job.finished_at = job.failure_cause = job.error = None
    if target.is_terminal():
        job.finished_at = now
    if target == S.FAILED:
        job.failure_cause = (cause or FailureCause.INFRASTRUCTURE).value
        job.error = error or reason
    session.add(TransitionRow(job_id=job.id, from_status=current.value, to_status=target.value, reason=reason))
    return True


def from_ray(ray_status: str, current: JobStatus) -> JobStatus:
    """Our status for a Ray job status, given where the job stands now."""
    match ray_status:
        case "PENDING":
            return current if current == S.CANCELLING else S.STARTING
        case "RUNNING":
            return current if current == S.CANCELLING else S.RUNNING
        case "SUCCEEDED":
            return S.SUCCEEDED
        case "FAILED":
            return S.FAILED
        case "STOPPED":
            return S.CANCELLED
    raise ValueError(f"unknown Ray job status {ray_status!r}")
