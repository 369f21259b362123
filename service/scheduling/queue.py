"""The queue in SQL: the typed columns admission reads (filled once, at submit), the
queue order, the stored queue position, and the reads the monitor's admission makes.
Nothing here parses a spec except ``typed_columns`` (at submit, or once for a job
stored before the columns existed)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select, update
from sqlalchemy.orm import Session

from api.schemas import JobSpec, JobStatus
from service.db.models import JobRow, TransitionRow, aware
from service.scheduling import admission

QUEUED = JobStatus.QUEUED.value
HEAD_BATCH = 64  # rows fetched at a time while admission walks the head of the queue
FIRST_BATCH = 8  # the first read of a project's head: most passes stop at its first job


def typed_columns(spec: JobSpec) -> dict[str, Any]:
    """What admission and the monitor need of a spec, as plain columns."""
    cpus, gpus = admission.demand(spec)
    holds_cpus, holds_gpus = admission.holds(spec)
    lo, hi = admission.worker_range(spec) or (None, None)
    return {
        "demand_cpus": cpus,
        "demand_gpus": gpus,
        "holds_cpus": holds_cpus,
        "holds_gpus": holds_gpus,
        "demand_extra": admission.extra_demand(spec) or None,
        "holds_extra": admission.extra_holds(spec) or None,
        "min_workers": lo,
        "max_workers": hi,
        "priority": getattr(spec, "priority", 0),
        "scheduling_timeout_s": spec.scheduling_timeout_s,
        "max_runtime_s": spec.max_runtime_s,
    }


def in_order(query: Select) -> Select:
    """The one queue order: priority first (higher first), then arrival, then id."""
    return query.order_by(JobRow.priority.desc(), JobRow.queued_at, JobRow.id)


def _queued(row) -> admission.Queued:
    at = aware(row.queued_at) if row.queued_at else None
    return admission.Queued(
        row.id,
        row.demand_cpus,
        row.demand_gpus,
        at,
        row.scheduling_timeout_s,
        row.status_reason,
        extra=row.demand_extra or {},
        project=row.project,
        priority=row.priority,
        workers=(row.min_workers, row.max_workers) if row.min_workers and row.max_workers else None,
    )


_QUEUED_COLUMNS = (
    JobRow.id,
    JobRow.priority,
    JobRow.demand_cpus,
    JobRow.demand_gpus,
    JobRow.queued_at,
    JobRow.scheduling_timeout_s,
    JobRow.status_reason,
    JobRow.demand_extra,
    JobRow.project,
    JobRow.min_workers,
    JobRow.max_workers,
)


def head(s: Session, skip: set[str], project: str | None = None) -> Iterator[admission.Queued]:
    """The waiting jobs in queue order (of one ``project``, or all), read a few at a time:
    admission stops at the first that does not fit, so a tick reads the head of the queue,
    not all of it."""
    after: tuple | None = None
    batch = FIRST_BATCH if project is not None else HEAD_BATCH
    while True:
        q = in_order(select(*_QUEUED_COLUMNS).where(JobRow.status == QUEUED, JobRow.submission_id.is_(None)))
        if project is not None:
            q = q.where(JobRow.project == project)
        if after is not None:
            q = q.where(_after_in_order(*after))
        rows = s.execute(q.limit(batch)).all()
        for row in rows:
            if row.id not in skip:
                yield _queued(row)
        if len(rows) < batch:
            return
        after, batch = (rows[-1].priority, rows[-1].queued_at, rows[-1].id), HEAD_BATCH


def _after_in_order(priority: int, queued_at: datetime | None, job_id: str):
    """Rows after (priority, queued_at, id) in queue order (priority descending)."""
    if queued_at is None:  # NULL sorts first (SQLite) or last (Postgres): only the id breaks ties then
        return (JobRow.priority < priority) | ((JobRow.priority == priority) & (JobRow.id > job_id))
    same_time_later = (JobRow.queued_at == queued_at) & (JobRow.id > job_id)
    return (JobRow.priority < priority) | (
        (JobRow.priority == priority) & ((JobRow.queued_at > queued_at) | same_time_later)
    )


def _before_in_order(priority: int, queued_at: datetime, job_id: str):
    """Rows before (priority, queued_at, id) in queue order."""
    same_time_earlier = (JobRow.queued_at == queued_at) & (JobRow.id < job_id)
    return (JobRow.priority > priority) | (
        (JobRow.priority == priority) & ((JobRow.queued_at < queued_at) | same_time_earlier)
    )


def with_deadline(s: Session) -> list[admission.Queued]:
    """Waiting jobs that have a scheduling deadline (few: most jobs set none)."""
    q = select(*_QUEUED_COLUMNS).where(
        JobRow.status == QUEUED, JobRow.scheduling_timeout_s.is_not(None), JobRow.submission_id.is_(None)
    )
    return [_queued(r) for r in s.execute(q)]


def never_fit(s: Session, max_cpus: float, max_gpus: float) -> list[str]:
    """Queued jobs larger than the cluster can ever be (read from an index alone)."""
    eps = admission.EPS
    too_big = (JobRow.demand_cpus > max_cpus + eps) | (JobRow.demand_gpus > max_gpus + eps)
    return list(s.scalars(select(JobRow.id).where(JobRow.status == QUEUED, too_big)))


def untyped(s: Session, statuses: tuple[str, ...]) -> list[tuple[str, dict]]:
    """Jobs stored before the typed columns existed: (id, spec)."""
    return [
        tuple(r)
        for r in s.execute(
            select(JobRow.id, JobRow.spec).where(JobRow.status.in_(statuses), JobRow.demand_cpus.is_(None))
        )
    ]


def _submitting(s: Session, *columns) -> list:
    # Only the few jobs being submitted have a submission id: their index finds them (the
    # status is checked here, so no plan reads the whole queue's index instead).
    rows = s.execute(select(JobRow.status, *columns).where(JobRow.submission_id > ""))  # a range SQLite's planner uses
    return [r for r in rows if r.status == QUEUED]


def in_flight(s: Session) -> list[str]:
    """Queued jobs whose submit is under way (or was cut short): their submission id is fixed."""
    return [r.id for r in _submitting(s, JobRow.id)]


def held(
    s: Session, active: tuple[str, ...], starting: frozenset[str] = frozenset()
) -> tuple[list[admission.Resources], list[admission.Extra]]:
    """What the started jobs, those being submitted, and those this monitor is starting
    (``starting``: dispatched, whatever the store shows of them yet) hold: (CPUs, GPUs)
    each, and what the few that ask for more hold beyond them. Each job counts once."""
    columns = (JobRow.id, JobRow.holds_cpus, JobRow.holds_gpus, JobRow.holds_extra)
    rows = list(s.execute(select(*columns).where(JobRow.status.in_(active)))) + _submitting(s, *columns)
    if starting:
        rows += list(s.execute(select(*columns).where(JobRow.id.in_(starting))))
    rows = list({r.id: r for r in rows}.values())
    return (
        [(r.holds_cpus, r.holds_gpus) for r in rows if r.holds_cpus is not None],
        [r.holds_extra for r in rows if r.holds_extra],
    )


ENDED = (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value)
RELEASED_READ = 1000  # jobs ended since Ray's count read at most (more: the rest count as still held)


def released_since(s: Session, active: tuple[str, ...], since: datetime) -> admission.Resources:
    """What the jobs that ended after ``since`` held as they ended (those whose end left a
    status that holds): CPUs and GPUs that Ray's count of its usage made at ``since`` still
    counts as used. A job sent back to the queue is not among them (its end is not final)."""
    ended_holding = (
        select(TransitionRow.id)
        .where(
            TransitionRow.job_id == JobRow.id,
            TransitionRow.from_status.in_(active),
            TransitionRow.to_status.in_(ENDED),
            TransitionRow.at > since,
        )
        .exists()
    )
    rows = s.execute(
        select(JobRow.holds_cpus, JobRow.holds_gpus)
        .where(JobRow.status.in_(ENDED), JobRow.finished_at > since, ended_holding)
        .limit(RELEASED_READ)
    ).all()
    return sum(r.holds_cpus or 0.0 for r in rows), sum(r.holds_gpus or 0.0 for r in rows)


@dataclass(frozen=True)
class Marks:
    """Where the store stood: its newest job and newest status change. Jobs the queue has
    to look at again are those created or moved since."""

    newest_job: datetime | None
    newest_transition: int | None


def marks(s: Session) -> Marks:
    return Marks(s.scalar(select(func.max(JobRow.created_at))), s.scalar(select(func.max(TransitionRow.id))))


def touched_since(s: Session, before: Marks) -> set[str]:
    """Jobs created or moved (any status change) since ``before``, from two index ranges."""
    new = select(JobRow.id)  # None: the store had no job then, so every job is new
    if before.newest_job is not None:
        new = new.where(JobRow.created_at > before.newest_job)
    into_or_out_of_line = (TransitionRow.from_status == QUEUED) | (TransitionRow.to_status == QUEUED)
    moved = select(TransitionRow.job_id).where(TransitionRow.id > (before.newest_transition or 0), into_or_out_of_line)
    return set(s.scalars(new)) | set(s.scalars(moved))


def record_starts(s: Session, plan: admission.Plan) -> None:
    """What the jobs ``plan`` starts hold from now on: whether beyond their project's
    guarantee (``borrowed``), and an elastic job's grant with what it holds with it."""
    if plan.start:
        s.execute(update(JobRow).where(JobRow.id.in_(plan.start)).values(borrowed=False, granted_workers=None))
    if plan.borrowed:
        s.execute(update(JobRow).where(JobRow.id.in_(plan.borrowed)).values(borrowed=True))
    for job_id, (workers, cpus, gpus, extra) in plan.granted.items():
        held = {"granted_workers": workers, "holds_cpus": cpus, "holds_gpus": gpus, "holds_extra": extra or None}
        s.execute(update(JobRow).where(JobRow.id == job_id).values(**held))


