"""Usage accounting: CPU- and GPU-seconds per attempt (resources held x time running),
summed on the job, added to its project's decayed recent usage, and reported by project
over a time range.

An attempt counts from the moment it runs (``attempt_started_at``) to the moment it
leaves its running statuses; the monitor brings running attempts up to date every tick
(``accrue_running``) and the lifecycle counts the last stretch when the attempt ends
(``accrue``), in the transaction that ends it. What is counted is added to the project's
decayed figure through ``usage_pending`` (``bill``, on the monitor's tick, which knows the
half-life), so the status writer never needs the server's settings.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from api.schemas import UsagePublic, UsageRow
from service.db.models import JobRow, aware
from service.db.tenancy_models import JobUsageRow, ProjectUsageRow, UsagePendingRow
from service.scheduling.fair_share import decay


def accrue(
    s: Session,
    job: JobRow,
    until: datetime,
    *,
    attempt_started_at: datetime | None = None,
) -> tuple[float, float]:
    """Count ``job``'s current attempt up to ``until`` (from where it was counted to, or
    from when it started running); returns the CPU- and GPU-seconds added."""
    started = attempt_started_at or job.attempt_started_at
    if started is None:
        return 0.0, 0.0
    started = aware(started)
    since = aware(job.usage_as_of) if job.usage_as_of is not None else started
    since = max(since, started)
    seconds = max((until - since).total_seconds(), 0.0)
    cpus, gpus = job.holds_cpus or 0.0, job.holds_gpus or 0.0
    cpu_s, gpu_s = cpus * seconds, gpus * seconds
    job.cpu_seconds = (job.cpu_seconds or 0.0) + cpu_s
    job.gpu_seconds = (job.gpu_seconds or 0.0) + gpu_s
    job.usage_as_of = until
    row = s.get(JobUsageRow, (job.id, job.attempt))
    if row is None:
        row = JobUsageRow(
            job_id=job.id,
            attempt=job.attempt,
            project=job.project,
            cpus=cpus,
            gpus=gpus,
            started_at=started,
            until=until,
            cpu_seconds=0.0,
            gpu_seconds=0.0,
        )
        s.add(row)
    row.until, row.cpu_seconds, row.gpu_seconds = until, row.cpu_seconds + cpu_s, row.gpu_seconds + gpu_s
    if cpu_s or gpu_s:
        s.add(UsagePendingRow(project=job.project, cpu_seconds=cpu_s, gpu_seconds=gpu_s))
    return cpu_s, gpu_s


def accrue_running(s: Session, statuses: tuple[str, ...], now: datetime) -> int:
    """Bring every running attempt's count up to ``now``; returns how many."""
    jobs = s.scalars(select(JobRow).where(JobRow.status.in_(statuses), JobRow.attempt_started_at.is_not(None))).all()
    for job in jobs:
        accrue(s, job, now)
    return len(jobs)


def bill(s: Session, now: datetime, half_life_s: float) -> None:
    """Add what was counted since the last call to each project's decayed usage."""
    pending = s.execute(
        select(
            UsagePendingRow.project,
            func.sum(UsagePendingRow.cpu_seconds),
            func.sum(UsagePendingRow.gpu_seconds),
            func.max(UsagePendingRow.id),
        ).group_by(UsagePendingRow.project)
    ).all()
    if not pending:
        return
    for project, cpu_s, gpu_s, _ in pending:
        row = s.get(ProjectUsageRow, project)
        if row is None:
            s.add(ProjectUsageRow(project=project, cpu_seconds=cpu_s or 0.0, gpu_seconds=gpu_s or 0.0, as_of=now))
            continue
        as_of = aware(row.as_of)
        row.cpu_seconds = decay(row.cpu_seconds, as_of, now, half_life_s) + (cpu_s or 0.0)
        row.gpu_seconds = decay(row.gpu_seconds, as_of, now, half_life_s) + (gpu_s or 0.0)
        row.as_of = now
    s.execute(delete(UsagePendingRow).where(UsagePendingRow.id <= max(p[3] for p in pending)))


def decayed(s: Session, project: str, now: datetime, half_life_s: float) -> tuple[float, float]:
    row = s.get(ProjectUsageRow, project)
    if row is None:
        return 0.0, 0.0
    as_of = aware(row.as_of)
    return decay(row.cpu_seconds, as_of, now, half_life_s), decay(row.gpu_seconds, as_of, now, half_life_s)


def _overlap(start: datetime, end: datetime, since: datetime | None, until: datetime | None) -> float:
    """The share of [start, end] inside [since, until]."""
    whole = (end - start).total_seconds()
    lo, hi = max(start, since) if since else start, min(end, until) if until else end
    if whole <= 0:
        return 1.0 if (since is None or start >= since) and (until is None or start <= until) else 0.0
    return max((hi - lo).total_seconds(), 0.0) / whole


def report(
    s: Session,
    since: datetime | None,
    until: datetime | None,
    project: str | None,
    projects: list[str] | None = None,
) -> UsagePublic:
    """CPU- and GPU-seconds by project within [since, until]: each attempt's usage counts
    in proportion to the part of its running time inside the range. (By user too once jobs
    record their user; until then ``user`` is null.)"""
    q = select(JobUsageRow)
    if since is not None:
        q = q.where(JobUsageRow.until >= since)
    if until is not None:
        q = q.where(JobUsageRow.started_at <= until)
    if project is not None:
        q = q.where(JobUsageRow.project == project)
    if projects is not None:  # what the caller may see
        q = q.where(JobUsageRow.project.in_(projects))
    sums: dict[str, list] = {}
    for row in s.scalars(q):
        share = _overlap(aware(row.started_at), aware(row.until), since, until)
        acc = sums.setdefault(row.project, [0.0, 0.0, set()])
        acc[0] += row.cpu_seconds * share
        acc[1] += row.gpu_seconds * share
        acc[2].add(row.job_id)
    rows = [UsageRow(project=p, cpu_seconds=a[0], gpu_seconds=a[1], jobs=len(a[2])) for p, a in sorted(sums.items())]
    return UsagePublic(since=since, until=until, rows=rows)
