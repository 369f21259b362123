"""The queue in SQL: the typed columns admission reads (filled once, at submit), the
queue order, the stored queue position, and the reads the monitor's admission makes.
Nothing here parses a spec except ``typed_columns`` (at submit, or once for a job
stored before the columns existed)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select, update
from sqlalchemy.orm import Session

from api.schemas import JobSpec, JobStatus
from service import admission
from service.store import JobLabelRow, JobRow, aware

QUEUED = JobStatus.QUEUED.value
HEAD_BATCH = 64  # rows fetched at a time while admission walks the head of the queue


def typed_columns(spec: JobSpec) -> dict[str, Any]:
    """What admission and the monitor need of a spec, as plain columns."""
    cpus, gpus = admission.demand(spec)
    holds_cpus, holds_gpus = admission.holds(spec)
    return {
        "demand_cpus": cpus,
        "demand_gpus": gpus,
        "holds_cpus": holds_cpus,
        "holds_gpus": holds_gpus,
        "priority": getattr(spec, "priority", 0),
        "scheduling_timeout_s": spec.scheduling_timeout_s,
        "max_runtime_s": spec.max_runtime_s,
    }


def label_rows(job_id: str, labels: dict[str, str]) -> list[JobLabelRow]:
    return [JobLabelRow(job_id=job_id, key=k, value=v) for k, v in labels.items()]


def waiting() -> Select:
    """Queued jobs not being submitted (a job whose submission id is fixed holds its
    resources already and is no longer in line)."""
    return select(JobRow.id).where(JobRow.status == QUEUED, JobRow.submission_id.is_(None))


def in_order(query: Select) -> Select:
    """The one queue order: priority first (higher first), then arrival, then id."""
    return query.order_by(JobRow.priority.desc(), JobRow.queued_at, JobRow.id)


def _queued(row) -> admission.Queued:
    at = aware(row.queued_at) if row.queued_at else None
    return admission.Queued(row.id, row.demand_cpus, row.demand_gpus, at, row.scheduling_timeout_s, row.status_reason)


_QUEUED_COLUMNS = (JobRow.id, JobRow.priority, JobRow.demand_cpus, JobRow.demand_gpus, JobRow.queued_at, JobRow.scheduling_timeout_s, JobRow.status_reason)


def head(s: Session, skip: set[str]) -> Iterator[admission.Queued]:
    """The waiting jobs in queue order, read a few at a time: admission stops at the
    first that does not fit, so a tick reads the head of the queue, not all of it."""
    after: tuple | None = None
    while True:
        q = in_order(select(*_QUEUED_COLUMNS).where(JobRow.status == QUEUED, JobRow.submission_id.is_(None)))
        if after is not None:
            q = q.where(_after_in_order(*after))
        rows = s.execute(q.limit(HEAD_BATCH)).all()
        for row in rows:
            if row.id not in skip:
                yield _queued(row)
        if len(rows) < HEAD_BATCH:
            return
        after = (rows[-1].priority, rows[-1].queued_at, rows[-1].id)


def _after_in_order(priority: int, queued_at: datetime | None, job_id: str):
    """Rows after (priority, queued_at, id) in queue order (priority descending)."""
    if queued_at is None:  # NULL sorts first (SQLite) or last (Postgres): only the id breaks ties then
        return (JobRow.priority < priority) | ((JobRow.priority == priority) & (JobRow.id > job_id))
    same_time_later = (JobRow.queued_at == queued_at) & (JobRow.id > job_id)
    return (JobRow.priority < priority) | ((JobRow.priority == priority) & ((JobRow.queued_at > queued_at) | same_time_later))


def with_deadline(s: Session) -> list[admission.Queued]:
    """Waiting jobs that have a scheduling deadline (few: most jobs set none)."""
    q = select(*_QUEUED_COLUMNS).where(JobRow.status == QUEUED, JobRow.submission_id.is_(None), JobRow.scheduling_timeout_s.is_not(None))
    return [_queued(r) for r in s.execute(q)]


def never_fit(s: Session, max_cpus: float, max_gpus: float) -> list[str]:
    """Waiting jobs larger than the cluster can ever be."""
    eps = admission.EPS
    too_big = (JobRow.demand_cpus > max_cpus + eps) | (JobRow.demand_gpus > max_gpus + eps)
    return list(s.scalars(waiting().where(too_big)))


def untyped(s: Session, statuses: tuple[str, ...]) -> list[tuple[str, dict]]:
    """Jobs stored before the typed columns existed: (id, spec)."""
    return [tuple(r) for r in s.execute(select(JobRow.id, JobRow.spec).where(JobRow.status.in_(statuses), JobRow.demand_cpus.is_(None)))]


def held(s: Session, active: tuple[str, ...]) -> list[admission.Resources]:
    """What the started jobs, and those being submitted, hold."""
    being_submitted = (JobRow.status == QUEUED) & JobRow.submission_id.is_not(None)
    q = select(JobRow.holds_cpus, JobRow.holds_gpus).where(JobRow.status.in_(active) | being_submitted, JobRow.holds_cpus.is_not(None))
    return [(r.holds_cpus, r.holds_gpus) for r in s.execute(q)]


def tell_the_rest(s: Session, reason: str, exclude: set[str]) -> int:
    """Give every waiting job not in ``exclude`` this status reason, writing only the
    rows whose reason differs; returns how many changed."""
    differs = JobRow.status_reason.is_(None) | (JobRow.status_reason != reason)
    q = update(JobRow).where(JobRow.status == QUEUED, JobRow.submission_id.is_(None), differs)
    if exclude:
        q = q.where(JobRow.id.not_in(exclude))
    return s.execute(q.values(status_reason=reason), execution_options={"synchronize_session": False}).rowcount


def store_positions(s: Session) -> int:
    """Write each waiting job's 1-based place in the queue, in one statement that
    changes only the rows whose place moved; returns how many moved."""
    order = (JobRow.priority.desc(), JobRow.queued_at, JobRow.id)
    ranked = (
        select(JobRow.id.label("id"), func.row_number().over(order_by=order).label("pos"))
        .where(JobRow.status == QUEUED, JobRow.submission_id.is_(None))
        .subquery()
    )
    moved = update(JobRow).where(JobRow.id == ranked.c.id, JobRow.queue_position.is_distinct_from(ranked.c.pos))
    n = s.execute(moved.values(queue_position=ranked.c.pos), execution_options={"synchronize_session": False}).rowcount
    # Those being submitted are out of line.
    out = update(JobRow).where(JobRow.status == QUEUED, JobRow.submission_id.is_not(None), JobRow.queue_position.is_not(None))
    s.execute(out.values(queue_position=None), execution_options={"synchronize_session": False})
    return n
