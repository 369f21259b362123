"""The server-wide cap on open streams (a job's metrics as server-sent events, a followed
log): each one polls the store until its job ends, so without a cap any token holder
could open enough of them to take every connection and database session. Plain ASGI: a
stream's slot is held from its request to the moment its response ends or its client
goes, whatever the route does."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import Busy

METRICS_STREAM = re.compile(r"^/v1/jobs/[^/]+/metrics/stream/?$")
LOGS = re.compile(r"^/v1/jobs/[^/]+/logs/?$")
TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})  # what a bool query parameter takes as true
RETRY_AFTER_S = 5


def is_stream(scope: Scope) -> bool:
    path = scope["path"]
    if METRICS_STREAM.match(path):
        return True
    if LOGS.match(path):
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
        return any(k == "follow" and v.lower() in TRUE for k, v in query)
    return False


class StreamCap:
    def __init__(self, app: ASGIApp, *, max_streams: int) -> None:
        self.app, self.max_streams, self.open = app, max_streams, 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or not is_stream(scope):
            return await self.app(scope, receive, send)
        if self.open >= self.max_streams:
            err = Busy(
                f"The server has {self.open} streams open, its limit (RAYDOCK_MAX_STREAMS={self.max_streams}). "
                "Close a stream, poll instead (GET .../metrics?since=, GET .../logs?offset=), or retry later.",
                code="too_many_streams",
                retry_after_s=RETRY_AFTER_S,
            )
            response = JSONResponse(err.to_body(), status_code=err.status, headers={"Retry-After": str(RETRY_AFTER_S)})
            return await response(scope, receive, send)
        self.open += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.open -= 1
