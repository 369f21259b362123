"""The tables of identity and tenancy: users, their API tokens (only a token's sha256 is
stored), projects, memberships (a role per user and project) and the code packages each
project holds (``code_refs``: the same bytes uploaded by two projects are two references);
each project's quota (``project_quotas``), its decayed recent usage (``project_usage``: a
value and the time it was last brought up to date, decayed on read), each attempt's
accounted usage (``job_usage``), and usage accounted but not yet added to the project's
decayed figure (``usage_pending``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, false
from sqlalchemy.orm import Mapped, mapped_column

from service.db.models import Base, utcnow

BIG_ID = BigInteger().with_variant(Integer(), "sqlite")


class UserRow(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())  # server admin
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiTokenRow(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex; the token itself is never stored
    name: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]


class ProjectRow(Base):
    __tablename__ = "projects"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class MembershipRow(Base):
    __tablename__ = "memberships"

    project: Mapped[str] = mapped_column(ForeignKey("projects.name", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True)
    role: Mapped[str] = mapped_column(String(16))  # admin | member | viewer
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class CodeRefRow(Base):
    """A project's hold on a code package: what it may see and run. The package's bytes
    and their retention stay in ``code_packages``."""

    __tablename__ = "code_refs"

    project: Mapped[str] = mapped_column(String(64), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)  # the project's first upload of it
    # The project's last upload or submit of it: its hold lapses RAYDOCK_CODE_RETENTION_S after, unless a job of it runs the package.
    last_used_at: Mapped[datetime | None] = mapped_column(default=utcnow)


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
