"""``GET /metrics``: the server's own metrics in Prometheus' text format (not a job's
reports: those are ``/v1/jobs/{job_id}/metrics``, ``routes/metrics.py``). Outside /v1 and
the OpenAPI contract; it asks for ``RAYDOCK_METRICS_TOKEN`` when one is set, else for the
API token when one is set (without either, the request guard admits loopback clients only)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.errors import Unauthorized
from service.http.deps import AppSettings, bearer_token, token_matches
from service.telemetry.instruments import REGISTRY

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, settings: AppSettings) -> Response:
    expected = settings.metrics_token or settings.api_token
    if expected and not token_matches(bearer_token(request.headers.get("authorization")), expected):
        raise Unauthorized(
            "Missing or wrong metrics token. Send 'Authorization: Bearer <token>' with RAYDOCK_METRICS_TOKEN, "
            "or the API token when no metrics token is set."
        )
    body = generate_latest(REGISTRY) + generate_latest(request.app.state.store_metrics)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
