"""Job status, its legal moves, and why a job failed. Status changes here and nowhere
else; Ray's job statuses map to ours in exactly one place (``decide``).

Every change is compare-and-set: ``UPDATE jobs ... WHERE id = :id AND status = :expected``.
A cancel and the monitor can race; the loser's write changes nothing, ``transition``
returns False and the job object shows the winner's status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from api.schemas import FailureCause, JobStatus
from service.db.models import JobRow, TransitionRow, utcnow
from service.eventlog.log import SYSTEM, record
from service.stored import phases
from service.telemetry import transitions as telemetry
from service.tenancy import usage

S = JobStatus
C = FailureCause
LEGAL: dict[JobStatus, set[JobStatus]] = {
    # Waits for its dependencies (service/pipelines/): queued once they ended as asked, else stopped.
    S.WAITING: {S.QUEUED, S.CANCELLED, S.FAILED},
    S.QUEUED: {S.STARTING, S.CANCELLED, S.FAILED},
    S.STARTING: {S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLING, S.CANCELLED},
    S.RUNNING: {S.SUCCEEDED, S.FAILED, S.CANCELLING, S.CANCELLED, S.PREEMPTED},
    # Preempted: it checkpoints, its Ray job is stopped, and it waits in the queue again.
    S.PREEMPTED: {S.QUEUED, S.SUCCEEDED, S.FAILED, S.CANCELLING, S.CANCELLED},
    S.CANCELLING: {S.CANCELLED, S.SUCCEEDED, S.FAILED},
    S.SUCCEEDED: set(),
    S.FAILED: {S.QUEUED, S.WAITING},  # resume: a new attempt from the last checkpoint (a step: after its own)
    S.CANCELLED: {S.QUEUED, S.WAITING},
}

# Where an attempt runs (and its usage is counted): leaving them ends its count.
RUNNING_STATES = frozenset({S.RUNNING, S.CANCELLING, S.PREEMPTED})

# The status reason of a failure by its cause; INFRASTRUCTURE says what Ray said instead.
FAILURE_REASON: dict[FailureCause, str] = {
    C.USER_CODE: "the training code raised an error",
    C.NO_RESOURCES: "the cluster could not provide the resources",
    C.INFRASTRUCTURE: "the job driver failed",
    C.TIMEOUT: "exceeded max_runtime_s",
}
# Causes a job's own events may state; TIMEOUT (and a cancel) only the server decides.
EVENT_CAUSES = frozenset({C.USER_CODE, C.NO_RESOURCES, C.INFRASTRUCTURE})

_LIFECYCLE_FIELDS = (
    "status",
    "status_reason",
    "started_at",
    "finished_at",
    "queued_at",
    "attempt_started_at",
    "start_phases",
    "failure_cause",
    "error",
)


class IllegalTransition(Exception):
    def __init__(self, job_id: str, current: JobStatus, target: JobStatus):
        super().__init__(f"job {job_id} cannot move from {current.value} to {target.value}")
        self.job_id, self.current, self.target = job_id, current, target

    def __reduce__(self):
        return (IllegalTransition, (self.job_id, self.current, self.target))


def transition(
    session: Session,
    job: JobRow,
    target: JobStatus,
    *,
    reason: str | None = None,
    cause: FailureCause | None = None,
    error: str | None = None,
    also: dict[str, Any] | None = None,
    actor: str = SYSTEM,
) -> bool:
    """Move ``job`` from the status it was read in to ``target``, if it is still in it,
    writing the columns in ``also`` with it (or not at all). Returns False (and changes
    nothing) when the job is already there or another writer moved it first; raises
    IllegalTransition for a move the lifecycle forbids. The move is logged (``status_changed``,
    by ``actor``) in the same transaction."""
    current = JobStatus(job.status)
    if current == target:
        return False
    if target not in LEGAL[current]:
        raise IllegalTransition(job.id, current, target)
    values = _values(target, reason, cause, error, also, first_start=job.started_at is None)
    ran_since = job.attempt_started_at if current in RUNNING_STATES and target not in RUNNING_STATES else None
    session.flush()  # the job's other pending changes go first, under the same transaction
    result = session.execute(
        update(JobRow).where(JobRow.id == job.id, JobRow.status == current.value).values(**values),
        execution_options={"synchronize_session": False},
    )
    if result.rowcount != 1:
        session.refresh(job, attribute_names=list({*_LIFECYCLE_FIELDS, *(also or {})}))
        return False
    for key, value in values.items():
        set_committed_value(job, key, value)
    if ran_since is not None:  # the attempt's last stretch, in the transaction that ends it
        usage.accrue(session, job, values.get("finished_at") or utcnow(), attempt_started_at=ran_since)
    session.add(TransitionRow(job_id=job.id, from_status=current.value, to_status=target.value, reason=reason))
    telemetry.moved(
        session,
        job_id=job.id,
        kind=job.kind,
        current=current,
        target=target,
        cause=values.get("failure_cause"),
        queued_at=job.queued_at if target == S.STARTING else None,
    )
    _log(session, job.id, current, target, reason, values.get("failure_cause"), actor, job.attempt)
    return True


def _log(
    session: Session,
    job_id: str,
    current: JobStatus,
    target: JobStatus,
    reason: str | None,
    cause: str | None,
    actor: str,
    attempt: int | None,
) -> None:
    """The event-log rows of one move: ``status_changed``, and ``started`` when an attempt starts running."""
    cause = cause if target == S.FAILED else None
    moved = {"from": current.value, "to": target.value, "reason": reason, "cause": cause}
    record(session, "status_changed", job_id=job_id, actor=actor, attempt=attempt, **moved)
    if target == S.RUNNING:
        record(session, "started", job_id=job_id, actor=actor, attempt=attempt)


def _values(
    target: JobStatus,
    reason: str | None,
    cause: FailureCause | None,
    error: str | None,
    also: dict[str, Any] | None,
    *,
    first_start: bool,
) -> dict[str, Any]:
    """The columns a move to ``target`` writes."""
    now = utcnow()
    values: dict[str, Any] = {**(also or {}), "status": target.value, "status_reason": reason}
    if target == S.RUNNING:
        values["attempt_started_at"] = now
        if first_start:
            values["started_at"] = now
    if target == S.QUEUED:
        values.update(queued_at=now, finished_at=None, failure_cause=None, error=None, attempt_started_at=None)
        values["start_phases"] = phases.fresh(now.timestamp())  # a new attempt's phases count from here
    if target == S.WAITING:  # a resumed step waits for its own again
        values.update(finished_at=None, failure_cause=None, error=None, attempt_started_at=None)
    if target.is_terminal():
        values["finished_at"] = now
    if target == S.FAILED:
        values["failure_cause"] = (cause or C.INFRASTRUCTURE).value
        values["error"] = error or reason
    return values


def transition_many(
    session: Session,
    job_ids: list[str],
    current: JobStatus,
    target: JobStatus,
    *,
    reason: str,
    also: dict[str, Any] | None = None,
    actor: str = SYSTEM,
) -> list[str]:
    """Move every job of ``job_ids`` still in ``current`` to ``target`` in one
    compare-and-set statement (e.g. a mass cancel of queued jobs); returns those moved.
    For moves whose columns depend on nothing but the target (not RUNNING)."""
    if target not in LEGAL[current] or target == S.RUNNING:
        raise IllegalTransition(job_ids[0] if job_ids else "-", current, target)
    values = _values(target, reason, None, None, also, first_start=False)
    session.flush()
    # Row locks in id order, as every writer of many jobs takes them: two such writers
    # wait for each other instead of deadlocking (PostgreSQL; SQLite has one writer).
    session.execute(
        select(JobRow.id)
        .where(JobRow.id.in_(job_ids), JobRow.status == current.value)
        .order_by(JobRow.id)
        .with_for_update()
    )
    rows = session.execute(
        update(JobRow)
        .where(JobRow.id.in_(job_ids), JobRow.status == current.value)
        .values(**values)
        .returning(JobRow.id, JobRow.kind),
        execution_options={"synchronize_session": False},
    ).all()
    moved = [job_id for job_id, _ in rows]
    session.add_all(
        TransitionRow(job_id=job_id, from_status=current.value, to_status=target.value, reason=reason)
        for job_id in moved
    )
    for job_id, kind in rows:
        telemetry.moved(session, job_id=job_id, kind=kind, current=current, target=target)
        _log(session, job_id, current, target, reason, None, actor, None)
    return moved


def fail(
    session: Session, job: JobRow, cause: FailureCause, error: str | None = None, *, reason: str | None = None
) -> bool:
    """FAILED with ``cause``; the reason defaults to the cause's."""
    return transition(session, job, S.FAILED, cause=cause, reason=reason or FAILURE_REASON[cause], error=error)


