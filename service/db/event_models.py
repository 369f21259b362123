"""The tables a job's events fill: its metric series and their rollup blocks, worker
groups, log chunks, checkpoints, and a search's trials, reports, exploits and result.
Each row goes with its job (ON DELETE CASCADE); rows an event makes carry its key
(``EventKey``: ``(job_id, attempt, src_seq)``) and are stored once."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from service.db.models import Base, EventKey, utcnow


class MetricRow(EventKey, Base):
    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("job_id", "attempt", "src_seq"), Index("ix_metrics_job_seq", "job_id", "seq"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    seq: Mapped[int] = mapped_column(Integer)  # gap-free position within the job
    ts: Mapped[float] = mapped_column(Float)
    step: Mapped[int | None] = mapped_column(BigInteger)
    epoch: Mapped[int | None] = mapped_column(BigInteger)
    values: Mapped[dict[str, Any]] = mapped_column(JSON)


class MetricRollupRow(Base):
    """Each numeric metric's min and max over an aligned block of a job's reports, kept by
    ingestion for the downsampled series (``service/events/rollups.py``)."""

    __tablename__ = "metric_rollups"
    __table_args__ = {"sqlite_with_rowid": False}  # rows kept in key order: a range of blocks is one sequential read

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    level: Mapped[int] = mapped_column(Integer, primary_key=True)  # block size: service/events/rollups.py
    block: Mapped[int] = mapped_column(Integer, primary_key=True)  # seq // block size
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    vmin: Mapped[float] = mapped_column(Float)
    vmax: Mapped[float] = mapped_column(Float)


class WorkerGroupRow(EventKey, Base):
    """One start of a job's Train worker group: first start, resize, restart."""

    __tablename__ = "worker_groups"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    seq: Mapped[int] = mapped_column(Integer)  # gap-free position within the job
    ts: Mapped[float] = mapped_column(Float)
    world_size: Mapped[int] = mapped_column(Integer)
    nodes: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    trial_id: Mapped[str | None] = mapped_column(String(64))  # a search trial's Train run


class TrialMetricRow(EventKey, Base):
    __tablename__ = "trial_metrics"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[str] = mapped_column(String(64), index=True)
    ts: Mapped[float] = mapped_column(Float)
    epoch: Mapped[int | None] = mapped_column(BigInteger)
    step: Mapped[int | None] = mapped_column(BigInteger)
    values: Mapped[dict[str, Any]] = mapped_column(JSON)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class ExploitRow(EventKey, Base):
    """A PBT exploit: a trial continued from a donor's checkpoint with a new config."""

    __tablename__ = "trial_exploits"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float)
    trial_id: Mapped[str] = mapped_column(String(64))
    donor_trial_id: Mapped[str] = mapped_column(String(64))
    donor_time: Mapped[float | None] = mapped_column(Float)
    trial_time: Mapped[float | None] = mapped_column(Float)
    donor_metric: Mapped[float | None] = mapped_column(Float)
    old_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    donor_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    new_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    checkpoint_path: Mapped[str | None] = mapped_column(Text)


class LogChunkRow(Base):
    """A bounded piece of a job's log (every attempt's, in order). Offsets count characters
    of the whole log taken in, so a range is one indexed query (``service/events/logs.py``)."""

    __tablename__ = "log_chunks"
    __table_args__ = (Index("ix_log_chunks_job_end", "job_id", "end_offset"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    text: Mapped[str] = mapped_column(Text)
    start_offset: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    end_offset: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    nbytes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # UTF-8 bytes of text
    head: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())  # kept whatever the cap
    # Set on the one row standing for the middle dropped under RAYDOCK_MAX_LOG_BYTES: its text says so.
    dropped_bytes: Mapped[int | None] = mapped_column(BigInteger)


class CheckpointRow(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    step: Mapped[int | None] = mapped_column(BigInteger)
    epoch: Mapped[int | None] = mapped_column(BigInteger)
    values: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class TrialRow(Base):
    __tablename__ = "trials"
    # The best so far of a search is the first row of this index (GET /v1/jobs/{id}/best).
    __table_args__ = (UniqueConstraint("job_id", "trial_id"), Index("ix_trials_job_best", "job_id", "best_metric"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    trial_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="PENDING")
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    reports: Mapped[int] = mapped_column(Integer, default=0)
    last_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    best_metric: Mapped[float | None] = mapped_column(Float)
    last_time: Mapped[float | None] = mapped_column(Float)  # its latest epoch or step
    best_attempt: Mapped[int | None] = mapped_column(Integer)  # the key of the report that holds best_metric
    best_seq: Mapped[int | None] = mapped_column(BigInteger)
    exploits: Mapped[int] = mapped_column(Integer, default=0)
    note: Mapped[str | None] = mapped_column(Text)
    # (attempt, seq) of the status event applied last: older ones arriving late are ignored.
    event_attempt: Mapped[int] = mapped_column(Integer, default=0)
    event_seq: Mapped[int] = mapped_column(BigInteger, default=-1)
    # When the search driver saw it start running (its first RUNNING event), and how many
    # seconds after that the server stored its first report: a trial's own start-up.
    started_ts: Mapped[float | None] = mapped_column(Float)
    first_metric_s: Mapped[float | None] = mapped_column(Float)
    # Its start-up phases and those of each restart after an exploit (service/events/trial_phases.py).
    phases: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class SearchResultRow(Base):
    """A search's best trial, as its driver reported it at the end."""

    __tablename__ = "search_results"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    trial_id: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    values: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    checkpoint_path: Mapped[str | None] = mapped_column(Text)
