"""What the API answers about jobs: the job record, its metric series and checkpoints."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from api.schemas.common import FailureCause, JobStatus
from api.schemas.events import PHASE_NAMES
from api.schemas.quotas import JobUsage

# The store may hand back naive datetimes (SQLite keeps no offset); they are UTC, and the
# API always says so, as OpenAPI's date-time format requires.
UtcDatetime = Annotated[datetime, AfterValidator(lambda d: d if d.tzinfo else d.replace(tzinfo=timezone.utc))]


class JobPublic(BaseModel):
    id: str = Field(description="Job id.")
    name: str
    kind: str
    status: JobStatus
    status_reason: str | None = Field(default=None, description="Why the job is in its status.")
    failure_cause: FailureCause | None = Field(default=None, description="Set when FAILED.")
    error: str | None = Field(default=None, description="The error message and traceback tail when FAILED.")
    labels: dict[str, str] = Field(default_factory=dict)
    project: str = Field(default="default", description="The project the job belongs to.")
    spec: dict[str, Any] = Field(description="The submitted spec with defaults filled in.")
    created_at: UtcDatetime
    started_at: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None
    attempt: int = Field(default=0, description="Number of times the job has been started.")
    ray_job_id: str | None = Field(default=None, description="The Ray job submission id.")
    latest_metrics: dict[str, Any] | None = Field(default=None, description="The last reported metrics.")
    queue_position: int | None = Field(
        default=None,
        description="1-based place in the queue while QUEUED, as of the monitor's last pass (null until then).",
    )
    dropped_events: int = Field(
        default=0,
        description="Events from the job's driver that were ignored: they did not validate, or the job was past a per-job bound.",
    )
    last_dropped_reason: str | None = Field(default=None, description="Why the last ignored event was refused.")
    restarts: list["RestartInfo"] = Field(
        default_factory=list,
        description="The newest worker-group restarts from checkpoint within the job's attempts, with why "
        "(at most RAYDOCK_MAX_RESTARTS_KEPT; `restarts_total` counts them all).",
    )
    restarts_total: int = Field(default=0, description="Worker-group restarts in all, listed or not.")
    project: str = Field(default="default", description="The project the job runs in (its quota and fair share).")
    borrowed: bool = Field(
        default=False,
        description="Started beyond its project's guarantee: it may be preempted (checkpointed, requeued) "
        "when a project under its guarantee needs the room.",
    )
    granted_workers: int | None = Field(
        default=None,
        description="An elastic job, once admitted: the most workers its attempt may grow to, its "
        "scaling.num_workers.max clamped to its project's quota (max_cpus, max_gpus) and to what the cluster "
        "could ever hold. Ray Train gets it as the max, and the job's quota use, usage and borrowing count it.",
    )
    usage: "JobUsage" = Field(
        default_factory=lambda: JobUsage(),
        description="CPU- and GPU-seconds the job held while running, all attempts together.",
    )
    start_phases: dict[str, float] | None = Field(
        default=None,
        description="The latest attempt's start-up phases reached so far, in order, each in seconds after the "
        "attempt was queued (its POST, or the resume): " + ", ".join(PHASE_NAMES) + ". Absent for a job stored "
        "before phases were recorded.",
    )


def phase_seconds(stored: dict[str, Any] | None) -> dict[str, float] | None:
    """Stored phases (``{phase: Unix time}``) as the API answers them: seconds after
    ``queued``, in the phases' order, rounded to milliseconds."""
    if not stored or not isinstance(stored.get("queued"), (int, float)):
        return None
    origin = stored["queued"]
    return {
        name: round(stored[name] - origin, 3)
        for name in PHASE_NAMES
        if isinstance(stored.get(name), (int, float)) and not isinstance(stored.get(name), bool)
    }


MAX_CANCEL_IDS = 1000
JobIdText = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")]


class CancelJobs(BaseModel):
    """POST /v1/jobs:cancel: many jobs at once (e.g. a whole queue, page by page)."""

    model_config = ConfigDict(extra="forbid")
    ids: list[JobIdText] = Field(
        min_length=1, max_length=MAX_CANCEL_IDS, description=f"Jobs to cancel, at most {MAX_CANCEL_IDS}."
    )


class CancelRefusal(BaseModel):
    id: str
    code: str = Field(description="`job_not_found` or `job_finished`.")
    message: str


class CancelledJobs(BaseModel):
    cancelled: list[str] = Field(description="Jobs now CANCELLED (they were queued) or CANCELLING (they had started).")
    refused: list[CancelRefusal] = Field(default_factory=list, description="Jobs not cancelled, each with why.")


class RestartInfo(BaseModel):
    attempt: int = Field(description="The job attempt (Ray job submission) it happened in.")
    at: float = Field(description="Unix time of the failure.")
    reason: str = Field(description="The worker failure that caused the restart.")


class JobList(BaseModel):
    items: list[JobPublic]
    total: int = Field(description="Jobs matching the filters, in all.")
    limit: int
    offset: int
    next: str | None = Field(
        default=None,
        description="Cursor of the next page (pass it as `cursor`); null on the last page. Pages stay complete "
        "and in order while jobs are added: newer jobs sort before the first page.",
    )


class MetricPoint(BaseModel):
    seq: int = Field(description="Position in the job's report sequence (0-based, gap-free).")
    attempt: int = Field(default=1, description="The job attempt that reported it (resume starts a new one).")
    ts: float = Field(description="Unix time the report was made.")
    step: int | None = None
    epoch: int | None = None
    metrics: dict[str, Any]
    # Set only in a downsampled series (`max_points`): the point is the last report of a
    # bucket of consecutive reports, and these say what the bucket held.
    points: int = Field(
        default=1, description="Reports this point stands for (a bucket of a downsampled series; 1 otherwise)."
    )
    first_seq: int | None = Field(default=None, description="Downsampled: seq of the bucket's first report.")
    metrics_min: dict[str, float] | None = Field(
        default=None, description="Downsampled: each numeric metric's smallest value in the bucket."
    )
    metrics_max: dict[str, float] | None = Field(
        default=None, description="Downsampled: each numeric metric's largest value in the bucket."
    )


class CheckpointPublic(BaseModel):
    id: int = Field(description="Checkpoint id within raydock.")
    path: str = Field(description="Where the checkpoint lives in storage.")
    step: int | None = None
    epoch: int | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    created_at: UtcDatetime
