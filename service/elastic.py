"""Worker groups of a job in the store, and what an elastic job holds on the cluster.

A job's driver sends a ``worker_group`` event each time Ray Train starts its workers
(``trainers/elastic.py``): the first start, every resize of an elastic job, every restart
after a failure. ``apply_event`` stores each once, keyed like metrics by (attempt, seq);
``worker_groups`` reads them back as the job's worker count and placement over time.
Rows go with their job (ON DELETE CASCADE).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, UniqueConstraint, func, select
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker

from api.schemas import WorkerGroupPublic, WorkerPlacement
from api.errors import NotFound
from api.schemas import JobSpec
from service.store import Base, JobRow


class WorkerGroupRow(Base):
    __tablename__ = "worker_groups"
    __table_args__ = (UniqueConstraint("job_id", "attempt", "src_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    src_seq: Mapped[int] = mapped_column(Integer)  # the sequence number the controller gave it
    seq: Mapped[int] = mapped_column(Integer)  # gap-free position within the job
    ts: Mapped[float] = mapped_column(Float)
    world_size: Mapped[int] = mapped_column(Integer)
    nodes: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)


def apply_event(s: Session, job: JobRow, event: dict[str, Any]) -> bool:
    """Store a ``worker_group`` event once; False for any other event."""
    if event.get("type") != "worker_group":
        return False
    src_seq = int(event.get("seq", 0))
    key = (WorkerGroupRow.job_id == job.id, WorkerGroupRow.attempt == job.attempt, WorkerGroupRow.src_seq == src_seq)
    if s.scalar(select(func.count()).select_from(WorkerGroupRow).where(*key)):
        return True
    seq = s.scalar(select(func.count()).select_from(WorkerGroupRow).where(WorkerGroupRow.job_id == job.id))
    nodes = [{"ip": str(n.get("ip", "")), "node_id": str(n.get("node_id", ""))} for n in event.get("nodes") or []]
    s.add(
        WorkerGroupRow(
            job_id=job.id, attempt=job.attempt, src_seq=src_seq, seq=seq, ts=float(event.get("ts", 0.0)),
            world_size=int(event.get("world_size", len(nodes))), nodes=nodes,
        )
    )  # fmt: skip
    s.flush()  # a later event of the same batch must see this row
    return True


def worker_groups(sessions: sessionmaker, job_id: str) -> list[WorkerGroupPublic]:
    with sessions() as s:
        if s.get(JobRow, job_id) is None:
            raise NotFound(f"No job {job_id!r}. List jobs with GET /v1/jobs.", code="job_not_found")
        rows = s.scalars(select(WorkerGroupRow).where(WorkerGroupRow.job_id == job_id).order_by(WorkerGroupRow.seq)).all()
        return [
            WorkerGroupPublic(
                seq=r.seq, attempt=r.attempt, ts=r.ts, world_size=r.world_size,
                nodes=[WorkerPlacement(**n) for n in r.nodes or []],
            )  # fmt: skip
            for r in rows
        ]


def holds(spec: JobSpec, demand: tuple[float, float]) -> tuple[float, float]:
    """(CPUs, GPUs) a started job may take on the cluster, given its ``demand``: an
    elastic job grows to max whenever the cluster has that much (Ray Train sizes it from
    the cluster's total resources, not from what other jobs leave free), so admission
    keeps that room for it."""
    scaling = getattr(spec, "scaling", None)
    if scaling is None or not scaling.is_elastic:
        return demand
    return scaling.max_workers * scaling.cpus_per_worker, float(scaling.max_workers if scaling.use_gpu else 0)


def graceful_stop_env(kind: str) -> dict[str, str]:
    """How Ray stops a training job's driver: with SIGINT, which Ray Train answers by
    aborting the run cleanly. Ray's default, SIGTERM, kills the Train controller before
    it withdraws its share of the cluster from Ray Train's resource coordinator, and
    elastic jobs then cannot grow into the freed CPUs until that share expires (180 s)."""
    if kind != "train":
        return {}
    # Read by Ray's job supervisor, which runs with the job's environment.
    return {"RAY_JOB_STOP_SIGNAL": "SIGINT", "RAY_JOB_STOP_WAIT_TIME_S": "15"}
