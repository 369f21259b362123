"""Server settings, read from ``RAYDOCK_*`` environment variables (and ``RAY_ADDRESS``)."""

from __future__ import annotations

import ipaddress
from functools import cached_property
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RAYDOCK_", extra="ignore")

    data_dir: Path = Field(default=Path.home() / ".raydock", description="Where SQLite, the local cluster and checkpoints live.")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; SQLite in data_dir when unset.")
    storage_path: str | None = Field(default=None, description="Checkpoint storage: a directory or a pyarrow URI (s3://...).")
    ray_address: str | None = Field(
        default=None,
        validation_alias=AliasChoices("RAY_ADDRESS", "RAYDOCK_RAY_ADDRESS"),
        description="Dashboard URL of an existing Ray cluster (http://host:8265); a local head is started when unset.",
    )
    host: str = Field(default="127.0.0.1", description="Address the API listens on.")
    port: int = Field(default=8000, description="Port the API listens on.")
    public_url: str | None = Field(
        default=None, description="URL the cluster uses to reach this API for live events; derived from host/port when unset."
    )
    api_token: str | None = Field(default=None, description="Bearer token required by the API; mandatory off loopback.")
    local_num_cpus: int | None = Field(default=None, description="CPUs the local Ray head advertises (default: all).")
    monitor_interval_s: float = Field(default=0.5, description="How often job statuses are polled.")
    train_health_check_interval_s: float = Field(
        default=0.2,
        description="Ray Train controller poll interval for jobs; low values surface reports and job ends sooner.",
    )
    cluster_lost_after_s: float = Field(
        default=120.0, description="Fail active jobs (INFRASTRUCTURE) once the Ray cluster has been unreachable this long."
    )
    worker_start_timeout_s: float = Field(default=60.0, description="How long a worker group may take to start.")
    autoscaler_config: str | None = Field(
        default=None,
        description="The Ray autoscaler's cluster config (YAML/JSON), for the node limits its status report leaves out.",
    )

    @cached_property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'raydock.db'}"

    @cached_property
    def resolved_storage_path(self) -> str:
        return self.storage_path or str((self.data_dir / "storage").resolve())

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def events_base_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "localhost") else self.host
        return f"http://{host}:{self.port}"
