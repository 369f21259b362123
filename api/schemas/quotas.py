"""Project quotas and usage accounting: what ``PUT /v1/projects/{name}/quota`` takes,
what ``GET`` answers, and ``GET /v1/usage``'s report."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from api.schemas.common import Strict

MAX_QUOTA_CPUS = 1_000_000.0
MAX_QUOTA_GPUS = 100_000.0
MAX_QUOTA_JOBS = 10_000_000


def _cpus(what: str) -> object:
    return Field(default=None, ge=0, le=MAX_QUOTA_CPUS, description=f"{what} (null: no limit).")


class QuotaSpec(Strict):
    """A project's quota. ``guaranteed_*``: what the project can always get (its jobs within it
    start before any other project's and may take back borrowed room by preemption); ``max_*``:
    what it may reach by borrowing idle capacity. Null maxima are unlimited; a null guarantee is 0."""

    guaranteed_cpus: float | None = Field(
        default=None, ge=0, le=MAX_QUOTA_CPUS, description="CPUs the project can always get (null: 0)."
    )
    guaranteed_gpus: float | None = Field(
        default=None, ge=0, le=MAX_QUOTA_GPUS, description="GPUs the project can always get (null: 0)."
    )
    max_cpus: float | None = Field(
        default=None,
        ge=0,
        le=MAX_QUOTA_CPUS,
        description="Most CPUs its running jobs hold, borrowing included (null: no limit).",
    )
    max_gpus: float | None = Field(
        default=None, ge=0, le=MAX_QUOTA_GPUS, description="Most GPUs its running jobs hold (null: no limit)."
    )
    max_running: int | None = Field(
        default=None, ge=0, le=MAX_QUOTA_JOBS, description="Most jobs running at once (null: no limit)."
    )
    max_queued: int | None = Field(
        default=None,
        ge=0,
        le=MAX_QUOTA_JOBS,
        description="Most jobs waiting in the queue; one more submit gets 429 quota_exceeded (null: no limit).",
    )


class QuotaPublic(QuotaSpec):
    project: str = Field(description="The project slug.")
    source: str = Field(description="`project`: set for this project; `default`: the server's RAYDOCK_DEFAULT_QUOTA.")
    cpus_in_use: float = Field(default=0, description="CPUs its started jobs hold now.")
    gpus_in_use: float = Field(default=0, description="GPUs its started jobs hold now.")
    running: int = Field(default=0, description="Its started jobs now.")
    queued: int = Field(default=0, description="Its jobs waiting in the queue now.")
    decayed_cpu_seconds: float = Field(
        default=0, description="Recent CPU-seconds, decayed by the fair-share half-life."
    )
    decayed_gpu_seconds: float = Field(
        default=0, description="Recent GPU-seconds, decayed by the fair-share half-life."
    )


class JobUsage(BaseModel):
    cpu_seconds: float = Field(default=0.0, description="CPUs held x seconds running, all attempts.")
    gpu_seconds: float = Field(default=0.0, description="GPUs held x seconds running, all attempts.")


class UsageRow(BaseModel):
    project: str
    user: str | None = Field(default=None, description="The submitting user (null until users exist).")
    cpu_seconds: float
    gpu_seconds: float
    jobs: int = Field(description="Jobs that ran within the range.")


class UsagePublic(BaseModel):
    since: datetime | None
    until: datetime | None
    rows: list[UsageRow] = Field(default_factory=list, description="One row per project (and user), by project.")
