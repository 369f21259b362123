"""Routes of pipelines: submit (the graph and every step's job checked first, all steps
stored or none), list, read with each step's status, cancel and resume. Thin: the project
is decided as a submit's is (service/http/access.py), the rest is
service/pipelines/commands.py."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from starlette.concurrency import run_in_threadpool

from api.schemas.pipelines import PIPELINE_ID_PATTERN, PipelineList, PipelinePublic, PipelineSpec
from service.http.access import write_project
from service.http.deps import CurrentCaller, PipelinesDep, ProjectsDep
from service.http.openapi import errors

router = APIRouter(tags=["pipelines"])

PipelineIdPath = Annotated[
    str, Path(pattern=PIPELINE_ID_PATTERN, description="The pipeline id (as returned by POST /v1/pipelines).")
]


@router.post(
    "/pipelines",
    status_code=202,
    response_model=PipelinePublic,
    operation_id="submit_pipeline",
    responses=errors(404, 409, 422, 429, 503),
)
async def submit_pipeline(
    pipelines: PipelinesDep, caller: CurrentCaller, projects: ProjectsDep, spec: PipelineSpec
) -> PipelinePublic:
    """Store every step as a job of the project (`project`, else the caller's default), in one
    transaction; steps with `after` WAIT for their steps, the others are QUEUED."""

    def submit() -> PipelinePublic:  # writes: off the event loop
        project = write_project(caller, spec.project, projects)
        return pipelines.submit(spec, caller, project)

    return await run_in_threadpool(submit)


@router.get("/pipelines", response_model=PipelineList, operation_id="list_pipelines", responses=errors(422))
def list_pipelines(
    pipelines: PipelinesDep, caller: CurrentCaller, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> PipelineList:
    """The pipelines of the caller's projects, newest first, each with its steps' statuses."""
    return pipelines.list(caller, limit=limit)


@router.get(
    "/pipelines/{pipeline_id}", response_model=PipelinePublic, operation_id="get_pipeline", responses=errors(404, 422)
)
def get_pipeline(pipelines: PipelinesDep, caller: CurrentCaller, pipeline_id: PipelineIdPath) -> PipelinePublic:
    return pipelines.get(pipeline_id, caller)


@router.post(
    "/pipelines/{pipeline_id}/cancel",
    response_model=PipelinePublic,
    operation_id="cancel_pipeline",
    responses=errors(403, 404, 422),
)
def cancel_pipeline(pipelines: PipelinesDep, caller: CurrentCaller, pipeline_id: PipelineIdPath) -> PipelinePublic:
    """Cancel every step that has not ended."""
    return pipelines.cancel(pipeline_id, caller)


@router.post(
    "/pipelines/{pipeline_id}/resume",
    response_model=PipelinePublic,
    operation_id="resume_pipeline",
    responses=errors(403, 404, 409, 422),
)
def resume_pipeline(pipelines: PipelinesDep, caller: CurrentCaller, pipeline_id: PipelineIdPath) -> PipelinePublic:
    """Run the FAILED and CANCELLED steps again (each from its last checkpoint, after the steps
    it names); SUCCEEDED steps are kept."""
    return pipelines.resume(pipeline_id, caller)
