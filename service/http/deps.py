"""The one way routes reach the server: ``Annotated`` dependencies for the parts the
composition root built (``service/runtime.py``): the job commands and reads, the events
pushes, the cluster, the code store, the trial reads, the store, users, projects and the
replicas' leases; the
caller (``CurrentCaller``, decided by the request guard) and the job ids it may read
(``JobId``) or change (``WritableJobId``); and the bounded path and query parameters every
route shares. Routes never touch ``request.app.state`` themselves.

Dependencies that only look something up (or compare a token) are ``async def``: FastAPI
runs a plain ``def`` dependency in a worker thread, and that hop costs more than the
lookup. One that reads the database (``existing_job``) stays a ``def``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import sessionmaker

from api.errors import Unauthorized, admin_only, job_not_found
from api.schemas import INT64_MAX
from service.cluster.ray_backend import RayBackend
from service.code.packages import CodeStore
from service.db.leases import Leases
from service.db.listing import MAX_CURSOR_CHARS
from service.events.push import Pushes
from service.events.reads.trials import TrialService
from service.health import Health
from service.http.auth import UNAUTHORIZED, bearer_token, token_matches  # noqa: F401  (routes read the last two here)
from service.http.downloads import DownloadGate
from service.http.follow import Follow
from service.http.shares import Shares
from service.job_reads import JobReads
from service.jobs import JobCommands
from service.pipelines.commands import Pipelines
from service.schedules.commands import Schedules
from service.settings import Settings
from service.tenancy.caller import Caller
from service.tenancy.projects import Projects
from service.tenancy.users import Users

# Ids raydock hands out (jobs "j" + hex, Ray Tune trial ids) fit this; anything else cannot exist.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


async def settings(request: Request) -> Settings:
    return request.app.state.settings


async def job_commands(request: Request) -> JobCommands:
    return request.app.state.runtime.jobs


async def job_reads(request: Request) -> JobReads:
    return request.app.state.runtime.reads


async def pushes(request: Request) -> Pushes:
    return request.app.state.runtime.pushes


async def cluster(request: Request) -> RayBackend:
    return request.app.state.runtime.backend


async def download_gate(request: Request) -> DownloadGate:
    return request.app.state.downloads


async def code_store(request: Request) -> CodeStore:
    return request.app.state.runtime.code


async def store(request: Request) -> sessionmaker:
    return request.app.state.runtime.sessions


async def trial_service(sessions: Annotated[sessionmaker, Depends(store)]) -> TrialService:
    return TrialService(sessions)


async def users(request: Request) -> Users:
    return request.app.state.runtime.users


async def projects(request: Request) -> Projects:
    return request.app.state.runtime.projects


async def leases(request: Request) -> Leases:
    return request.app.state.runtime.leases


async def health(request: Request) -> Health:
    return request.app.state.runtime.health


async def schedules(request: Request) -> Schedules:
    return request.app.state.runtime.schedules


async def pipelines(request: Request) -> Pipelines:
    return request.app.state.runtime.pipelines


AppSettings = Annotated[Settings, Depends(settings)]
Jobs = Annotated[JobCommands, Depends(job_commands)]
Reads = Annotated[JobReads, Depends(job_reads)]
PushesDep = Annotated[Pushes, Depends(pushes)]
Cluster = Annotated[RayBackend, Depends(cluster)]
Downloads = Annotated[DownloadGate, Depends(download_gate)]
Code = Annotated[CodeStore, Depends(code_store)]
Trials = Annotated[TrialService, Depends(trial_service)]
Store = Annotated[sessionmaker, Depends(store)]
UsersDep = Annotated[Users, Depends(users)]
ProjectsDep = Annotated[Projects, Depends(projects)]
LeasesDep = Annotated[Leases, Depends(leases)]
HealthDep = Annotated[Health, Depends(health)]
SchedulesDep = Annotated[Schedules, Depends(schedules)]
PipelinesDep = Annotated[Pipelines, Depends(pipelines)]

JobIdPath = Annotated[str, Path(pattern=ID_PATTERN, description="The job id (as returned by POST /v1/jobs).")]
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


_bearer = HTTPBearer(
    auto_error=False, description="`Authorization: Bearer <token>`: a user token (`rdk_...`) or RAYDOCK_API_TOKEN."
)


async def bearer_scheme(_: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """Names the bearer scheme in the OpenAPI document; mounted on /v1 when RAYDOCK_API_TOKEN
    is set (local mode documents none: a request there may carry no token). The guard has
    checked the token already."""


async def current_caller(request: Request) -> Caller:
    """Who is calling: decided by the request guard before the route (service/http/auth.py)."""
    caller = getattr(request.state, "caller", None)
    if caller is None:
        raise Unauthorized(UNAUTHORIZED)
    return caller


CurrentCaller = Annotated[Caller, Depends(current_caller)]


async def actor(caller: CurrentCaller) -> str:
    """Who is calling, as the event log names them: the user's name (``admin`` for the
    holder of RAYDOCK_API_TOKEN and for local mode)."""
    return caller.name


Actor = Annotated[str, Depends(actor)]


async def readable_job(reads: Reads, caller: CurrentCaller, job_id: JobIdPath) -> str:
    """The job id, once the caller may read the job: a job of another project answers
    exactly as a missing one (404 ``job_not_found``). A server admin reads every job
    (the route answers 404 for a missing one, as before)."""
    if caller.admin:
        return job_id
    project = await reads.loop.project(job_id)
    if project is None or not caller.can_read(project):
        raise job_not_found(job_id)
    return job_id


async def writable_job(reads: Reads, caller: CurrentCaller, job_id: JobIdPath) -> str:
    """The job id, once the caller may control the job (a member or project admin);
    a viewer of its project, who sees the job anyway, gets 403 ``forbidden_role``."""
    if caller.admin:
        return job_id
    project = await reads.loop.project(job_id)
    if project is None or not caller.can_read(project):
        raise job_not_found(job_id)
    caller.require_write(project, "jobs")
    return job_id


JobId = Annotated[str, Depends(readable_job)]
WritableJobId = Annotated[str, Depends(writable_job)]


def existing_job(reads: Reads, job_id: JobId) -> str:
    """The job id, once the job is known to exist: a streaming route must answer 404
    before its stream opens, since its body runs only after the 200 is sent."""
    reads.get(job_id)
    return job_id


ExistingJobId = Annotated[str, Depends(existing_job)]


async def follow(request: Request, reads: Reads, settings: AppSettings, job_id: JobId) -> Follow:
    """What ends a stream of the job before the job ends (``service/http/follow.py``)."""
    return Follow(
        request.app.state.auth,
        request.headers.get("authorization"),
        job_id,
        reads.loop,
        idle_s=settings.clients.stream_idle_s,
        recheck_s=settings.clients.stream_recheck_s,
    )


StreamFollow = Annotated[Follow, Depends(follow)]


async def uploads(request: Request) -> Shares:
    return request.app.state.uploads


Uploads = Annotated[Shares, Depends(uploads)]


async def quota_admin(caller: CurrentCaller) -> str:
    """Who may set quotas: a server admin (403 admin_only for anyone else)."""
    if not caller.admin:
        raise admin_only("Setting a project's quota")
    return caller.name


QuotaAdmin = Annotated[str, Depends(quota_admin)]
