"""Routes of the job resource: submit (202 + id; the monitor starts it), list, read,
cancel, resume and delete. Thin: validate, call the job commands or reads, return the public model."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Header, Query, Response
from pydantic import StringConstraints
from starlette.concurrency import run_in_threadpool

from api.errors import job_not_found
from api.schemas import (
    MAX_LABELS,
    CancelJobs,
    CancelledJobs,
    ErrorResponse,
    JobList,
    JobPublic,
    JobSpec,
    JobStatus,
)
from service.http.access import write_project
from service.http.deps import (
    Actor,
    CurrentCaller,
    Cursor,
    JobIdPath,
    Jobs,
    Offset,
    ProjectsDep,
    Reads,
    Store,
    WritableJobId,
)
from service.http.openapi import errors, job_response
from service.http.visibility import writable_ids

router = APIRouter(tags=["jobs"])

# key=value: a non-empty key, then the value matched as given (anything but NUL, as in a label).
LabelFilter = Annotated[str, StringConstraints(pattern=r"^[^=\x00]+=[^\x00]*$", max_length=64 + 256)]

# Shown in /docs, and sent as is by contract tests: specs the server accepts.
SPEC_EXAMPLES = {
    "digits": {
        "summary": "Data-parallel MLP on the bundled digits data",
        "value": {
            "name": "digits-ddp",
            "model": {"type": "mlp", "hidden_sizes": [64]},
            "data": {"source": "digits"},
            "epochs": 2,
            "scaling": {"num_workers": 2},
        },
    },
    "gpt": {
        "summary": "The built-in GPT on the generated character corpus, FSDP on 2 workers",
        "value": {
            "name": "gpt-fsdp",
            "model": {"type": "gpt"},
            "max_steps": 50,
            "parallelism": {"strategy": "fsdp"},
            "scaling": {"num_workers": 2},
        },
    },
}


@router.post(
    "/jobs",
    status_code=202,
    response_model=JobPublic,
    operation_id="submit_job",
    responses={
        202: job_response("The job is recorded and QUEUED; it starts on the cluster as soon as it fits."),
        200: {"model": JobPublic, **job_response("A submit with this Idempotency-Key was seen before: its job.")},
        **errors(404, 409, 422, 429, 503),
        429: {
            "model": ErrorResponse,
            "description": "The project's quota: it has `max_queued` jobs waiting already (`quota_exceeded`, no "
            "Retry-After). Submit again once some have started or are cancelled, or have a server admin raise it.",
        },
    },
)
async def submit_job(
    jobs: Jobs,
    caller: CurrentCaller,
    projects: ProjectsDep,
    spec: Annotated[JobSpec, Body(openapi_examples=SPEC_EXAMPLES)],
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(max_length=200, description="Retries with the same key return the same job instead of a new one."),
    ] = None,
) -> JobPublic:
    """Record a job in its project (the spec's `project`, else the caller's default) and
    queue it; it starts on the cluster as soon as it fits."""

    def submit() -> tuple[JobPublic, bool]:  # writes: off the event loop
        project = write_project(caller, spec.project, projects)
        return jobs.submit(spec, idempotency_key, actor=caller.name, project=project, user_id=caller.user_id)

    job, created = await run_in_threadpool(submit)
    if not created:
        response.status_code = 200
    return job


@router.get("/jobs", response_model=JobList, operation_id="list_jobs", responses=errors(422))
def list_jobs(
    reads: Reads,
    caller: CurrentCaller,
    status: JobStatus | None = None,
    label: Annotated[
        list[LabelFilter], Query(max_length=MAX_LABELS, description="key=value; repeat to require several")
    ] = [],  # noqa: B006
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Offset = 0,
    cursor: Cursor = None,
) -> JobList:
    """The jobs of the caller's projects, newest first. Page with `cursor` (each page's
    `next`): the same cost at any depth."""
    labels = dict(item.split("=", 1) for item in label)
    return reads.list(status=status, labels=labels, limit=limit, offset=offset, cursor=cursor, projects=caller.projects)


@router.get(
    "/jobs/{job_id}",
    response_model=JobPublic,
    operation_id="get_job",
    responses={200: job_response("The job."), **errors(404, 422)},
)
async def get_job(reads: Reads, caller: CurrentCaller, job_id: JobIdPath) -> JobPublic:
    # One point read (on the event loop on SQLite: service/db/job_records.py) that also says
    # whose the job is: a job of a project the caller does not read answers as a missing one.
    job = await reads.read(job_id)
    if not caller.can_read(job.project):
        raise job_not_found(job_id)
    return job


@router.post("/jobs:cancel", response_model=CancelledJobs, operation_id="cancel_jobs", responses=errors(422))
def cancel_jobs(jobs: Jobs, store: Store, body: CancelJobs, caller: CurrentCaller) -> CancelledJobs:
    """Cancel many jobs at once (at most 1000): queued ones in one statement, started ones
    each as by their own cancel; a job that is not found (or not the caller's to cancel)
    or already ended is listed in `refused` with its code."""
    if caller.admin:
        return jobs.cancel_many(body.ids, actor=caller.name)
    allowed, refused = writable_ids(store, body.ids, caller)
    done = jobs.cancel_many(allowed, actor=caller.name) if allowed else CancelledJobs(cancelled=[], refused=[])
    return CancelledJobs(cancelled=done.cancelled, refused=done.refused + refused)


@router.post(
    "/jobs/{job_id}/cancel", response_model=JobPublic, operation_id="cancel_job", responses=errors(403, 404, 409, 422)
)
def cancel_job(jobs: Jobs, job_id: WritableJobId, actor: Actor) -> JobPublic:
    return jobs.cancel(job_id, actor=actor)


@router.post(
    "/jobs/{job_id}/resume", response_model=JobPublic, operation_id="resume_job", responses=errors(403, 404, 409, 422)
)
def resume_job(jobs: Jobs, job_id: WritableJobId, actor: Actor) -> JobPublic:
    """Start a new attempt of a FAILED or CANCELLED job from its last checkpoint."""
    return jobs.resume(job_id, actor=actor)


@router.delete("/jobs/{job_id}", status_code=204, operation_id="delete_job", responses=errors(403, 404, 409, 422))
def delete_job(jobs: Jobs, job_id: WritableJobId, actor: Actor) -> Response:
    jobs.delete(job_id, actor=actor)
    return Response(status_code=204)
