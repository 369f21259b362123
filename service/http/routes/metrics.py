"""Routes of a job's metric series: the stored reports in pages or downsampled for a
chart, and the same as server-sent events until the job ends. The stream polls the store
off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import TypeAdapter

from api.errors import NotFound
from api.schemas import MetricPoint
from service.events.reads import series
from service.http.deps import ExistingJobId, JobId, Reads, Since, StreamFollow
from service.http.openapi import errors

router = APIRouter(tags=["metrics"])
STREAM_POLL_S = 0.2
_POINTS = TypeAdapter(list[MetricPoint])

Limit = Annotated[
    int | None,
    Query(
        ge=1,
        le=series.PAGE_MAX,
        description=f"Most reports in the page (default {series.PAGE_DEFAULT}); the `Link` header (rel=next) names the next page.",
    ),
]
MaxPoints = Annotated[
    int | None,
    Query(
        ge=2,
        le=series.POINTS_MAX,
        description="Downsample the reports after `since` (the next `limit` of them when given, else all) to at most this many "
        "points for a chart: the first report, then buckets of consecutive reports, each as its last report with `points`, "
        "`first_seq`, `metrics_min` and `metrics_max`.",
    ),
]


@router.get(
    "/jobs/{job_id}/metrics", response_model=list[MetricPoint], operation_id="get_metrics", responses=errors(404, 422)
)
def get_metrics(
    reads: Reads, job_id: JobId, request: Request, since: Since = -1, limit: Limit = None, max_points: MaxPoints = None
) -> Response:
    """Stored reports with seq > since, in seq order: a page of `limit` (a `Link: <...>; rel="next"` header
    when more follow), or with `max_points` the rest of the series (or the next `limit` reports) downsampled."""
    if max_points is not None:
        until = since + limit if limit is not None else None
        return _json(reads.metrics_downsampled(job_id, since, max_points, until), {})
    limit = limit or series.PAGE_DEFAULT
    points, more = reads.metrics(job_id, since, limit)
    headers = {"Link": f'<{request.url.path}?since={points[-1].seq}&limit={limit}>; rel="next"'} if more else {}
    return _json(points, headers)


def _json(points: list[MetricPoint], headers: dict[str, str]) -> Response:
    # The points are built from the store by the service: serialised once, not validated again.
    return Response(_POINTS.dump_json(points), media_type="application/json", headers=headers)


@router.get(
    "/jobs/{job_id}/metrics/stream",
    response_class=EventSourceResponse,
    operation_id="stream_metrics",
    responses=errors(404, 422, 429),
)
async def stream_metrics(
    reads: Reads, job_id: ExistingJobId, ending: StreamFollow, since: Since = -1
) -> AsyncIterator[ServerSentEvent]:
    """Server-sent events: one `metric` event per report, then an `end` event when the job
    ends (status `DELETED` if the job is deleted while it is followed). A stream of a job that
    has not been running for RAYDOCK_STREAM_IDLE_S, or whose caller may no longer read it,
    ends with an `end` event whose `reason` (`not_running`, `access_ended`) and `message` say why."""
    try:
        while True:
            status = (await asyncio.to_thread(reads.get, job_id)).status
            more = True
            while more:
                points, more = await asyncio.to_thread(reads.metrics, job_id, since)
                for point in points:
                    since = point.seq
                    yield ServerSentEvent(data=point.model_dump(mode="json"), event="metric", id=str(point.seq))
            if status.is_terminal():
                yield ServerSentEvent(data={"status": status.value}, event="end")
                return
            if (end := await ending.ending(status)) is not None:
                data = {"status": status.value, "reason": end.code, "message": end.message}
                yield ServerSentEvent(data=data, event="end")
                return
            await asyncio.sleep(STREAM_POLL_S)
    except NotFound:
        yield ServerSentEvent(data={"status": "DELETED"}, event="end")
