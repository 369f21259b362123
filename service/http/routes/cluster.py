"""Routes about the service itself: liveness (no auth) and the Ray cluster's nodes and
capacity as the dashboard reports them."""

from __future__ import annotations

from fastapi import APIRouter

from api.schemas import ClusterInfo
from service.http.deps import Cluster
from service.http.openapi import errors

router = APIRouter(tags=["cluster"])
health_router = APIRouter(tags=["meta"])


@health_router.get("/healthz", operation_id="healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/cluster", response_model=ClusterInfo, operation_id="get_cluster", responses=errors(503))
def cluster(backend: Cluster) -> ClusterInfo:
    info = backend.cluster_info()
    info.warm_pool = backend.warm_pool()
    return info
