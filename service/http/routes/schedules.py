"""Routes of schedules: create (the cron, time zone and job spec checked first), list with
the next firing times, read, pause or resume (PATCH), delete. Thin: the project is decided
as a submit's is (service/http/access.py), the rest is service/schedules/commands.py."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from starlette.concurrency import run_in_threadpool

from api.schemas.schedules import (
    MAX_NEXT_RUNS,
    SCHEDULE_ID_PATTERN,
    ScheduleList,
    SchedulePatch,
    SchedulePublic,
    ScheduleSpec,
)
from service.http.access import write_project
from service.http.deps import CurrentCaller, ProjectsDep, SchedulesDep
from service.http.openapi import errors

router = APIRouter(tags=["schedules"])

ScheduleId = Annotated[
    str, Path(pattern=SCHEDULE_ID_PATTERN, description="The schedule id (as returned by POST /v1/schedules).")
]
NextRuns = Annotated[int, Query(ge=0, le=MAX_NEXT_RUNS, description="How many next firing times to list.")]


@router.post(
    "/schedules",
    status_code=201,
    response_model=SchedulePublic,
    operation_id="create_schedule",
    responses=errors(404, 409, 422, 429),
)
async def create_schedule(
    schedules: SchedulesDep, caller: CurrentCaller, projects: ProjectsDep, spec: ScheduleSpec
) -> SchedulePublic:
    """Store a schedule in a project the caller may submit to (`project`, else the job
    spec's, else the caller's default); each tick then submits `job` as the caller would."""

    def create() -> SchedulePublic:  # writes: off the event loop
        project = write_project(caller, spec.project or spec.job.project, projects)
        return schedules.create(spec, caller, project)

    return await run_in_threadpool(create)


@router.get("/schedules", response_model=ScheduleList, operation_id="list_schedules", responses=errors(422))
def list_schedules(
    schedules: SchedulesDep,
    caller: CurrentCaller,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    next_runs: NextRuns = 3,
) -> ScheduleList:
    """The schedules of the caller's projects, newest first, each with its next firing times."""
    return schedules.list(caller, limit=limit, next_runs=next_runs)


@router.get(
    "/schedules/{schedule_id}",
    response_model=SchedulePublic,
    operation_id="get_schedule",
    responses=errors(404, 422),
)
def get_schedule(
    schedules: SchedulesDep, caller: CurrentCaller, schedule_id: ScheduleId, next_runs: NextRuns = 3
) -> SchedulePublic:
    return schedules.get(schedule_id, caller, next_runs=next_runs)


@router.patch(
    "/schedules/{schedule_id}",
    response_model=SchedulePublic,
    operation_id="patch_schedule",
    responses=errors(403, 404, 422),
)
def patch_schedule(
    schedules: SchedulesDep, caller: CurrentCaller, schedule_id: ScheduleId, body: SchedulePatch
) -> SchedulePublic:
    """Pause (`{"paused": true}`) or resume (`{"paused": false}`): a resumed schedule fires
    from its next tick on; the ticks that passed while it was paused are not run."""
    return schedules.set_paused(schedule_id, body.paused, caller)


@router.delete(
    "/schedules/{schedule_id}", status_code=204, operation_id="delete_schedule", responses=errors(403, 404, 422)
)
def delete_schedule(schedules: SchedulesDep, caller: CurrentCaller, schedule_id: ScheduleId) -> Response:
    """The schedule goes; the jobs it submitted stay."""
    schedules.delete(schedule_id, caller)
    return Response(status_code=204)
