"""Pipelines (service/pipelines/): one row per pipeline, holding its name, project, owner
and its steps in order as ``[{name, job_id}]``. Every step is an ordinary job row
(``jobs.pipeline_id`` names its pipeline), stored with the pipeline in one transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db.models import Base, utcnow


class PipelineRow(Base):
    __tablename__ = "pipelines"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    project: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str] = mapped_column(String(128))
    owner_id: Mapped[int | None] = mapped_column(Integer)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    steps: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # [{name, job_id}] in the order submitted
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_pipelines_project_created", "project", "created_at"),)
