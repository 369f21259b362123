"""What the API answers about the cluster: nodes, free capacity, the autoscaler, and
where a job's worker groups ran."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class WorkerPlacement(BaseModel):
    ip: str = Field(description="Address of the node the worker runs on.")
    node_id: str = Field(description="Ray node id.")


class WorkerGroupPublic(BaseModel):
    seq: int = Field(description="Position in the job's worker-group starts (0-based, gap-free).")
    attempt: int = Field(description="The job attempt (Ray job submission) it happened in.")
    ts: float = Field(description="Unix time the worker group started.")
    world_size: int = Field(description="Number of workers in the group.")
    nodes: list[WorkerPlacement] = Field(description="Where each worker runs, in rank order.")
    trial_id: str | None = Field(default=None, description="The search trial whose Train run it is (searches).")


class NodeTypeCapacity(BaseModel):
    name: str = Field(description="The autoscaler's node type.")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Resources of one node of this type, when known."
    )
    running: int = Field(description="Nodes of this type in the cluster now.")
    pending: int = Field(description="Nodes of this type being launched.")
    max_workers: int | None = Field(
        default=None, description="Most nodes of this type the autoscaler may run; None when unknown."
    )


class AutoscalerPublic(BaseModel):
    node_types: list[NodeTypeCapacity] = Field(description="Node types the autoscaler reports or is configured with.")
    cpus_addable: float | None = Field(
        description="CPUs the autoscaler can still add beyond the nodes present; None when its limits are unknown (counted as unbounded)."
    )
    gpus_addable: float | None = Field(description="GPUs it can still add; None when unknown.")
    limits_from: str | None = Field(
        default=None,
        description="The autoscaler config file the limits were read from (RAYDOCK_AUTOSCALER_CONFIG), if any.",
    )


class NodeInfo(BaseModel):
    node_id: str
    ip: str
    alive: bool
    is_head: bool
    cpus: float
    gpus: float
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Everything the node offers as Ray counts it: CPU, GPU, memory (bytes), accelerator_type:<name>, custom resources.",
    )


class WarmProcessPublic(BaseModel):
    """A node's warm process: drivers of jobs on that node are forked from it instead of
    starting a new Python (torch and ray.train already imported). It holds no CPUs or
    GPUs, so it never keeps capacity from a queued job."""

    node_id: str = Field(description="The Ray node it serves.")
    ready: bool = Field(description="True once it has imported what the drivers need and takes jobs.")
    pid: int | None = Field(default=None, description="Its process id on the node (None while it starts).")
    started_at: float = Field(description="Unix time its supervisor started.")
    restarts: int = Field(description="Times its supervisor started it again after it ended.")
    jobs_served: int = Field(description="Drivers it has forked since it started.")
    running: int = Field(description="Drivers forked from it that run now.")
    idle_since: float | None = Field(
        default=None, description="Unix time its last driver ended (None while one runs or before it is ready)."
    )
    idle_timeout_s: float = Field(description="It exits after this long without a job (RAYDOCK_WARM_IDLE_S).")


class DataCachePublic(BaseModel):
    """A node's dataset cache, as the node's keeper last reported it (RAYDOCK_DATA_CACHE_BYTES)."""

    node_id: str = Field(description="The Ray node whose cache this is.")
    entries: int = Field(description="Datasets cached on the node.")
    bytes: int = Field(description="Their size on disk.")
    cap_bytes: int = Field(description="The cache's cap; the least recently used entries are evicted beyond it.")
    hits: int = Field(description="Reads served from the cache, by every job on the node.")
    misses: int = Field(description="Reads that went to the source.")
    source_bytes: int = Field(description="Bytes read from the sources on those misses.")
    updated: float = Field(description="Unix time the keeper last saw a change.")


class ClusterInfo(BaseModel):
    address: str = Field(description="The Ray dashboard address raydock talks to.")
    nodes: list[NodeInfo]
    cpus_total: float
    cpus_free: float
    gpus_total: float
    gpus_free: float
    usage_at: float | None = Field(
        default=None,
        description="When Ray counted the usage that cpus_free and gpus_free come from (Unix seconds; "
        "its autoscaler's monitor counts every few seconds); None when Ray did not say.",
    )
    autoscaler: AutoscalerPublic | None = Field(
        default=None, description="What the cluster's autoscaler can add; None when the cluster has no autoscaler."
    )
    warm_pool: list[WarmProcessPublic] = Field(
        default_factory=list,
        description="The warm process of each node that has one (none until a job has run there; RAYDOCK_WARM_START).",
    )
    data_cache: list[DataCachePublic] = Field(
        default_factory=list,
        description="Each node's dataset cache (none until a job has used it there; RAYDOCK_DATA_CACHE_BYTES).",
    )


class LeasePublic(BaseModel):
    """One background unit's lease: which replica runs it now."""

    name: str = Field(description="The background unit (monitor, usage, webhooks, ...).")
    holder: str | None = Field(description="The replica that holds it (host/pid/random); None: free.")
    token: int = Field(description="Its fencing token: grows by one at every change of holder.")
    since: float | None = Field(description="Unix time (the database's clock) its holder took it.")
    expires_in_s: float = Field(description="Seconds until it expires unless renewed (negative: expired).")


class ReplicaPublic(BaseModel):
    id: str = Field(description="The replica: host/pid/random, made at its start.")
    started_at: float = Field(description="Unix time (the database's clock) it first claimed leases.")
    seen_at: float = Field(description="Unix time of its last claim.")
    leases: list[str] = Field(description="The units whose leases it holds now (unexpired).")


class ReplicasPublic(BaseModel):
    """The server's replicas on this store and the background units each runs."""

    now: float = Field(description="The database's clock now (Unix time).")
    lease_ttl_s: float = Field(description="How long a lease lasts unrenewed (RAYDOCK_LEASE_TTL_S).")
    replicas: list[ReplicaPublic] = Field(description="Replicas seen in the last hour, latest first (at most 100).")
    leases: list[LeasePublic] = Field(description="Every background unit's lease.")


class HealthPublic(BaseModel):
    """What GET /healthz says of the replica that answers: ready when its store answers.
    Nothing in it names the host, the process or a setting; it is answered to anyone."""

    status: Literal["ok", "unavailable"] = Field(
        description="ok (200): this replica serves requests; unavailable (503): its store does not answer."
    )
    store: bool = Field(description="Whether the database answered a query just now.")
    ray: bool = Field(description="Whether the Ray cluster answered just now (not needed to be ready: jobs wait).")
    leases: list[str] = Field(
        description="The background units this replica runs now (it holds their leases); empty on a standby."
    )
