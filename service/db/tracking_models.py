"""Where each tracked job's export stands (``service/tracking/``): the reports already
exported (a cursor per job, so a restarted server resumes where it stopped and a slow
tracker never holds up ingestion), the MLflow runs it made, and whether its end is written."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, ForeignKey, Integer, String, Text, false
from sqlalchemy.orm import Mapped, mapped_column

from service.db.models import Base, utcnow


class TrackingExportRow(Base):
    __tablename__ = "tracking_exports"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    tensorboard: Mapped[bool] = mapped_column(Boolean, default=False)
    mlflow_experiment: Mapped[str | None] = mapped_column(String(200))
    # Each tool's cursor, so one that fails is retried alone: the next ``metrics.seq`` to
    # export and the last ``trial_metrics.id`` exported.
    tensorboard_seq: Mapped[int] = mapped_column(Integer, default=0)
    tensorboard_trial_id: Mapped[int] = mapped_column(BigInteger, default=0)
    mlflow_seq: Mapped[int] = mapped_column(Integer, default=0)
    mlflow_trial_id: Mapped[int] = mapped_column(BigInteger, default=0)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    trial_runs: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # trial id -> its nested MLflow run
    # The attempt whose end was exported (0: none); a resumed job is exported again from its cursor.
    finished_attempt: Mapped[int] = mapped_column(Integer, default=0)
    done: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false(), index=True)
    error: Mapped[str | None] = mapped_column(Text)  # the last export failure, retried next pass
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
