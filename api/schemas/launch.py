"""What the server hands the cluster, typed: an attempt's launch file and the facts a
node's warm pool prints.

The server writes a ``LaunchFile`` under the job's own storage prefix
(``service/attempts.py``) and names its URI and sha256 in the driver's environment
(``api.cluster_contract``); the driver reads it back through the same model
(``trainers/launch.py``). The warm pool's supervisor prints ``WarmPoolFacts``
(``trainers/zygote/supervisor.py``) and the server reads them for ``GET /v1/cluster``
(``service/cluster/warm_pool.py``). A key one side writes and the other does not know
fails loudly (``extra="forbid"``) rather than being dropped.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Uri = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
Id = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class LaunchFile(BaseModel):
    """One attempt's launch file: what its driver needs and may not take from the
    environment (too big for it, or secret: Ray's job list shows the environment to every job)."""

    model_config = ConfigDict(extra="forbid")

    job_id: Id = Field(description="The raydock job the driver runs.")
    attempt: int = Field(ge=0, description="The attempt this file starts.")
    submission_id: Id = Field(
        description="The Ray submission id of this attempt; every events post names it, and the token is good for it only."
    )
    storage_path: Uri = Field(description="The storage root; the job's prefix is under it.")
    spec: dict[str, Any] = Field(
        description="The job spec as JSON, without its webhooks (a webhook URL may carry a token); the driver validates it."
    )
    events_url: Uri | None = Field(
        default=None, description="Where the driver posts its events; None: events go to the log only."
    )
    events_token: Annotated[str, StringConstraints(max_length=256)] | None = Field(
        default=None, description="This attempt's events token."
    )
    init_checkpoint: Uri | None = Field(
        default=None,
        description="The checkpoint the run starts from (the job's init_from, resolved by the server to one it "
        "lists as complete for that job); the run's own checkpoints take over once it has one.",
    )
    local_ranks: dict[str, float] | None = Field(
        default=None,
        description="The workers' resources the driver's Ray job holds: it forks the workers as local ranks "
        "(trainers.ranks). None: Ray Train's worker actors.",
    )
    trial_ranks: bool = Field(
        default=False,
        description="A search: the trials whose workers fit one node may run them as local ranks "
        "(tuning.trial_ranks). False: every trial is a Ray Train run.",
    )


class WarmPoolFacts(BaseModel):
    """What a node's warm pool supervisor prints on each change, as one
    ``RAYDOCK_WARM_POOL {json}`` line of its stdout."""

    model_config = ConfigDict(extra="forbid")

    node_id: str = Field(max_length=256, description="The Ray node (hex) the pool serves.")
    pid: int | None = Field(default=None, description="The warm process's pid; None while it starts.")
    ready: bool = Field(default=False, description="True once the warm process has written its stats.")
    started: float = Field(default=0.0, description="Unix time the supervisor started.")
    restarts: int = Field(default=0, description="Times the supervisor started the warm process again.")
    jobs_served: int = Field(default=0, description="Drivers the warm process has forked.")
    running: int = Field(default=0, description="Drivers forked from it that run now.")
    idle_since: float | None = Field(default=None, description="Unix time its last driver ended.")
    idle_timeout_s: float = Field(default=0.0, description="It exits after this long without a job.")


class DataCacheFacts(BaseModel):
    """What a node's dataset cache keeper prints on each change, as one
    ``RAYDOCK_DATA_CACHE {json}`` line of its stdout (``trainers/data/cache_keeper.py``)."""

    model_config = ConfigDict(extra="forbid")

    node_id: str = Field(max_length=256, description="The Ray node (hex) whose cache this is.")
    entries: int = Field(default=0, ge=0, description="Datasets cached on the node.")
    bytes: int = Field(default=0, ge=0, description="Their size on disk.")
    cap_bytes: int = Field(default=0, ge=0, description="The cache's cap (RAYDOCK_DATA_CACHE_BYTES).")
    hits: int = Field(default=0, ge=0, description="Reads served from the cache.")
    misses: int = Field(default=0, ge=0, description="Reads that went to the source.")
    source_bytes: int = Field(default=0, ge=0, description="Bytes read from the sources on those misses.")
    updated: float = Field(default=0.0, description="Unix time the keeper last looked.")
