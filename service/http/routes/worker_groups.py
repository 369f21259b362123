"""Route of a job's worker groups: its worker count and placement over time (each start,
resize and restart of its Ray Train workers)."""

from __future__ import annotations

from fastapi import APIRouter

from api.schemas import WorkerGroupPublic
from service.events.reads.worker_groups import worker_groups
from service.http.deps import JobId, Store
from service.http.openapi import errors

router = APIRouter(tags=["jobs"])


@router.get(
    "/jobs/{job_id}/worker-groups",
    response_model=list[WorkerGroupPublic],
    operation_id="list_worker_groups",
    responses=errors(404, 422),
)
def list_worker_groups(store: Store, job_id: JobId) -> list[WorkerGroupPublic]:
    """Every start of the job's workers in order, with the world size and each worker's node."""
    return worker_groups(store, job_id)
