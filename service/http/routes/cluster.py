"""Routes about the service itself: readiness and liveness (no auth), the Ray cluster's nodes and
capacity as the dashboard reports them, and the server's replicas with the background
units each runs (server admins)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from api.errors import admin_only
from api.schemas import ClusterInfo, HealthPublic, LeasePublic, ReplicaPublic, ReplicasPublic
from service.http.deps import Cluster, CurrentCaller, HealthDep, LeasesDep
from service.http.openapi import errors

router = APIRouter(tags=["cluster"])
health_router = APIRouter(tags=["meta"])


@health_router.get(
    "/healthz",
    response_model=HealthPublic,
    operation_id="healthz",
    responses={503: {"model": HealthPublic, "description": "The store does not answer: not ready."}},
)
async def healthz(health: HealthDep, response: Response) -> HealthPublic:
    """Readiness: 200 while this replica's store answers (holding no lease, or Ray not
    answering, leaves it ready), 503 when it does not. Unauthenticated, cached for a second."""
    report = await health.report()
    if report.status != "ok":
        response.status_code = 503
    return report


@health_router.get("/livez", operation_id="livez")
def livez() -> dict[str, str]:
    """Liveness: the process answers HTTP. It asks nothing of the store or Ray, so an outage
    of either restarts no replica."""
    return {"status": "ok"}


@router.get("/cluster", response_model=ClusterInfo, operation_id="get_cluster", responses=errors(503))
def cluster(backend: Cluster) -> ClusterInfo:
    info = backend.cluster_info()
    info.warm_pool = backend.warm_pool()
    info.data_cache = backend.data_caches()
    return info


@router.get("/replicas", response_model=ReplicasPublic, operation_id="list_replicas", responses=errors(403))
def replicas(leases: LeasesDep, caller: CurrentCaller) -> ReplicasPublic:
    """The replicas on this store (seen in the last hour) and the lease of each background
    unit: which replica runs it, since when, under which fencing token. Server admins only."""
    if not caller.admin:
        raise admin_only("Listing the server's replicas")
    now, replica_rows, lease_rows = leases.listing()
    held: dict[str, list[str]] = {}
    for name, holder, _token, _since, expires in lease_rows:
        if holder is not None and expires > now:
            held.setdefault(holder, []).append(name)
    return ReplicasPublic(
        now=now,
        lease_ttl_s=leases.ttl_s,
        replicas=[ReplicaPublic(id=i, started_at=a, seen_at=b, leases=held.get(i, [])) for i, a, b in replica_rows],
        leases=[
            LeasePublic(name=n, holder=h, token=t, since=since, expires_in_s=round(e - now, 3))
            for n, h, t, since, e in lease_rows
        ],
    )
