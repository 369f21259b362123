"""The Ray cluster the server runs jobs on, and how a job's processes start there: the
``cluster`` and ``startup`` sections of ``service.settings.Settings``."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field

from api.cluster_contract import DATA_CACHE_BYTES_ENV, DATA_CACHE_DIR_ENV
from service.settings.section import Section


class ClusterSettings(Section):
    ray_address: str | None = Field(
        default=None,
        validation_alias=AliasChoices("RAY_ADDRESS", "RAYDOCK_RAY_ADDRESS"),
        description="Dashboard URL of an existing Ray cluster (http://host:8265); a local head is started when unset.",
    )
    ray_auth_token_path: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("RAYDOCK_RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN_PATH"),
        description=(
            "Ray token file. The local head runs with token auth and this token (created, mode 0600, when "
            "missing; default <data_dir>/ray/auth_token). For a RAY_ADDRESS cluster: the token its dashboard expects."
        ),
    )
    local_num_cpus: int | None = Field(default=None, description="CPUs the local Ray head advertises (default: all).")
    autoscaler_config: str | None = Field(
        default=None,
        description="The Ray autoscaler's cluster config (YAML/JSON), for the node limits its status report leaves out.",
    )
    monitor_interval_s: float = Field(default=0.5, description="How often job statuses are polled.")
    cluster_lost_after_s: float = Field(
        default=120.0,
        description="Fail active jobs (INFRASTRUCTURE) once the Ray cluster has been unreachable this long.",
    )

    data_cache_bytes: int = Field(
        default=0,
        ge=0,
        le=2**50,
        description=(
            "Cap of each node's dataset cache in bytes (built-in datasets and tables read once per node, kept for "
            "later epochs, trials and jobs; least recently used evicted first); 0: off."
        ),
    )
    data_cache_dir: str | None = Field(
        default=None,
        max_length=1024,
        pattern=r"^/[^\x00-\x1f\x7f]*$",
        description=(
            "The dataset cache's directory on each node (absolute); default raydock-data-cache-<uid> in the "
            "node's temporary directory. Only the jobs use it: the server never reads it."
        ),
    )

    @property
    def data_cache_env(self) -> dict[str, str]:
        """What a job's processes need to use their node's dataset cache; nothing when it is off."""
        if not self.data_cache_bytes:
            return {}
        return {DATA_CACHE_BYTES_ENV: str(self.data_cache_bytes), DATA_CACHE_DIR_ENV: self.data_cache_dir or ""}


class StartupSettings(Section):
    local_ranks: bool = Field(
        default=True,
        description=(
            "Run a fixed-size training job whose workers fit one node as processes forked from its Ray job "
            "driver (Ray Train local mode, torchrun's environment) instead of Train controller and worker actors."
        ),
    )
    warm_start: bool = Field(
        default=True,
        description=(
            "Start each job's driver as a fork of its node's warm process (torch and ray.train already imported); "
            "false: every driver is a new Python process, as before."
        ),
    )
    warm_idle_s: float = Field(
        default=600.0,
        ge=1,
        le=7 * 24 * 3600,
        description="How long a node's warm process waits for a job before it exits (the next job there starts cold).",
    )
    train_health_check_interval_s: float = Field(
        default=0.2,
        description="Ray Train controller poll interval for jobs; low values surface reports and job ends sooner.",
    )
    worker_start_timeout_s: float = Field(default=60.0, description="How long a worker group may take to start.")
    search_stall_s: float = Field(
        default=120.0,
        ge=1,
        le=7 * 24 * 3600,
        description=(
            "How long a search may go with no trial running while one could start (every trial left PAUSED or "
            "PENDING, room on the cluster for one) before it fails naming its trials; a search's own "
            "stall_timeout_s wins."
        ),
    )
