"""The dashboard's shell: its static files under ``/ui/`` and ``index.html`` for every
other page path, so a client-side route (``/jobs/j123``) survives a reload.

Neither holds data, so neither needs the API token (``service.http.guards`` asks for it
under ``/v1`` only): the page asks the user for the token when a ``/v1`` call answers 401.
The shell carries a strict Content-Security-Policy: scripts and styles from this origin
only, no inline script, no framing."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC = Path(__file__).parent / "static"
PREFIX = "/ui"
# Paths the API answers (or refuses) itself: never the shell, so an unknown API path stays a JSON 404.
API_PATHS = ("/v1", "/docs", "/redoc", "/openapi.json", "/healthz", "/livez", PREFIX)
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SHELL_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
MAX_PAGE_PATH = 512


def is_page_path(path: str) -> bool:
    """A path the single-page app routes itself: not the API's, not a static file's."""
    if len(path) > MAX_PAGE_PATH:
        return False
    return not any(path == p or path.startswith(p + "/") for p in API_PATHS)


class PageRoute(Route):
    """GET/HEAD of a page path; any other method or path does not match at all, so the
    API's own 404 and 405 answers (and their ``Allow`` header) stay as they were."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD") or not is_page_path(scope["path"]):
            return Match.NONE, {}
        return super().matches(scope)


class ShellFiles(StaticFiles):
    """The static files, each answer with the shell's security headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update({k: v for k, v in SHELL_HEADERS.items() if k != "Cache-Control"})
        return response


def shell(request: Request) -> Response:
    """index.html, saying whether the API wants a token, so the page asks for it before its
    first call rather than after a refusal (whether a token is set is no secret: a 401 says it too)."""
    auth = "token" if request.app.state.settings.auth.api_token else "none"
    html = (STATIC / "index.html").read_text().replace("{{auth}}", auth)
    return Response(html, media_type="text/html", headers=SHELL_HEADERS)


def mount(app: FastAPI) -> None:
    """Add the dashboard after every API route, so the API always matches first."""
    app.mount(PREFIX, ShellFiles(directory=STATIC), name="dashboard-files")
    app.router.routes.append(PageRoute("/{path:path}", shell, methods=["GET", "HEAD"], include_in_schema=False))
