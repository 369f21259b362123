"""The channel running jobs push their events on: authorised per job by its events
token, not by the API token, and left out of the OpenAPI document (it is not for users).
A post carries one event or a batch of them (admitted one at a time per job and stored in
short transactions: service/events/push.py). A post names the Ray submission id of its
attempt (``Raydock-Submission-Id``): one of an attempt that is not the job's current one
is refused (409 ``not_current_attempt``), so a token is good for its attempt only. What an event may
change is decided by ingestion (service/events/ingest.py), never here."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Response
from pydantic import Field

from api.schemas.events import SUBMISSION_HEADER
from service.http.deps import JobIdPath, PushesDep, bearer_token

router = APIRouter()
MAX_BATCH = 1000  # events in one post (the body is bounded by RAYDOCK_MAX_REQUEST_BYTES too)

Events = dict[str, Any] | Annotated[list[dict[str, Any]], Field(max_length=MAX_BATCH)]


@router.post("/jobs/{job_id}/events", status_code=204, include_in_schema=False)
def push_events(
    pushes: PushesDep,
    job_id: JobIdPath,
    events: Annotated[Events, Body()],
    authorization: Annotated[str | None, Header()] = None,
    submission_id: Annotated[str | None, Header(alias=SUBMISSION_HEADER, max_length=200)] = None,
) -> Response:
    pushes.check(job_id, bearer_token(authorization), submission_id)
    pushes.take(job_id, events if isinstance(events, list) else [events], submission_id)
    return Response(status_code=204)
