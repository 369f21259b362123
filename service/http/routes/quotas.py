"""Routes of project quotas and usage accounting: set and read a project's quota, and
the CPU- and GPU-seconds used by project over a time range."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BeforeValidator

from api.errors import project_not_found
from api.schemas import PROJECT_RE, QuotaPublic, QuotaSpec, UsagePublic
from service.attempts import ACTIVE
from service.db.models import aware
from service.eventlog.log import record
from service.http.deps import Actor, AppSettings, CurrentCaller, QuotaAdmin, Store
from service.http.openapi import errors
from service.tenancy import quotas, usage

router = APIRouter(tags=["projects"])

Project = Annotated[str, Path(pattern=PROJECT_RE, max_length=63, description="The project slug.")]


def _iso_only(value: object) -> object:
    """A date-time as ISO 8601 text: a bare number (which pydantic would read as Unix
    seconds) is refused, as the documented format says."""
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*", value):
        raise ValueError("give an ISO 8601 date-time, e.g. 2026-11-26T14:00:00Z")
    return value


Instant = Annotated[
    datetime | None,
    BeforeValidator(_iso_only),
    Query(description="ISO 8601 date-time (UTC when no offset is given)."),
]
ProjectFilter = Annotated[str | None, Query(pattern=PROJECT_RE, max_length=63, description="Only this project.")]


@router.get(
    "/projects/{project}/quota", response_model=QuotaPublic, operation_id="get_quota", responses=errors(404, 422)
)
def get_quota(project: Project, sessions: Store, settings: AppSettings, caller: CurrentCaller) -> QuotaPublic:
    """A project's quota and what it uses now (its members and viewers, and server admins)."""
    if not caller.can_read(project):
        raise project_not_found(project)
    with sessions() as s:
        return quotas.public(
            s, project, ACTIVE, settings.scheduling.default_quota, settings.scheduling.fair_share_half_life_s
        )


@router.put(
    "/projects/{project}/quota", response_model=QuotaPublic, operation_id="set_quota", responses=errors(403, 422)
)
def set_quota(
    project: Project,
    body: QuotaSpec,
    sessions: Store,
    settings: AppSettings,
    actor: Actor,
    _admin: QuotaAdmin,
    caller: CurrentCaller,
) -> QuotaPublic:
    """Set a project's quota (the whole quota: a field left out is no limit, or a guarantee of 0)."""
    with sessions.begin() as s:
        quotas.set_quota(s, project, body)
        record(s, "quota_set", actor=actor, project=project, **body.model_dump())
    return get_quota(project, sessions, settings, caller)


@router.get("/usage", response_model=UsagePublic, operation_id="get_usage", responses=errors(404, 422))
def get_usage(
    sessions: Store,
    caller: CurrentCaller,
    since: Instant = None,
    until: Instant = None,
    project: ProjectFilter = None,
) -> UsagePublic:
    """CPU- and GPU-seconds by project within [since, until] (each attempt in proportion to
    its running time inside the range): the caller's projects (a server admin: all)."""
    if project is not None and not caller.can_read(project):
        raise project_not_found(project)
    since, until = since and aware(since), until and aware(until)
    with sessions() as s:
        return usage.report(s, since, until, project, projects=caller.projects)