def tell_the_rest(s: Session, reason: str, exclude: set[str], only: set[str] | None = None) -> int:
    """Give every waiting job not in ``exclude`` (or, with ``only``, those of ``only``)
    this status reason, writing only the rows whose reason differs; returns how many."""
    differs = JobRow.status_reason.is_(None) | (JobRow.status_reason != reason)
    where = [JobRow.status == QUEUED, JobRow.submission_id.is_(None), differs]
    if only is not None:
        if not only - exclude:
            return 0
        where.append(JobRow.id.in_(only - exclude))
    elif exclude:
        where.append(JobRow.id.not_in(exclude))
    if s.get_bind().dialect.name == "postgresql":  # row locks in id order (see lifecycle.transition_many)
        s.execute(select(JobRow.id).where(*where).order_by(JobRow.id).with_for_update())
    q = update(JobRow).where(*where).values(status_reason=reason)
    return s.execute(q, execution_options={"synchronize_session": False}).rowcount


def _places_before(s: Session, before) -> int:
    """How many wait ahead of a point of the queue. Nothing before it moved since the
    places were stored, so the last job before it holds the answer (read walking back
    from the end of the queue: a job queued at the end costs a step); counted if not."""
    waiting = (JobRow.status == QUEUED, JobRow.submission_id.is_(None), before)
    backwards = (JobRow.priority.asc(), JobRow.queued_at.desc(), JobRow.id.desc())
    last = s.execute(select(JobRow.queue_position).where(*waiting).order_by(*backwards).limit(1)).first()
    if last is None:
        return 0
    if last.queue_position is not None:
        return last.queue_position
    return s.scalar(select(func.count()).select_from(JobRow).where(*waiting))


