"""The FastAPI application: ``create_app()`` wires the routes, the error handler, API
auth and the monitor's lifetime. Routes are thin: validate, call the job service,
return a public model. Long work never runs in a handler."""


import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, FastAPI, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from api.errors import InvalidSpec, RaydockError, Unauthorized
from api.schemas import (
    CheckpointPublic,
    ClusterInfo,
    ErrorResponse,
    JobList,
    JobPublic,
    JobSpec,
    JobStatus,
    MetricPoint,
)
from api.elastic_routes import router as elastic_router
from api.trials_routes import router as trials_router
from service.jobs import JobService
from service.ray_backend import ClusterUnavailable
from service.runtime import Runtime, build_runtime
from service.settings import Settings

log = logging.getLogger("raydock.api")
STREAM_POLL_S = 0.2
ERRORS = {code: {"model": ErrorResponse} for code in (401, 404, 409, 422, 503)}


def _loc(err: dict[str, Any]) -> str:
    parts = [str(p) for p in err.get("loc", ()) if p not in ("body",)]
    parts = parts[1:] if parts[:1] in (["train"], ["tune"]) else parts  # the job kind's union tag
    # Discriminated unions add the tag to the path ("model.mlp.hidden_sizes"); users wrote "model.hidden_sizes".
    return ".".join(parts) or "body"


