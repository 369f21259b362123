"""Project quotas in the store: read (a project's own row, else the server's default
quota), set, the submit-time ``max_queued`` check, and each project's load for admission
(a few grouped queries per pass, whatever the length of the queue)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.errors import QuotaExceeded
from api.schemas import JobStatus, QuotaPublic, QuotaSpec
from service.db.models import JobRow, aware, utcnow
from service.db.tenancy_models import ProjectQuotaRow, ProjectUsageRow
from service.scheduling.fair_share import ProjectLoad, Quota, Running, decay
from service.tenancy.usage import decayed

QUEUED = JobStatus.QUEUED.value
FIELDS = tuple(QuotaSpec.model_fields)


def to_quota(spec: QuotaSpec) -> Quota:
    return Quota(
        guaranteed_cpus=spec.guaranteed_cpus or 0.0,
        guaranteed_gpus=spec.guaranteed_gpus or 0.0,
        max_cpus=spec.max_cpus,
        max_gpus=spec.max_gpus,
        max_running=spec.max_running,
        max_queued=spec.max_queued,
    )


def _spec(row: ProjectQuotaRow) -> QuotaSpec:
    return QuotaSpec(**{f: getattr(row, f) for f in FIELDS})


def quota_specs(s: Session, projects: Iterable[str], default: QuotaSpec) -> dict[str, tuple[QuotaSpec, str]]:
    """Each project's quota and where it comes from (``project`` or ``default``)."""
    names = set(projects)
    rows = s.scalars(select(ProjectQuotaRow).where(ProjectQuotaRow.project.in_(names))) if names else []
    out = {name: (default, "default") for name in names}
    out.update({r.project: (_spec(r), "project") for r in rows})
    return out


def set_quota(s: Session, project: str, spec: QuotaSpec) -> None:
    row = s.get(ProjectQuotaRow, project)
    if row is None:
        row = ProjectQuotaRow(project=project)
        s.add(row)
    for f in FIELDS:
        setattr(row, f, getattr(spec, f))
    row.updated_at = utcnow()


def check_queue_room(s: Session, project: str, default: QuotaSpec) -> None:
    """Refuse a submit that would put more than ``max_queued`` jobs of ``project`` in the queue."""
    spec, _ = quota_specs(s, [project], default)[project]
    if spec.max_queued is None:
        return
    waiting = JobRow.status.in_((QUEUED, JobStatus.WAITING.value))  # a WAITING job joins the queue later
    queued = s.scalar(select(func.count()).where(waiting, JobRow.project == project))
    if queued + 1 > spec.max_queued:
        raise QuotaExceeded(
            f"project {project} uses {queued} of {spec.max_queued} queued jobs (quota max_queued). "
            "That is the project's quota, not a busy server: submit again once some of its queued jobs have "
            f"started, or cancel some; a server admin can raise it (raydock quota set {project} --max-queued N, "
            f"or PUT /v1/projects/{project}/quota).",
            details=[{"quota": "max_queued", "project": project, "used": queued, "limit": spec.max_queued}],
        )


def _held(s: Session, active: tuple[str, ...]):
    """(project, CPUs, GPUs, jobs) held by started jobs and those being submitted."""
    started = select(JobRow.project, func.sum(JobRow.holds_cpus), func.sum(JobRow.holds_gpus), func.count()).where(
        JobRow.status.in_(active)
    )
    rows = list(s.execute(started.group_by(JobRow.project)))
    submitting = select(JobRow.project, JobRow.holds_cpus, JobRow.holds_gpus, JobRow.status).where(
        JobRow.submission_id > ""
    )
    rows += [(r[0], r[1], r[2], 1) for r in s.execute(submitting) if r.status == QUEUED]
    return rows


def waiting_projects(s: Session) -> list[str]:
    """The projects with jobs in the queue: one index seek per project (a skip scan of
    ix_jobs_status_project), not a read of every queued row."""
    out: list[str] = []
    while True:
        q = select(func.min(JobRow.project)).where(JobRow.status == QUEUED)
        if out:
            q = q.where(JobRow.project > out[-1])
        project = s.scalar(q)
        if project is None:
            return out
        out.append(project)


def loads(
    s: Session, active: tuple[str, ...], default: QuotaSpec, half_life_s: float, now: datetime | None = None
) -> dict[str, ProjectLoad]:
    """Every project with a waiting or started job: its quota, what it holds, its decayed usage."""
    now = now or utcnow()
    held = _held(s, active)
    waiting = waiting_projects(s)
    names = set(waiting) | {r[0] for r in held}
    specs = quota_specs(s, names, default)
    out = {name: ProjectLoad(name, to_quota(specs[name][0])) for name in names}
    for project, cpus, gpus, n in held:
        load = out[project]
        load.cpus, load.gpus, load.running = load.cpus + (cpus or 0.0), load.gpus + (gpus or 0.0), load.running + n
    if names:
        for u in s.scalars(select(ProjectUsageRow).where(ProjectUsageRow.project.in_(names))):
            load = out[u.project]
            load.cpu_seconds = decay(u.cpu_seconds, aware(u.as_of), now, half_life_s)
            load.gpu_seconds = decay(u.gpu_seconds, aware(u.as_of), now, half_life_s)
    return out


def running(s: Session, statuses: tuple[str, ...]) -> list[Running]:
    """The started jobs preemption may choose from (read only when a project needs room)."""
    q = select(
        JobRow.id, JobRow.project, JobRow.holds_cpus, JobRow.holds_gpus, JobRow.attempt_started_at, JobRow.borrowed
    ).where(JobRow.status.in_(statuses))
    return [
        Running(
            r.id,
            r.project,
            r.holds_cpus or 0.0,
            r.holds_gpus or 0.0,
            r.attempt_started_at and aware(r.attempt_started_at),
            bool(r.borrowed),
        )
        for r in s.execute(q)
    ]


def public(s: Session, project: str, active: tuple[str, ...], default: QuotaSpec, half_life_s: float) -> QuotaPublic:
    spec, source = quota_specs(s, [project], default)[project]
    load = loads(s, active, default, half_life_s).get(project)
    if load is None:  # nothing waiting or running: its usage alone
        load = ProjectLoad(project)
        load.cpu_seconds, load.gpu_seconds = decayed(s, project, utcnow(), half_life_s)
    waiting = JobRow.status.in_((QUEUED, JobStatus.WAITING.value))  # a WAITING job joins the queue later
    queued = s.scalar(select(func.count()).where(waiting, JobRow.project == project))
    return QuotaPublic(
        **spec.model_dump(),
        project=project,
        source=source,
        cpus_in_use=load.cpus,
        gpus_in_use=load.gpus,
        running=load.running,
        queued=queued,
        decayed_cpu_seconds=load.cpu_seconds,
        decayed_gpu_seconds=load.gpu_seconds,
    )
