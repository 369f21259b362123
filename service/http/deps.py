"""The one way routes reach the server: ``Annotated`` dependencies for the job service,
the trial reads, the store and the API token, and the bounded path and query parameters
every route shares. Routes never touch ``request.app.state`` themselves.

Dependencies that only look something up (or compare a token) are ``async def``: FastAPI
runs a plain ``def`` dependency in a worker thread, and that hop costs more than the
lookup. One that reads the database (``existing_job``) stays a ``def``."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import sessionmaker

from api.errors import Unauthorized
from api.schemas import INT64_MAX
from service.code.packages import CodeStore
from service.db.listing import MAX_CURSOR_CHARS
from service.events.trials import TrialService
from service.http.downloads import DownloadGate
from service.jobs import JobService
from service.settings import Settings

# Ids raydock hands out (jobs "j" + hex, Ray Tune trial ids) fit this; anything else cannot exist.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


async def settings(request: Request) -> Settings:
    return request.app.state.settings


async def job_service(request: Request) -> JobService:
    return request.app.state.runtime.service


async def download_gate(request: Request) -> DownloadGate:
    return request.app.state.downloads


async def code_store(jobs: Annotated[JobService, Depends(job_service)]) -> CodeStore:
    return jobs.code


async def trial_service(jobs: Annotated[JobService, Depends(job_service)]) -> TrialService:
    return TrialService(jobs.sessions)


async def store(jobs: Annotated[JobService, Depends(job_service)]) -> sessionmaker:
    return jobs.sessions


AppSettings = Annotated[Settings, Depends(settings)]
Jobs = Annotated[JobService, Depends(job_service)]
Downloads = Annotated[DownloadGate, Depends(download_gate)]
Code = Annotated[CodeStore, Depends(code_store)]
Trials = Annotated[TrialService, Depends(trial_service)]
Store = Annotated[sessionmaker, Depends(store)]

JobId = Annotated[str, Path(pattern=ID_PATTERN, description="The job id (as returned by POST /v1/jobs).")]
TrialId = Annotated[
    str, Path(pattern=ID_PATTERN, description="The trial id (as listed by GET /v1/jobs/{job_id}/trials).")
]
CheckpointId = Annotated[
    int, Path(ge=0, le=INT64_MAX, description="The checkpoint id (as listed by GET /v1/jobs/{job_id}/checkpoints).")
]
Since = Annotated[int, Query(ge=-1, le=INT64_MAX, description="Only entries with seq > since; -1 for all.")]
Offset = Annotated[int, Query(ge=0, le=INT64_MAX, description="Characters (logs) or items (lists) to skip.")]
Cursor = Annotated[
    str | None,
    Query(
        max_length=MAX_CURSOR_CHARS, description="The `next` of the previous page; leave out to start at the newest."
    ),
]


def existing_job(jobs: Jobs, job_id: JobId) -> str:
    """The job id, once the job is known to exist: a streaming route must answer 404
    before its stream opens, since its body runs only after the 200 is sent."""
    jobs.get(job_id)
    return job_id


ExistingJobId = Annotated[str, Depends(existing_job)]


async def actor(settings: AppSettings) -> str:
    """Who is calling, as the event log names them: the holder of RAYDOCK_API_TOKEN
    (checked before any route runs), or a caller on loopback when no token is set."""
    return "api-token" if settings.api_token else "loopback"


Actor = Annotated[str, Depends(actor)]


async def quota_admin(who: Actor) -> str:
    """Who may set quotas: for now every caller the API lets in (the API token's holder);
    the one place a server-admin check goes once users and roles exist."""
    return who


QuotaAdmin = Annotated[str, Depends(quota_admin)]

_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <RAYDOCK_API_TOKEN>`.")


def token_matches(token: str | None, expected: str | None) -> bool:
    """Constant-time token check that refuses (instead of raising on) non-ASCII input."""
    if not token or not expected or not token.isascii():
        return False
    return secrets.compare_digest(token.encode(), expected.encode())


async def require_token(
    settings: AppSettings, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """The API token check, mounted on /v1 only when RAYDOCK_API_TOKEN is set (so the
    OpenAPI document names the bearer scheme exactly when the server asks for it)."""
    if credentials is None or not token_matches(credentials.credentials.strip(), settings.api_token):
        raise Unauthorized("Missing or wrong API token. Send 'Authorization: Bearer <RAYDOCK_API_TOKEN>'.")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for anything else."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token and token.isascii() else None
