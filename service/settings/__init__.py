"""The server's settings, in typed sections, each read from ``RAYDOCK_*`` environment
variables (and ``RAY_ADDRESS``, ``RAY_AUTH_TOKEN_PATH``): a section's field ``x`` is the
variable ``RAYDOCK_X`` unless the field names another. ``Settings()`` reads them all;
``Settings(storage={"data_dir": path})`` sets a field and reads the rest. Every bound is
defined once, in its section's module; no other server module reads the environment for
a setting (tests/test_architecture.py holds this)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from service.settings.clients import ClientLimits
from service.settings.cluster import ClusterSettings, StartupSettings
from service.settings.code import CodeSettings
from service.settings.events import EventSettings
from service.settings.faults import FaultSettings
from service.settings.http import AuthSettings, HttpSettings
from service.settings.replicas import ReplicaSettings
from service.settings.scheduling import SchedulingSettings
from service.settings.storage import RetentionSettings, StorageSettings
from service.settings.tracking import TrackingSettings
from service.settings.webhooks import WebhookSettings

__all__ = [
    "AuthSettings",
    "ClientLimits",
    "ClusterSettings",
    "CodeSettings",
    "EventSettings",
    "FaultSettings",
    "HttpSettings",
    "ReplicaSettings",
    "RetentionSettings",
    "SchedulingSettings",
    "Settings",
    "StartupSettings",
    "StorageSettings",
    "TrackingSettings",
    "WebhookSettings",
]


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    http: HttpSettings = Field(default_factory=HttpSettings, description="Where the API listens.")
    auth: AuthSettings = Field(default_factory=AuthSettings, description="The API's own tokens and token lifetimes.")
    clients: ClientLimits = Field(
        default_factory=ClientLimits, description="What one client, user or project may hold of the server."
    )
    storage: StorageSettings = Field(default_factory=StorageSettings, description="The data dir, database, storage.")
    retention: RetentionSettings = Field(default_factory=RetentionSettings, description="How long history is kept.")
    cluster: ClusterSettings = Field(default_factory=ClusterSettings, description="The Ray cluster and its polling.")
    startup: StartupSettings = Field(
        default_factory=StartupSettings, description="How a job's driver and workers start."
    )
    scheduling: SchedulingSettings = Field(
        default_factory=SchedulingSettings, description="Quotas, fair share, preemption."
    )
    replicas: ReplicaSettings = Field(
        default_factory=ReplicaSettings, description="How replicas share the background work."
    )
    code: CodeSettings = Field(default_factory=CodeSettings, description="Code jobs ship or upload.")
    events: EventSettings = Field(default_factory=EventSettings, description="What one job's events may store.")
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings, description="Server webhooks and deliveries.")
    tracking: TrackingSettings = Field(default_factory=TrackingSettings, description="Experiment tracker export.")
    faults: FaultSettings = Field(
        default_factory=FaultSettings, description="Faults a test injects; unset on a real server."
    )

    @property
    def local_head_token_path(self) -> Path:
        return self.cluster.ray_auth_token_path or self.storage.data_dir / "ray" / "auth_token"