def record_cause(job: JobRow, cause: FailureCause, error: str) -> None:
    """Remember why a job is failing before its status follows (the driver reported an
    error, or the server stops it for running too long). A job being stopped keeps the
    reason it is stopped for."""
    if job.status == S.CANCELLING.value:
        return
    job.failure_cause, job.error = cause.value, error


STOPPING = (S.CANCELLING, S.PREEMPTED)  # the server is stopping its Ray job


def from_ray(ray_status: str, current: JobStatus) -> JobStatus:
    """Our status for a Ray job status, given where the job stands now."""
    match ray_status:
        case "PENDING":
            return current if current in STOPPING else S.STARTING
        case "RUNNING":
            return current if current in STOPPING else S.RUNNING
        case "SUCCEEDED":
            return S.SUCCEEDED
        case "FAILED":
            return S.FAILED
        case "STOPPED":
            return S.CANCELLED
    raise ValueError(f"unknown Ray job status {ray_status!r}")


# A preempted job's next attempt is prepared afresh: a new submission id and events token.
REQUEUE = {
    "submission_id": None,
    "events_token_hash": None,
    "queue_position": None,
    "preempt_deadline": None,
    "borrowed": False,
}


@dataclass(frozen=True)
class Decision:
    """What a Ray job status means for a job: the move to make (None: none), why, and
    for a failure its cause and error."""

    target: JobStatus | None
    reason: str | None = None
    cause: FailureCause | None = None
    error: str | None = None
    also: dict[str, Any] | None = None


