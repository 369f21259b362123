"""API latency by route template (``/v1/jobs/{job_id}``, never the raw path: a label per
job id would grow without end) and status class, timed from the request's arrival to the
start of its response. A stream (metrics SSE, followed logs, a download) is timed to its
first byte: how long it then stays open is the client's business, not the API's speed.

Plain ASGI, outermost, so refusals by the guards are timed too; a request that matched no
route (a 404, or refused before routing) counts under ``<unmatched>``."""

from __future__ import annotations

import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.telemetry.instruments import REQUESTS

UNMATCHED = "<unmatched>"
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "other"


def route_template(scope: Scope, templates: list[tuple[re.Pattern, str]]) -> str:
    """The full template of the route that answered: of the app's templates (``(pattern,
    template)``, in routing order) the first that matches the path and ends with the
    matched route's own path; ``UNMATCHED`` when no route answered."""
    route = scope.get("route")
    own = getattr(route, "path", None)
    if not isinstance(own, str):
        return UNMATCHED
    path = scope.get("path", "")
    for pattern, template in templates:
        if template.endswith(own) and pattern.match(path):
            return template
    return own


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
            templates = getattr(getattr(scope.get("app"), "state", None), "route_templates", [])
            REQUESTS.labels(
                method if method in METHODS else "other", route_template(scope, templates), status_class(status)
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
