"""The job store: SQLAlchemy tables and the engine (SQLite in WAL mode by default,
Postgres by URL). Jobs, their status history, metrics, logs and checkpoints all live
here, so they outlive both the API process and the Ray cluster."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


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
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    ray_job_id: Mapped[str | None] = mapped_column(String(128))
    events_token: Mapped[str | None] = mapped_column(String(64))
    log_offset: Mapped[int] = mapped_column(Integer, default=0)  # chars of the current attempt's log stored
    latest_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    restarts: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    queued_at: Mapped[datetime | None]  # when it last entered the queue: the scheduling deadline counts from here


class TransitionRow(Base):
    __tablename__ = "job_transitions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    from_status: Mapped[str | None] = mapped_column(String(16))
    to_status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(default=utcnow)


class MetricRow(Base):
    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("job_id", "attempt", "src_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    src_seq: Mapped[int] = mapped_column(Integer)  # the sequence number the job gave it
    seq: Mapped[int] = mapped_column(Integer)  # gap-free position within the job
    ts: Mapped[float] = mapped_column(Float)
    step: Mapped[int | None] = mapped_column(Integer)
    epoch: Mapped[int | None] = mapped_column(Integer)
    values: Mapped[dict[str, Any]] = mapped_column(JSON)


class LogChunkRow(Base):
    __tablename__ = "log_chunks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    text: Mapped[str] = mapped_column(Text)


class CheckpointRow(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    step: Mapped[int | None] = mapped_column(Integer)
    epoch: Mapped[int | None] = mapped_column(Integer)
    values: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(conn, _record) -> None:
            # WAL lets readers (streams, list calls) run while the monitor writes.
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

    else:
        engine = create_engine(url, pool_pre_ping=True)
    migrate(engine)
    return engine


def import_models() -> None:
    """Every module that defines tables, so the metadata (and migrations) see them all."""
    import service.elastic  # noqa: F401
    import service.trials  # noqa: F401


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (creating it on a new database)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", "service:migrations")
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def make_sessionmaker(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)
