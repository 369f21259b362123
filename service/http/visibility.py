"""What a caller sees of records addressed by more than a job id: the bulk cancel (each
id outside the caller's writable projects is refused as not found, or as a viewer's) and
a webhook subscription's deliveries (a job's subscription is its job's; the server's
own are the server admin's)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from api.errors import job_not_found
from api.schemas import CancelRefusal
from service.db.models import JobRow
from service.job_reads import JobReads
from service.tenancy.caller import Caller


def writable_ids(sessions: sessionmaker, ids: list[str], caller: Caller) -> tuple[list[str], list[CancelRefusal]]:
    """Of a bulk cancel's ids, those the caller may cancel, and a refusal for each other."""
    with sessions() as s:
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
    return allowed, refused


def subscription_visible(reads: JobReads, subscription: str, caller: Caller) -> bool:
    """Whether the caller may read a subscription's deliveries: ``server:<name>`` is the
    server admin's; ``<job id>-<n>`` belongs to whoever reads that job."""
    if caller.admin:
        return True
    if subscription.startswith("server:"):
        return False
    job_id = subscription.rsplit("-", 1)[0]
    project = reads.project_of(job_id)
    return project is not None and caller.can_read(project)
