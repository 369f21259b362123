"""A job's worker groups read back: its worker count and placement over time.

A job's driver sends a ``worker_group`` event each time Ray Train starts its workers
(the first start, every resize of an elastic job, every restart after a failure); its
writer (``service/events/writers/job_events.py``) stores each once and ``worker_groups`` reads
them back as the job's worker count and placement over time. What an elastic job holds on the cluster is
admission's (``service.scheduling.admission.holds``).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from api.errors import job_not_found
from api.schemas import WorkerGroupPublic, WorkerPlacement
from service.db.event_models import WorkerGroupRow
from service.db.models import JobRow


def worker_groups(sessions: sessionmaker, job_id: str) -> list[WorkerGroupPublic]:
    with sessions() as s:
        if s.get(JobRow, job_id) is None:
            raise job_not_found(job_id)
        rows = s.scalars(
            select(WorkerGroupRow).where(WorkerGroupRow.job_id == job_id).order_by(WorkerGroupRow.seq)
        ).all()
        return [
            WorkerGroupPublic(
                seq=r.seq,
                attempt=r.attempt,
                ts=r.ts,
                world_size=r.world_size,
                nodes=[WorkerPlacement(**n) for n in r.nodes or []],
                trial_id=r.trial_id,
            )
            for r in rows
        ]