def validation_error(exc: RequestValidationError) -> InvalidSpec:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        ctx = errors[0].get("ctx", {})
        return InvalidSpec(f"The request body is not valid JSON: {ctx.get('error', 'parse error')}. Send a JSON object.", code="invalid_json")
    details = [{"loc": _loc(e), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in errors]
    summary = "; ".join(f"{d['loc']}: {d['msg']}" for d in details[:5])
    return InvalidSpec(f"The job spec is invalid. {summary}", details=details)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        runtime = await asyncio.to_thread(build_runtime, settings)
        app.state.runtime = runtime
        task = asyncio.create_task(runtime.monitor.run(), name="raydock-monitor")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if runtime.head is not None:
                await asyncio.to_thread(_maybe_stop_head, runtime)

    app = FastAPI(
        title="raydock",
        version="0.1.0",
        summary="Distributed training and hyperparameter search on Ray.",
        lifespan=lifespan,
        responses=ERRORS,
    )

    @app.exception_handler(RaydockError)
    async def _raydock_error(_: Request, exc: RaydockError) -> JSONResponse:
        return JSONResponse(exc.to_body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = validation_error(exc)
        return JSONResponse(err.to_body(), status_code=err.status)

    @app.exception_handler(ClusterUnavailable)
    async def _cluster_unavailable(_: Request, exc: ClusterUnavailable) -> JSONResponse:
        return JSONResponse({"error": {"code": "cluster_unavailable", "message": str(exc), "details": []}}, status_code=503)

    def require_token(authorization: Annotated[str | None, Header()] = None) -> None:
        if not settings.api_token:
            return
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), settings.api_token):
            raise Unauthorized("Missing or wrong API token. Send 'Authorization: Bearer <RAYDOCK_API_TOKEN>'.")

    def svc(request: Request) -> JobService:
        return request.app.state.runtime.service

    Service = Annotated[JobService, Depends(svc)]
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_token)])

    @app.get("/healthz", tags=["meta"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @v1.post("/jobs", status_code=202, response_model=JobPublic, tags=["jobs"])
    def submit_job(
        service: Service,
        spec: Annotated[JobSpec, Body()],
        response: Response,
        idempotency_key: Annotated[
            str | None, Header(max_length=200, description="Retries with the same key return the same job instead of a new one.")
        ] = None,
    ) -> JobPublic:
        """Record a job and queue it; it starts on the cluster as soon as it fits."""
        job, created = service.submit(spec, idempotency_key)
        if not created:
            response.status_code = 200
        return job

    @v1.get("/jobs", response_model=JobList, tags=["jobs"])
    def list_jobs(
        service: Service,
        status: JobStatus | None = None,
        label: Annotated[list[str], Query(description="key=value; repeat to require several")] = [],  # noqa: B006
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> JobList:
        labels = {}
        for item in label:
            key, sep, value = item.partition("=")
            if not sep:
                raise InvalidSpec(f"label filter {item!r} must look like key=value", code="invalid_query")
            labels[key] = value
        return service.list(status=status, labels=labels, limit=limit, offset=offset)

    @v1.get("/jobs/{job_id}", response_model=JobPublic, tags=["jobs"])
    def get_job(service: Service, job_id: str) -> JobPublic:
        return service.get(job_id)

    @v1.post("/jobs/{job_id}/cancel", response_model=JobPublic, tags=["jobs"])
    def cancel_job(service: Service, job_id: str) -> JobPublic:
        return service.cancel(job_id)

    @v1.post("/jobs/{job_id}/resume", response_model=JobPublic, tags=["jobs"])
    def resume_job(service: Service, job_id: str) -> JobPublic:
        """Start a new attempt of a FAILED or CANCELLED job from its last checkpoint."""
        return service.resume(job_id)

    @v1.delete("/jobs/{job_id}", status_code=204, tags=["jobs"])
    def delete_job(service: Service, job_id: str) -> Response:
        service.delete(job_id)
        return Response(status_code=204)

    @v1.get("/jobs/{job_id}/metrics", response_model=list[MetricPoint], tags=["metrics"])
    def get_metrics(service: Service, job_id: str, since: int = -1) -> list[MetricPoint]:
        """Stored reports with seq > since."""
        return service.metrics(job_id, since)

    @v1.get("/jobs/{job_id}/metrics/stream", response_class=EventSourceResponse, tags=["metrics"])
    async def stream_metrics(service: Service, job_id: str, since: int = -1) -> AsyncIterator[ServerSentEvent]:
        """Server-sent events: one `metric` event per report, then an `end` event when the job ends."""
        await asyncio.to_thread(service.get, job_id)  # 404 before the stream opens
        while True:
            terminal = await asyncio.to_thread(service.is_terminal, job_id)
            for point in await asyncio.to_thread(service.metrics, job_id, since):
                since = point.seq
                yield ServerSentEvent(data=point.model_dump(mode="json"), event="metric", id=str(point.seq))
            if terminal:
                job = await asyncio.to_thread(service.get, job_id)
                yield ServerSentEvent(data={"status": job.status.value}, event="end")
                return
            await asyncio.sleep(STREAM_POLL_S)

    @v1.get("/jobs/{job_id}/logs", tags=["logs"])
    def get_logs(service: Service, job_id: str, follow: bool = False, offset: Annotated[int, Query(ge=0)] = 0) -> Response:
        """The job's driver log (all workers' output). `follow=true` streams until the job ends."""
        if not follow:
            text, _ = service.logs(job_id, offset)
            return Response(text, media_type="text/plain; charset=utf-8")
        service.get(job_id)

        async def chunks() -> AsyncIterator[str]:
            pos = offset
            while True:
                terminal = await asyncio.to_thread(service.is_terminal, job_id)
                text, pos_after = await asyncio.to_thread(service.logs, job_id, pos)
                pos = pos_after
                if text:
                    yield text
                if terminal:
                    return
                await asyncio.sleep(STREAM_POLL_S)

        return StreamingResponse(chunks(), media_type="text/plain; charset=utf-8")

    @v1.get("/jobs/{job_id}/checkpoints", response_model=list[CheckpointPublic], tags=["checkpoints"])
    def list_checkpoints(service: Service, job_id: str) -> list[CheckpointPublic]:
        return service.checkpoints(job_id)

    @v1.get("/jobs/{job_id}/checkpoints/{checkpoint_id}/download", tags=["checkpoints"])
    def download_checkpoint(service: Service, job_id: str, checkpoint_id: int) -> Response:
        """The checkpoint directory as a tar.gz."""
        filename, data = service.checkpoint_archive(job_id, checkpoint_id)
        return Response(data, media_type="application/gzip", headers={"Content-Disposition": f'attachment; filename="{filename}"'})

    @v1.get("/cluster", response_model=ClusterInfo, tags=["cluster"])
    def cluster(service: Service) -> ClusterInfo:
        return service.backend.cluster_info()

    v1.include_router(trials_router)  # a search's trials, lineage and best (api/trials_routes.py)
    v1.include_router(elastic_router)  # a job's worker count and placement over time (api/elastic_routes.py)
    app.include_router(v1)

    # The channel running jobs push their events on; authorised per job, not by the API token.
    @app.post("/v1/internal/jobs/{job_id}/events", status_code=204, include_in_schema=False)
    def push_events(request: Request, job_id: str, event: Annotated[dict, Body()], authorization: Annotated[str | None, Header()] = None) -> Response:
        service = svc(request)
        token = (authorization or "").partition(" ")[2].strip() or None
        if not service.check_events_token(job_id, token):
            raise Unauthorized("unknown job or wrong events token")
        service.ingest(job_id, [event], push=True)
        return Response(status_code=204)

    return app


def _maybe_stop_head(runtime: Runtime) -> None:
    """Stop the local head on shutdown unless jobs still train on it (they outlive us)."""
    active = runtime.service.list(status=None, labels={}, limit=10_000, offset=0).items
    if any(not j.status.is_terminal() for j in active):
        log.warning("leaving the local Ray head (pid %s) running: jobs are still active", runtime.head.pid)
        return
    runtime.head.stop()
