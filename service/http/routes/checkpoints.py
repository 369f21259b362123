"""Routes of a job's checkpoints: the list of those still in storage, and one as a streamed tar.gz."""

from __future__ import annotations

from fastapi import APIRouter

from api.errors import job_not_found
from api.schemas import CheckpointPublic
from service.http.deps import CheckpointId, CurrentCaller, Downloads, JobId, Reads
from service.http.downloads import GzipResponse
from service.http.openapi import errors

router = APIRouter(tags=["checkpoints"])


@router.get(
    "/jobs/{job_id}/checkpoints",
    response_model=list[CheckpointPublic],
    operation_id="list_checkpoints",
    responses=errors(404, 422),
)
def list_checkpoints(reads: Reads, job_id: JobId) -> list[CheckpointPublic]:
    return reads.checkpoints(job_id)


@router.get(
    "/jobs/{job_id}/checkpoints/{checkpoint_id}/download",
    response_class=GzipResponse,
    operation_id="download_checkpoint",
    responses={
        200: {"content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}}},
        **errors(404, 422, 429),
    },
)
def download_checkpoint(
    reads: Reads, downloads: Downloads, caller: CurrentCaller, job_id: JobId, checkpoint_id: CheckpointId
) -> GzipResponse:
    """The checkpoint directory as a tar.gz, streamed while it is packed (any size, constant memory).
    At most RAYDOCK_MAX_CONCURRENT_DOWNLOADS at once, of which one project holds at most
    RAYDOCK_PROJECT_SHARE and one user RAYDOCK_USER_SHARE (429 `too_many_downloads` beyond)."""
    project = reads.project_of(job_id)
    if project is None:
        raise job_not_found(job_id)
    release = downloads.admit(caller, project)
    try:
        filename, pieces = reads.checkpoint_archive(job_id, checkpoint_id)
    except BaseException:
        release()
        raise
    return downloads.response(pieces, release, filename)
