"""Route of a job's driver log (every worker's output): the stored text from an offset,
or with ``follow=true`` a text stream until the job ends. Both read ranges of stored
chunks (``service/events/logs.py``), so neither holds the whole log, and a follow poll costs
the same whatever the log's size."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse, StreamingResponse

from api.errors import NotFound
from service.http.deps import JobId, Offset, Reads, StreamFollow
from service.http.openapi import errors

router = APIRouter(tags=["logs"])
STREAM_POLL_S = 0.2
TEXT = "text/plain; charset=utf-8"


@router.get(
    "/jobs/{job_id}/logs", response_class=PlainTextResponse, operation_id="get_logs", responses=errors(404, 422, 429)
)
def get_logs(reads: Reads, job_id: JobId, ending: StreamFollow, follow: bool = False, offset: Offset = 0) -> Response:
    """The job's driver log (all workers' output) from character `offset` on. `follow=true` streams
    until the job ends, or until it has not been running for RAYDOCK_STREAM_IDLE_S, or until the
    caller may no longer read it: then a last line `[raydock] ...` says why. A log over
    RAYDOCK_MAX_LOG_BYTES keeps its head and tail; a line in between says how many bytes were dropped."""
    if not follow:
        return StreamingResponse(reads.log_stream(job_id, offset), media_type=TEXT)
    reads.get(job_id)  # 404 before the stream opens

    async def chunks() -> AsyncIterator[str]:
        pos = offset
        try:
            while True:
                status = (await asyncio.to_thread(reads.get, job_id)).status
                while True:  # everything stored so far, a range at a time
                    text, pos = await asyncio.to_thread(reads.logs, job_id, pos)
                    if not text:
                        break
                    yield text
                if status.is_terminal():
                    return
                if (end := await ending.ending(status)) is not None:
                    yield f"\n[raydock] {end.message}\n"
                    return
                await asyncio.sleep(STREAM_POLL_S)
        except NotFound:  # deleted while followed: the stream ends
            return

    return StreamingResponse(chunks(), media_type=TEXT)
