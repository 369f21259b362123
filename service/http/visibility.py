"""What a caller sees of records addressed by more than a job id: the bulk cancel (each
id outside the caller's writable projects is refused as not found, or as a viewer's) and
a webhook subscription's deliveries (a job's subscription is its job's; the server's
own are the server admin's)."""

from __future__ import annotations

from sqlalchemy import select

from api.errors import job_not_found
from api.schemas import CancelledJobs, CancelRefusal
from service.db.models import JobRow
from service.jobs import JobService
from service.tenancy.caller import Caller


def cancel_visible(jobs: JobService, ids: list[str], caller: Caller) -> CancelledJobs:
    if caller.admin:
        return jobs.cancel_many(ids, actor=caller.name)
    with jobs.sessions() as s:
        rows = s.execute(select(JobRow.id, JobRow.project).where(JobRow.id.in_(ids)))
        projects = {r.id: r.project for r in rows}
    allowed = [i for i in ids if i in projects and caller.can_write(projects[i])]
    refused = []
    for job_id in dict.fromkeys(ids):
        if job_id in allowed:
            continue
        if job_id in projects and caller.can_read(projects[job_id]):
            refused.append(CancelRefusal(id=job_id, code="forbidden_role", message="You are a viewer of its project."))
        else:
            err = job_not_found(job_id)
            refused.append(CancelRefusal(id=job_id, code=err.code, message=err.message))
    done = jobs.cancel_many(allowed, actor=caller.name) if allowed else CancelledJobs(cancelled=[], refused=[])
    return CancelledJobs(cancelled=done.cancelled, refused=done.refused + refused)


def subscription_visible(jobs: JobService, subscription: str, caller: Caller) -> bool:
    """Whether the caller may read a subscription's deliveries: ``server:<name>`` is the
    server admin's; ``<job id>-<n>`` belongs to whoever reads that job."""
    if caller.admin:
        return True
    if subscription.startswith("server:"):
        return False
    job_id = subscription.rsplit("-", 1)[0]
    project = jobs.project_of(job_id)
    return project is not None and caller.can_read(project)