def decide(job: JobRow, ray_status: str, ray_message: str | None, log_tail: str) -> Decision:
    """The one place a Ray job status becomes ours, with the failure cause the job
    recorded (an ``error`` event, a timeout) or INFRASTRUCTURE when it recorded none."""
    current = JobStatus(job.status)
    target = from_ray(ray_status, current)
    recorded = FailureCause(job.failure_cause) if job.failure_cause else None
    if target == S.FAILED:
        cause = recorded or C.INFRASTRUCTURE
        reason = FAILURE_REASON[cause]
        if cause == C.INFRASTRUCTURE:
            reason = (ray_message or reason).splitlines()[0] if (ray_message or "").strip() else reason
        return Decision(S.FAILED, reason, cause, job.error or ray_message or log_tail)
    if target == S.CANCELLED and current == S.PREEMPTED:
        return Decision(S.QUEUED, "preempted: back in the queue, resumes from its last checkpoint", also=REQUEUE)
    if target == S.CANCELLED and recorded == C.TIMEOUT:
        return Decision(S.FAILED, FAILURE_REASON[C.TIMEOUT], C.TIMEOUT, job.error)
    if target == S.CANCELLED:
        return Decision(S.CANCELLED, "cancelled")
    if target == S.SUCCEEDED:
        return Decision(S.SUCCEEDED, "training finished")
    if target == current or (current == S.RUNNING and target == S.STARTING):
        return Decision(None)
    return Decision(target, "driver running" if target == S.RUNNING else None)
