"""Schedules (service/schedules/): one row per schedule, holding its cron, its time zone,
its policies, the job spec each firing submits, and what its latest tick did. A firing
moves ``last_tick`` forward in the same transaction that records its job, so a tick is
fired once whatever restarts or replicas (``service/schedules/firing.py``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Index, Integer, String, Text, false
from sqlalchemy.orm import Mapped, mapped_column

from service.db.models import Base, utcnow


class ScheduleRow(Base):
    __tablename__ = "schedules"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    project: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str] = mapped_column(String(128))  # the user's name: the firing's actor
    owner_id: Mapped[int | None] = mapped_column(Integer)  # NULL: the server admin of RAYDOCK_API_TOKEN
    cron: Mapped[str] = mapped_column(String(120))
    timezone: Mapped[str] = mapped_column(String(64))
    concurrency: Mapped[str] = mapped_column(String(16))
    catch_up: Mapped[str] = mapped_column(String(16))
    paused: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    job: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Ticks up to here are handled (fired or skipped); None: none yet (the first is after created_at).
    last_tick: Mapped[datetime | None]
    # The next tick after last_tick (or created_at): what the firing unit reads to find due schedules.
    next_tick: Mapped[datetime | None]
    last_job_id: Mapped[str | None] = mapped_column(String(32))
    last_outcome: Mapped[str | None] = mapped_column(Text)
    fired: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    __table_args__ = (
        Index("ix_schedules_project", "project"),
        Index("ix_schedules_due", "paused", "next_tick"),
    )
