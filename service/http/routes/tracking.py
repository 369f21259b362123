"""A job's TensorBoard event files as a streamed tar.gz (``tracking.tensorboard`` in its
spec; written by service/tracking/). Unpack it and run ``tensorboard --logdir``."""

from __future__ import annotations

from fastapi import APIRouter

from api.errors import Conflict
from service.files import archive, storage
from service.http.deps import CurrentCaller, Downloads, JobId, Reads
from service.http.downloads import GzipResponse
from service.http.openapi import errors
from service.tracking.tensorboard import FOLDER

router = APIRouter(tags=["tracking"])


@router.get(
    "/jobs/{job_id}/tensorboard",
    response_class=GzipResponse,
    operation_id="download_tensorboard",
    responses={
        200: {"content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}}},
        **errors(404, 409, 422, 429),
    },
)
def download_tensorboard(reads: Reads, downloads: Downloads, caller: CurrentCaller, job_id: JobId) -> GzipResponse:
    """The job's TensorBoard event files as a tar.gz, streamed while packed. 409 `no_tensorboard`
    (the job is there, its files are not) until the first report is exported, or when the spec
    did not ask for `tracking.tensorboard`; 404 for an unknown job. Downloads share the
    checkpoints' cap and its per-project and per-user shares (429 `too_many_downloads`)."""
    job = reads.get(job_id)  # 404 for an unknown job
    prefix = reads.prefix(job_id)
    folder = storage.join(prefix, FOLDER)
    missing = Conflict(
        f"Job {job_id} has no TensorBoard files: its spec needs `tracking: {{tensorboard: true}}`, and they appear "
        "with its first exported report.",
        code="no_tensorboard",
    )
    if not storage.exists(folder):
        raise missing
    release = downloads.admit(caller, job.project)
    try:
        pieces = archive.checkpoint_tar(folder, prefix)
    except OSError:
        release()
        raise missing from None
    except BaseException:
        release()
        raise
    return downloads.response(pieces, release, f"{job_id}-tensorboard.tar.gz")
