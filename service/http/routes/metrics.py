"""Routes of a job's metric series: the stored reports, and the same as server-sent
events until the job ends. The stream polls the store off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import APIRouter
from fastapi.sse import EventSourceResponse, ServerSentEvent

from api.schemas import MetricPoint
from api.errors import NotFound
from service.http.deps import ExistingJobId, JobId, Jobs, Since
from service.http.openapi import errors

router = APIRouter(tags=["metrics"])
STREAM_POLL_S = 0.2


@router.get("/jobs/{job_id}/metrics", response_model=list[MetricPoint], operation_id="get_metrics", responses=errors(404, 422))
def get_metrics(jobs: Jobs, job_id: JobId, since: Since = -1) -> list[MetricPoint]:
    """Stored reports with seq > since."""
    return jobs.metrics(job_id, since)


@router.get(
    "/jobs/{job_id}/metrics/stream", response_class=EventSourceResponse, operation_id="stream_metrics", responses=errors(404, 422)
)
async def stream_metrics(jobs: Jobs, job_id: ExistingJobId, since: Since = -1) -> AsyncIterator[ServerSentEvent]:
    """Server-sent events: one `metric` event per report, then an `end` event when the job
    ends (status `DELETED` if the job is deleted while it is followed)."""
    try:
        while True:
            terminal = await asyncio.to_thread(jobs.is_terminal, job_id)
            for point in await asyncio.to_thread(jobs.metrics, job_id, since):
                since = point.seq
                yield ServerSentEvent(data=point.model_dump(mode="json"), event="metric", id=str(point.seq))
            if terminal:
                job = await asyncio.to_thread(jobs.get, job_id)
                yield ServerSentEvent(data={"status": job.status.value}, event="end")
                return
            await asyncio.sleep(STREAM_POLL_S)
    except NotFound:
        yield ServerSentEvent(data={"status": "DELETED"}, event="end")
