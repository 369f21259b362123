"""Route of a job's worker groups: its worker count and placement over time (each
start, resize and restart of its Ray Train workers). ``api.app`` mounts ``router``
under its authenticated ``/v1`` router; thin like every route."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.schemas import WorkerGroupPublic
from service.elastic import worker_groups

router = APIRouter(tags=["jobs"])


@router.get("/jobs/{job_id}/worker-groups", response_model=list[WorkerGroupPublic])
def list_worker_groups(request: Request, job_id: str) -> list[WorkerGroupPublic]:
    """Every start of the job's workers in order, with the world size and each worker's node."""
    return worker_groups(request.app.state.runtime.service.sessions, job_id)
