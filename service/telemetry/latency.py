"""API latency by route template (``/v1/jobs/{job_id}``, never the raw path: a label per
job id would grow without end) and status class, timed from the request's arrival to the
start of its response. A stream (metrics SSE, followed logs, a download) is timed to its
first byte: how long it then stays open is the client's business, not the API's speed.

Plain ASGI, outermost, so refusals by the guards are timed too; a request that matched no
route (a 404, or refused before routing) counts under ``<unmatched>``."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.telemetry.instruments import REQUESTS

UNMATCHED = "<unmatched>"
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "other"


def route_template(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED


class RequestTimer:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        timed = False

        def observe(status: int) -> None:
            nonlocal timed
            if timed:
                return
            timed = True
            method = scope.get("method", "")
            REQUESTS.labels(
                method if method in METHODS else "other", route_template(scope), status_class(status)
            ).observe(time.perf_counter() - started)

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                observe(int(message.get("status", 0)))
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        except BaseException:
            observe(500)  # no response began: the server's answer is a 500 or a closed connection
            raise
