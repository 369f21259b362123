"""The job store: every table of raydock and the engine (SQLite in WAL mode by default,
Postgres by URL). Jobs, their status history, metrics, logs, checkpoints, worker groups
and a search's trials all live here, so they outlive both the API process and the Ray
cluster. Rows a job's events create carry ``(job_id, attempt, src_seq)`` (``EventKey``)
and are stored once each (``seen``); they go with their job (ON DELETE CASCADE)."""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    func,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, declared_attr, mapped_column, sessionmaker

# The engine lives in its own module; these names stay importable from here.


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def aware(t: datetime) -> datetime:
    """SQLite returns naive datetimes for what was stored as UTC."""
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), index=True)
    status_reason: Mapped[str | None] = mapped_column(Text)
    failure_cause: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    # Attempts Ray has accepted; the one being submitted is `submission_id` until Ray has it.
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    ray_job_id: Mapped[str | None] = mapped_column(String(128))
    # The Ray submission id fixed (and stored) before the submit call, reused on a retry.
    submission_id: Mapped[str | None] = mapped_column(String(128))
    # sha256 of the current attempt's events token; the token itself reaches only the driver.
    events_token_hash: Mapped[str | None] = mapped_column(String(64))
    # The sha256 of the launch file written for the attempt being prepared (its driver checks it).
    launch_sha256: Mapped[str | None] = mapped_column(String(64))
    log_offset: Mapped[int] = mapped_column(Integer, default=0)  # chars of the current attempt's log stored
    latest_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    # A submit's Idempotency-Key, unique within its project (another project may use the same
    # key: uq_jobs_project_idempotency_key). ``idempotency_key`` held it before migration 0014,
    # unique server-wide; that emptied it and nothing writes it since. It stays because SQLite
    # cannot drop a UNIQUE column without rebuilding ``jobs``, which would cascade to every job's rows.
    project_idempotency_key: Mapped[str | None] = mapped_column(String(200))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    idempotency_hash: Mapped[str | None] = mapped_column(String(64))  # sha256 of the body sent with the key
    restarts: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    queued_at: Mapped[datetime | None]  # when it last entered the queue: the scheduling deadline counts from here
    attempt_started_at: Mapped[datetime | None]  # max_runtime_s counts from here, per attempt
    dropped_events: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_dropped_reason: Mapped[str | None] = mapped_column(Text)
    # Per-job counters, so storing an event never counts a series (service/events/ingest.py).
    metrics_stored: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # the next metric seq
    attempt_metrics: Mapped[int] = mapped_column(
        Integer, default=0, server_default="0"
    )  # metrics of attempt `attempt_metrics_of`
    attempt_metrics_of: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    worker_groups_stored: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Rows a job's events made, each kind capped per job (service/events/limits.py).
    trial_metrics_stored: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    trials_stored: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    checkpoints_stored: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    exploits_stored: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    restarts_total: Mapped[int] = mapped_column(
        Integer, default=0, server_default="0"
    )  # `restarts` keeps the newest few
    # Set while its rows are deleted a chunk at a time (service/db/purge.py): it can no longer be resumed.
    deleting: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    log_end: Mapped[int] = mapped_column(
        BigInteger, default=0, server_default="0"
    )  # chars of every attempt's log taken in
    log_stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # what the chunks hold now
    # What admission needs, parsed once at submit (service/scheduling/queue.py), so no tick parses a spec.
    demand_cpus: Mapped[float | None] = mapped_column(Float)  # to start (an elastic job: its min)
    demand_gpus: Mapped[float | None] = mapped_column(Float)
    holds_cpus: Mapped[float | None] = mapped_column(Float)  # once started (an elastic job: its granted max)
    holds_gpus: Mapped[float | None] = mapped_column(Float)
    # An elastic job's range (scaling.num_workers {min, max}; NULL: a fixed size), and the most
    # workers its attempt was granted at admission: max clamped to its project's quota and
    # the cluster. holds_* count the grant from then on, and Ray Train gets it as its max.
    min_workers: Mapped[int | None] = mapped_column(Integer)
    max_workers: Mapped[int | None] = mapped_column(Integer)
    granted_workers: Mapped[int | None] = mapped_column(Integer)
    # Beyond CPUs and GPUs (memory, custom resources, accelerator_type:<name> GPUs); NULL: nothing.
    demand_extra: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    holds_extra: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    scheduling_timeout_s: Mapped[float | None] = mapped_column(Float)
    max_runtime_s: Mapped[float | None] = mapped_column(Float)
    # Event-log rows the job's own events made (checkpoints, restarts, resizes), capped per job.
    log_events: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # 1-based place in the queue, written by the monitor once per tick (None: not waiting).
    queue_position: Mapped[int | None] = mapped_column(Integer)
    # Tenancy (service/tenancy/): the project it runs in; started beyond its project's
    # guarantee (it may be preempted); what it held x how long it ran, all attempts; how far
    # that is counted; when a preempted attempt is stopped if it has not checkpointed by then.
    project: Mapped[str] = mapped_column(String(64), default="default", server_default="default", index=True)
    borrowed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    cpu_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    usage_as_of: Mapped[datetime | None]
    preempt_deadline: Mapped[datetime | None]
    user_id: Mapped[int | None] = mapped_column(Integer)  # who submitted it; NULL for jobs older than users
    # The latest attempt's start-up phases, {phase: Unix time}, from its queueing on
    # (service/stored/phases.py); GET /v1/jobs/{id} answers them as seconds after it.
    start_phases: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # A pipeline's step: its pipeline (service/pipelines/); and the checkpoint its init_from
    # resolved to when its dependencies ended (one the server lists as complete for that job).
    pipeline_id: Mapped[str | None] = mapped_column(String(32), index=True)
    init_checkpoint: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index("ix_jobs_created_id", "created_at", "id"),  # GET /v1/jobs, newest first (keyset)
        Index("ix_jobs_status_created_id", "status", "created_at", "id"),  # the same, by status
        Index("ix_jobs_status_finished", "status", "finished_at"),  # history retention, oldest first
        Index("ix_jobs_submission", "submission_id"),  # the few jobs being submitted (NULL for all others)
        Index("ix_jobs_status_deadline", "status", "scheduling_timeout_s"),  # queued jobs with a deadline
        Index("ix_jobs_status_demand", "status", "demand_cpus", "demand_gpus"),  # queued jobs too big for the cluster
        Index("ix_jobs_status_kind", "status", "kind"),  # GET /metrics counts jobs by both from this index alone
        Index("ix_jobs_status_project", "status", "project"),  # admission's per-project counts
        Index("uq_jobs_project_idempotency_key", "project", "project_idempotency_key", unique=True),
    )


