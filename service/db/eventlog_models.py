"""Tables of the event log (``service/eventlog/``): the append-only log itself, the
webhook subscriptions a job's spec asked for, and each webhook delivery's state.

None of them references ``jobs``: a job's events outlive the job (an audit of who
deleted it), and so do its subscriptions, until the event log's retention trims them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from service.db.models import Base, utcnow

# SQLite makes a rowid alias only of INTEGER PRIMARY KEY: BIGINT there would not autoincrement.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class EventLogRow(Base):
    """One thing that happened, written in the transaction of the change it records.
    ``id`` only grows: it is the cursor readers and the webhook fan-out page by."""

    __tablename__ = "event_log"
    __table_args__ = (
        Index("ix_event_log_job_id", "job_id", "id"),  # one job's events, in order
        Index("ix_event_log_type_id", "type", "id"),
        Index("ix_event_log_at", "at"),  # retention, oldest first
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    job_id: Mapped[str | None] = mapped_column(String(32))  # None: an event of the server
    type: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(128))
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class WebhookRow(Base):
    """A subscription from a job's spec (``notify``), with the secret its deliveries are
    signed with (generated at submit, shown only to an authenticated GET)."""

    __tablename__ = "webhooks"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "<job id>-<n>"
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSON)
    secret: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class DeliveryRow(Base):
    """One event to one subscription: ``pending`` until the receiver answers 2xx
    (``delivered``) or the attempts run out (``failed``). Kept in the store, so a
    restarted server resumes what was pending (at least once)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("subscription", "event_id"),
        Index("ix_webhook_deliveries_state_sub_event", "state", "subscription", "event_id"),
        Index("ix_webhook_deliveries_created", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    subscription: Mapped[str] = mapped_column(String(64))
    event_id: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_status: Mapped[int | None] = mapped_column(Integer)  # the receiver's HTTP status
    last_error: Mapped[str | None] = mapped_column(Text)
    last_duration_s: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None]
