"""``GET /metrics``: the server's own metrics in Prometheus' text format (not a job's
reports: those are ``/v1/jobs/{job_id}/metrics``, ``routes/metrics.py``). Outside /v1 and
the OpenAPI contract. It names every project's running jobs, so it asks for a token:
``RAYDOCK_METRICS_TOKEN`` when one is set, else the API token when one is set, or a
server admin's user token either way. With neither setting, loopback clients (the
request guard admits no others) need none only while local mode lasts."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.orm import sessionmaker

from api.errors import Unauthorized
from service.http.deps import AppSettings, Store, UsersDep, bearer_token, token_matches
from service.telemetry.instruments import REGISTRY
from service.tenancy.caller import authenticate
from service.tenancy.tokens import looks_like_token

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, settings: AppSettings, users: UsersDep, store: Store) -> Response:
    token = bearer_token(request.headers.get("authorization"))
    expected = settings.auth.metrics_token or settings.auth.api_token
    if not (expected and token_matches(token, expected)) and not _server_admin_token(store, token):
        if expected or users.local_mode.ended():
            raise Unauthorized(
                "Missing or wrong metrics token. Send 'Authorization: Bearer <token>' with RAYDOCK_METRICS_TOKEN "
                "(or the API token when no metrics token is set), or a server admin's user token."
            )
    body = generate_latest(REGISTRY) + generate_latest(request.app.state.store_metrics)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def _server_admin_token(store: sessionmaker, token: str | None) -> bool:
    if not looks_like_token(token):
        return False
    caller = authenticate(store, token)
    return caller is not None and caller.admin
