"""The tenancy tables: each project's quota (``project_quotas``), its decayed recent
usage (``project_usage``: a value and the time it was last brought up to date, decayed
on read), each attempt's accounted usage (``job_usage``), and usage accounted but not
yet added to the project's decayed figure (``usage_pending``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db.models import Base

BIG_ID = BigInteger().with_variant(Integer(), "sqlite")


class ProjectQuotaRow(Base):
    __tablename__ = "project_quotas"

    project: Mapped[str] = mapped_column(String(64), primary_key=True)
    guaranteed_cpus: Mapped[float | None] = mapped_column(Float)
    guaranteed_gpus: Mapped[float | None] = mapped_column(Float)
    max_cpus: Mapped[float | None] = mapped_column(Float)
    max_gpus: Mapped[float | None] = mapped_column(Float)
    max_running: Mapped[int | None] = mapped_column(Integer)
    max_queued: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime]


class ProjectUsageRow(Base):
    __tablename__ = "project_usage"

    project: Mapped[str] = mapped_column(String(64), primary_key=True)
    cpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)  # decayed, as of `as_of`
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    as_of: Mapped[datetime]


class JobUsageRow(Base):
    """One attempt's usage: CPUs and GPUs held, from when it ran to how far it is counted."""

    __tablename__ = "job_usage"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    project: Mapped[str] = mapped_column(String(64))
    cpus: Mapped[float] = mapped_column(Float)
    gpus: Mapped[float] = mapped_column(Float)
    started_at: Mapped[datetime]
    until: Mapped[datetime]
    cpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)

    __table_args__ = (Index("ix_job_usage_until", "until"), Index("ix_job_usage_project_until", "project", "until"))


class UsagePendingRow(Base):
    __tablename__ = "usage_pending"

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    project: Mapped[str] = mapped_column(String(64))
    cpu_seconds: Mapped[float] = mapped_column(Float)
    gpu_seconds: Mapped[float] = mapped_column(Float)