def store_positions(s: Session, touched: set[str] | None = None) -> int:
    """Write each waiting job's 1-based place in the queue, only where it moved; returns
    how many moved. With ``touched`` (the jobs that entered or left the line since the
    places were last stored), only the places from the first of them on are ranked again:
    a job queued at the end moves no one."""
    line = select(JobRow.id, JobRow.queue_position).where(JobRow.status == QUEUED, JobRow.submission_id.is_(None))
    ahead = 0
    keys = (
        s.execute(select(JobRow.priority, JobRow.queued_at, JobRow.id).where(JobRow.id.in_(touched))).all()
        if touched
        else []
    )
    if keys and all(k.queued_at is not None for k in keys):
        first = min(keys, key=lambda k: (-k.priority, aware(k.queued_at), k.id))
        before = _before_in_order(first.priority, first.queued_at, first.id)
        ahead = _places_before(s, before)
        line = line.where(~before)
    elif touched is not None and not touched:
        line = None  # nothing entered or left the line
    # (touched jobs that are all gone, e.g. cancelled and then deleted before this pass,
    # may have left the line anywhere: the whole line is ranked again)
    moved = []
    if line is not None:
        for place, row in enumerate(s.execute(in_order(line)), start=ahead + 1):
            if row.queue_position != place:
                moved.append({"id": row.id, "queue_position": place})
    if moved:
        moved.sort(key=lambda m: m["id"])  # row locks in id order (see lifecycle.transition_many)
        s.execute(update(JobRow), moved)  # by primary key, many rows in one statement
    # Those being submitted are out of line.
    out = update(JobRow).where(JobRow.submission_id > "", JobRow.queue_position.is_not(None))
    s.execute(out.values(queue_position=None), execution_options={"synchronize_session": False})
    return len(moved)
