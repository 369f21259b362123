"""The lifecycle's moves, counted once they are committed: ``lifecycle.transition`` (the
one status writer) calls ``moved`` inside its transaction, and what it noted is counted
when that transaction commits and forgotten if it rolls back, so a move another writer
won, or a rolled-back batch, is never counted.

Admission wait is read from the job's ``queued_at``; start-up time from when this process
saw the job admitted (a move to STARTING made by another process, or before a restart,
is not timed)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

from sqlalchemy import event
from sqlalchemy.orm import Session

from api.schemas import JobStatus
from service.telemetry.instruments import ADMISSION_WAIT, FAILURES, FINISHED, RETRIES, STARTUP

_KEY = "raydock.telemetry"
MAX_STARTING = 100_000  # admissions remembered for their start-up time (one per starting job)
_admitted: dict[str, float] = {}  # job id -> monotonic time it was admitted
_lock = threading.Lock()


def moved(
    session: Session,
    *,
    job_id: str,
    kind: str,
    current: JobStatus,
    target: JobStatus,
    cause: str | None = None,
    queued_at: datetime | None = None,
) -> None:
    session.info.setdefault(_KEY, []).append((job_id, kind, current, target, cause, queued_at))


def _count(job_id: str, kind: str, current: JobStatus, target: JobStatus, cause, queued_at) -> None:
    now = time.monotonic()
    if target == JobStatus.STARTING:
        if queued_at is not None:
            waited = (
                datetime.now(timezone.utc) - (queued_at if queued_at.tzinfo else queued_at.replace(tzinfo=timezone.utc))
            ).total_seconds()
            ADMISSION_WAIT.labels(kind).observe(max(waited, 0.0))
        with _lock:
            if len(_admitted) < MAX_STARTING:
                _admitted[job_id] = now
    elif target == JobStatus.RUNNING:
        with _lock:
            since = _admitted.pop(job_id, None)
        if since is not None:
            STARTUP.labels(kind).observe(now - since)
    elif target in (JobStatus.QUEUED, JobStatus.WAITING) and current in (JobStatus.FAILED, JobStatus.CANCELLED):
        RETRIES.labels("resume").inc()
    if target.is_terminal():
        with _lock:
            _admitted.pop(job_id, None)
        FINISHED.labels(kind, target.value, (cause or "") if target == JobStatus.FAILED else "").inc()
        if target == JobStatus.FAILED:
            FAILURES.labels(kind, cause or "INFRASTRUCTURE").inc()


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    for noted in session.info.pop(_KEY, ()):
        _count(*noted)


@event.listens_for(Session, "after_soft_rollback")
def _rolled_back(session: Session, previous_transaction) -> None:
    if previous_transaction.parent is None:  # the outermost transaction: nothing it noted happened
        session.info.pop(_KEY, None)
