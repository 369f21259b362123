"""The server-wide cap on open streams (a job's metrics as server-sent events, a followed
log): each one polls the store until its job ends, so without a cap any token holder
could open enough of them to take every connection and database session; each user and
each project may hold only a share of the cap (``service/http/shares.py``). Plain ASGI:
a stream's slot is held from its request to the moment its response ends or its client
goes, whatever the route does."""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import parse_qsl

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import Busy
from service.db.job_records import LoopReads
from service.http.shares import Shares

METRICS_STREAM = re.compile(r"^/v1/jobs/[^/]+/metrics/stream/?$")
LOGS = re.compile(r"^/v1/jobs/[^/]+/logs/?$")
TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})  # what a bool query parameter takes as true


def is_stream(scope: Scope) -> bool:
    path = scope["path"]
    if METRICS_STREAM.match(path):
        return True
    if LOGS.match(path):
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
        return any(k == "follow" and v.lower() in TRUE for k, v in query)
    return False


JOB_ID = re.compile(r"^/v1/jobs/([^/]+)/")


class StreamCap:
    """``shares``: the server's streams, shared out per user and per project (the project
    of the streamed job); ``reads``: a callable giving the job records once the lifespan
    has built them (the middleware is made before)."""

    def __init__(self, app: ASGIApp, *, shares: Shares, reads: Callable[[], LoopReads]) -> None:
        self.app, self.shares, self.reads = app, shares, reads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or not is_stream(scope):
            return await self.app(scope, receive, send)
        caller = scope.get("state", {}).get("caller")
        project = await self.reads().project(JOB_ID.match(scope["path"]).group(1))
        if caller is None or project is None or not caller.can_read(project):
            return await self.app(scope, receive, send)  # the route answers 401 or 404 at once
        try:
            release = self.shares.take(caller, project)
        except Busy as err:
            headers = {"Retry-After": str(err.retry_after_s)}
            response = JSONResponse(err.to_body(), status_code=err.status, headers=headers)
            return await response(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        finally:
            release()
