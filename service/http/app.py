"""The FastAPI application: ``create_app(settings)`` builds it from the lifespan (the
runtime and the monitor's task), the request guard, the error handlers that put every
refusal in raydock's ``{"error": {code, message, details}}`` body, and the routers of
``service/http/routes/``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from sqlalchemy import select
from starlette.exceptions import HTTPException
from starlette.routing import Route, compile_path

from api.errors import InvalidSpec, RaydockError
from api.schemas import JobStatus
from service.dashboard import pages
from service.db.models import JobRow
from service.http.auth import Authenticator
from service.http.deps import bearer_scheme, current_caller
from service.http.downloads import DownloadGate
from service.http.guards import RequestGuard, allowed_hosts
from service.http.openapi import errors, errors_as_json
from service.http.routes import (
    checkpoints,
    cluster,
    code,
    eventlog,
    events,
    jobs,
    logs,
    metrics,
    pipelines,
    projects,
    prometheus,
    quotas,
    schedules,
    tracking,
    trials,
    users,
    worker_groups,
)
from service.http.shares import DOWNLOADS, STREAMS, UPLOADS, Shares
from service.http.streams import StreamCap
from service.runtime import Runtime, build_runtime
from service.settings import Settings
from service.telemetry.collector import StoreCollector
from service.telemetry.latency import RequestTimer

log = logging.getLogger("raydock.api")

HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(
        title="raydock",
        version="0.1.0",
        summary="Distributed training and hyperparameter search on Ray.",
        lifespan=lifespan,
        responses=errors(400, 413),  # the request guard and body parsing answer these on any route
    )
    app.state.settings = settings
    shares = (settings.clients.project_share, settings.clients.user_share)
    app.state.downloads = DownloadGate(
        Shares(DOWNLOADS, settings.clients.max_concurrent_downloads, *shares), settings.clients.download_send_timeout_s
    )
    app.state.uploads = Shares(UPLOADS, settings.clients.max_concurrent_uploads, *shares)
    app.state.auth = Authenticator(settings.auth.api_token, settings.auth.token_cache_s)  # the lifespan binds it
    streams = Shares(STREAMS, settings.clients.max_streams, *shares)
    app.add_middleware(StreamCap, shares=streams, reads=lambda: app.state.runtime.reads.loop)  # inside the guard
    app.add_middleware(
        RequestGuard,
        hosts=allowed_hosts(settings),
        max_body_bytes=settings.clients.max_request_bytes,
        own_limit_prefixes=("/v1/code/",),
        token=settings.auth.api_token,
        open_docs=settings.http.open_docs,
        auth=app.state.auth,
    )  # a code upload is counted against RAYDOCK_CODE_MAX_BYTES by its route
    app.add_middleware(RequestTimer)  # outermost: the guards' refusals are timed too
    app.add_exception_handler(RaydockError, raydock_error)
    app.add_exception_handler(RequestValidationError, request_invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)

    # Who calls is decided by the guard (service/http/auth.py), before any route runs.
    auth = [Depends(bearer_scheme)] if settings.auth.api_token else []
    v1 = APIRouter(prefix="/v1", dependencies=[*auth, Depends(current_caller)], responses=errors(401))
    for module in V1_ROUTES:
        v1.include_router(module.router)
    app.include_router(cluster.health_router)
    app.include_router(prometheus.router)  # its own token rule (routes/prometheus.py)
    app.include_router(v1)
    app.include_router(events.router, prefix="/v1/internal")  # per-job events token, not the API token
    errors_as_json(app)
    mounted = [("", cluster.health_router), ("", prometheus.router), ("/v1/internal", events.router)]
    app.state.methods_by_path = methods_by_path(app, mounted)
    app.state.route_templates = route_templates(app, mounted)
    pages.mount(app)  # last, and outside methods_by_path: page paths never shadow an API route or its Allow
    return app


V1_ROUTES = (
    jobs,
    metrics,
    logs,
    checkpoints,
    trials,
    worker_groups,
    cluster,
    code,
    tracking,
    eventlog,
    users,
    projects,
    quotas,
    schedules,
    pipelines,
)


def methods_by_path(app: FastAPI, mounted: list[tuple[str, APIRouter]]) -> list[tuple[re.Pattern, set[str]]]:
    """Each path template with every method served on it, for the ``Allow`` header of a 405."""
    table = _templates(app, mounted)
    return [(compile_path(path)[0], methods) for path, methods in table.items()]


def route_templates(app: FastAPI, mounted: list[tuple[str, APIRouter]]) -> list[tuple[re.Pattern, str]]:
    """Each full path template (``/v1/jobs/{job_id}``) with its pattern: the label of a
    request's latency (a route included in a router knows only its own part of the path)."""
    return [(compile_path(path)[0], path) for path in _templates(app, mounted)]


