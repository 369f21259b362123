"""Routes of project quotas and usage accounting: set and read a project's quota, and
the CPU- and GPU-seconds used by project over a time range."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.schemas import PROJECT_RE, QuotaPublic, QuotaSpec, UsagePublic
from service.attempts import ACTIVE
from service.db.models import aware
from service.eventlog.log import record
from service.http.deps import Actor, AppSettings, QuotaAdmin, Store
from service.http.openapi import errors
from service.tenancy import quotas, usage

router = APIRouter(tags=["projects"])

Project = Annotated[str, Path(pattern=PROJECT_RE, max_length=63, description="The project slug.")]
Instant = Annotated[datetime | None, Query(description="ISO 8601 date-time (UTC when no offset is given).")]
ProjectFilter = Annotated[str | None, Query(pattern=PROJECT_RE, max_length=63, description="Only this project.")]


@router.get("/projects/{project}/quota", response_model=QuotaPublic, operation_id="get_quota", responses=errors(422))
def get_quota(project: Project, sessions: Store, settings: AppSettings) -> QuotaPublic:
    with sessions() as s:
        return quotas.public(s, project, ACTIVE, settings.default_quota, settings.fair_share_half_life_s)


@router.put("/projects/{project}/quota", response_model=QuotaPublic, operation_id="set_quota", responses=errors(422))
def set_quota(
    project: Project, body: QuotaSpec, sessions: Store, settings: AppSettings, actor: Actor, _admin: QuotaAdmin
) -> QuotaPublic:
    """Set a project's quota (the whole quota: a field left out is no limit, or a guarantee of 0)."""
    with sessions.begin() as s:
        quotas.set_quota(s, project, body)
        record(s, "quota_set", actor=actor, project=project, **body.model_dump())
    return get_quota(project, sessions, settings)


@router.get("/usage", response_model=UsagePublic, operation_id="get_usage", responses=errors(422))
def get_usage(
    sessions: Store, since: Instant = None, until: Instant = None, project: ProjectFilter = None
) -> UsagePublic:
    """CPU- and GPU-seconds by project within [since, until] (each attempt in proportion to
    its running time inside the range)."""
    since, until = since and aware(since), until and aware(until)
    with sessions() as s:
        return usage.report(s, since, until, project)