# The queue in its order (priority descending, then arrival): admission reads its head, and
# the stored positions are checked from this index alone.
Index(
    "ix_jobs_queue",
    JobRow.status,
    JobRow.priority.desc(),
    JobRow.queued_at,
    JobRow.id,
    JobRow.submission_id,
    JobRow.queue_position,
)

# Each project's queue in its order: admission reads every project's head (service/tenancy/).
Index("ix_jobs_project_queue", JobRow.status, JobRow.project, JobRow.priority.desc(), JobRow.queued_at, JobRow.id)


class JobLabelRow(Base):
    """One label of a job, so label filters are an indexed lookup (the job's ``labels``
    JSON stays the copy the API answers with). It carries the job's ``created_at``, so a
    page of jobs with a label is read newest first straight from this table's index."""

    __tablename__ = "job_labels"
    __table_args__ = (Index("ix_job_labels_key_value_created", "key", "value", "created_at", "job_id"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime]  # the job's


class TransitionRow(Base):
    __tablename__ = "job_transitions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    from_status: Mapped[str | None] = mapped_column(String(16))
    to_status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(default=utcnow)


class EventKey:
    """The key of a row made from a job's event: the attempt it came in and the
    sequence number the job gave it. Each is stored once (``seen``)."""

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    src_seq: Mapped[int] = mapped_column(BigInteger)  # the sequence number the job gave it (below 2**53)

    @declared_attr.directive
    def __table_args__(cls) -> tuple:
        return (UniqueConstraint("job_id", "attempt", "src_seq"),)


def count(s: Session, table: type[Base], *where) -> int:
    return int(s.scalar(select(func.count()).select_from(table).where(*where)) or 0)


class ServerMetaRow(Base):
    """Facts of this store itself, e.g. the id its Ray jobs carry in their metadata so
    reconciliation touches only the Ray jobs this store started."""

    __tablename__ = "server_meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class CodePackageRow(Base):
    """An uploaded code package: a zip under ``<storage>/_code/<sha256>.zip``
    (``service/code/packages.py``)."""

    __tablename__ = "code_packages"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size_bytes: Mapped[int] = mapped_column(Integer)  # the caps keep both under 2 GiB
    files: Mapped[int] = mapped_column(Integer)
    content_bytes: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)  # retention counts from here


class JobCodeRow(Base):
    """A job's reference to its code package: while it exists, the package is kept."""

    __tablename__ = "job_code"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), index=True)


def store_id(sessions: sessionmaker) -> str:
    """The id of this store, made once on first use."""
    with sessions.begin() as s:
        row = s.get(ServerMetaRow, "store_id")
        if row is None:
            row = ServerMetaRow(key="store_id", value="rd" + secrets.token_hex(8))
            s.add(row)
        return row.value