def _templates(app: FastAPI, mounted: list[tuple[str, APIRouter]]) -> dict[str, set[str]]:
    table: dict[str, set[str]] = {}
    routers = [("/v1", m.router) for m in V1_ROUTES] + mounted + [("", app.router)]
    for prefix, router in routers:
        for route in router.routes:
            if isinstance(route, Route) and route.methods:
                table.setdefault(prefix + route.path, set()).update(route.methods)
    return table


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    runtime = await asyncio.to_thread(build_runtime, app.state.settings)
    app.state.runtime = runtime
    app.state.auth.bind(runtime.sessions, runtime.users.local_mode, runtime.users.revision)
    app.state.store_metrics = CollectorRegistry()
    app.state.store_metrics.register(StoreCollector(runtime.sessions, runtime.backend))
    runtime.runner.start_all()  # the background units (service/runtime.py)
    try:
        yield
    finally:
        await runtime.runner.stop_all()
        if runtime.head is not None:
            await asyncio.to_thread(_maybe_stop_head, runtime)


def _maybe_stop_head(runtime: Runtime) -> None:
    """Stop the local head on shutdown unless a job has not ended (it may train on the head,
    and outlives us): one indexed probe, whatever the history holds."""
    with runtime.sessions() as s:
        unended = s.scalar(
            select(JobRow.id).where(JobRow.status.in_([x.value for x in JobStatus if not x.is_terminal()])).limit(1)
        )
    if unended is not None:
        log.warning("leaving the local Ray head (pid %s) running: jobs are still active", runtime.head.pid)
        return
    runtime.head.stop()


# ----------------------------------------------------------------------------- errors


def _body(err: RaydockError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(err.to_body(), status_code=err.status, headers=headers)


async def raydock_error(_: Request, exc: RaydockError) -> JSONResponse:
    headers = {}
    if retry := getattr(exc, "retry_after_s", None):  # a 429 says when to come back
        headers["Retry-After"] = str(retry)
    if getattr(exc, "close_connection", False):  # a request cut off mid-body: its connection closes
        headers["Connection"] = "close"
    return _body(exc, headers or None)


async def request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    return _body(validation_error(exc, spec=request.url.path.rstrip("/") == "/v1/jobs"))


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return _body(
        RaydockError(
            "The server failed on this request; it is logged on the server.", code="internal_error", status=500
        )
    )


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's and FastAPI's own refusals (unknown path, wrong method, unreadable body)."""
    code = getattr(exc, "code", None) or HTTP_CODES.get(exc.status_code, "http_error")
    headers = dict(exc.headers or {})
    method, path = request.method, request.url.path
    if exc.status_code == 404 and exc.detail == "Not Found":
        message = f"No route {method} {path}. The API is described at /docs and /openapi.json."
    elif exc.status_code == 405:
        allowed = allowed_methods(request)
        headers["Allow"] = ", ".join(allowed)
        message = f"{method} is not allowed on {path}; use {' or '.join(allowed)}."
    elif exc.status_code == 400 and exc.detail == "There was an error parsing the body":
        message = "The request body could not be read. Send UTF-8 JSON with 'Content-Type: application/json'."
    else:
        message = str(exc.detail)
    return _body(RaydockError(message, code=code, status=exc.status_code), headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves on this path (Starlette's own 405 names only the
    first route that matched the path)."""
    path = request.scope["path"]
    return sorted({m for regex, methods in request.app.state.methods_by_path if regex.match(path) for m in methods})


def validation_error(exc: RequestValidationError, *, spec: bool) -> InvalidSpec:
    """A job spec's problems as ``invalid_spec``; a path, query or header problem (or any
    other body) as ``invalid_request``; each with the dotted location the user wrote."""
    errs = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errs):
        ctx = errs[0].get("ctx", {})
        return InvalidSpec(
            f"The request body is not valid JSON: {ctx.get('error', 'parse error')}. Send a JSON object.",
            code="invalid_json",
        )
    details = [{"loc": _loc(e), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in errs]
    summary = "; ".join(f"{d['loc']}: {d['msg']}" for d in details[:5])
    if spec and all(_in_body(e) for e in errs):
        return InvalidSpec(f"The job spec is invalid. {summary}", details=details)
    return InvalidSpec(f"The request is invalid. {summary}", code="invalid_request", details=details)


def _in_body(err: dict[str, Any]) -> bool:
    return tuple(err.get("loc", ()))[:1] == ("body",)


def _loc(err: dict[str, Any]) -> str:
    parts = [str(p) for p in err.get("loc", ()) if p not in ("body",)]
    parts = parts[1:] if parts[:1] in (["train"], ["tune"]) else parts  # the job kind's union tag
    # Discriminated unions add the tag to the path ("model.mlp.hidden_sizes"); users wrote "model.hidden_sizes".
    return ".".join(parts) or "body"
