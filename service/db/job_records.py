"""A job's public record: the stored row as ``JobPublic``, and the read of one job by id,
the API's hottest path (``GET /v1/jobs/{id}``, what every client polls).

That read is one Core select of the row by primary key: no ORM session, identity map or
unit of work, each of which costs more than the query. On SQLite the event loop runs it
itself, on a connection of its own, instead of handing each read to a worker thread:
the store is a local file in WAL mode, where a reader never waits for a writer, and a
point read by primary key takes about 0.1 ms of CPU, less than the hop to a thread and
back. The connection is the loop's alone (one thread, one read at a time), so a read
never waits for a pool slot held by request threads that are queued on the write lock.
On a networked database (PostgreSQL) each read waits on a round trip, so it goes to a
worker thread like any other call that waits, on a pool of its own in autocommit with no
ping on checkout (service/db/engine.py's ``point_read_engine``): one round trip a read."""

from __future__ import annotations

from typing import Any

from anyio import to_thread
from sqlalchemy import bindparam, insert, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from api.schemas import FailureCause, JobPublic, JobStatus, JobUsage, RestartInfo
from api.schemas.jobs import phase_seconds
from service.db.models import JobLabelRow, JobRow

_JOBS, _LABELS = JobRow.__table__, JobLabelRow.__table__
# What ``to_public`` reads of a row, and no more: the row holds as many columns again
# (what the monitor, admission and ingest keep), each of which a read would fetch and decode.
PUBLIC = (
    "id name kind status status_reason failure_cause error labels project spec created_at started_at finished_at"
    " attempt ray_job_id latest_metrics queue_position submission_id dropped_events last_dropped_reason restarts"
    " restarts_total borrowed granted_workers cpu_seconds gpu_seconds start_phases"
).split()
BY_ID = select(*(_JOBS.c[name] for name in PUBLIC)).where(_JOBS.c.id == bindparam("job_id"))
PROJECT_BY_ID = select(_JOBS.c.project).where(_JOBS.c.id == bindparam("job_id"))


def to_public(job: Any) -> JobPublic:
    """``job``: a ``JobRow`` or a row of ``BY_ID`` (its ``PUBLIC`` columns, by the same names)."""
    failed = job.status == JobStatus.FAILED.value
    return JobPublic(
        id=job.id,
        name=job.name,
        kind=job.kind,
        status=JobStatus(job.status),
        status_reason=job.status_reason,
        failure_cause=FailureCause(job.failure_cause) if failed and job.failure_cause else None,
        error=job.error if failed else None,
        labels=job.labels or {},
        project=job.project,
        spec=job.spec,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        attempt=job.attempt,
        ray_job_id=job.ray_job_id,
        latest_metrics=job.latest_metrics,
        queue_position=job.queue_position
        if job.status == JobStatus.QUEUED.value and job.submission_id is None
        else None,
        dropped_events=job.dropped_events or 0,
        last_dropped_reason=job.last_dropped_reason,
        restarts=[RestartInfo(**r) for r in (job.restarts or [])],
        restarts_total=max(job.restarts_total or 0, len(job.restarts or [])),
        borrowed=bool(job.borrowed),
        granted_workers=job.granted_workers,
        usage=JobUsage(cpu_seconds=job.cpu_seconds or 0.0, gpu_seconds=job.gpu_seconds or 0.0),
        start_phases=phase_seconds(job.start_phases),
    )


def insert_job(conn: Connection, row: dict[str, Any]) -> JobPublic:
    """Store a new job (``row``: its columns) with its labels, in the caller's transaction;
    the answer is the row as stored, column defaults included (read back, where RETURNING
    would need SQLite 3.35)."""
    conn.execute(insert(_JOBS), row)
    if row["labels"]:
        labels = [
            {"job_id": row["id"], "key": k, "value": v, "created_at": row["created_at"]}
            for k, v in row["labels"].items()
        ]
        conn.execute(insert(_LABELS), labels)  # a child table, so label filters are an indexed lookup
    return to_public(conn.execute(BY_ID, {"job_id": row["id"]}).one())


def read(conn: Connection, job_id: str) -> JobPublic | None:
    row = conn.execute(BY_ID, {"job_id": job_id}).first()
    return None if row is None else to_public(row)


def read_pooled(engine: Engine, job_id: str) -> JobPublic | None:
    """The read from any thread, on a connection of the engine's pool."""
    return _pooled(engine, read, job_id)


def _pooled(engine: Engine, fn, job_id: str):
    try:
        with engine.connect() as conn:
            return fn(conn, job_id)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
    # The connection was dropped by the server (service/db/engine.py's point_read_engine
    # does not ping on checkout): the pool has let go of every connection made before, and
    # a read is safe to make again, once.
    with engine.connect() as conn:
        return fn(conn, job_id)


def _project(conn: Connection, job_id: str) -> str | None:
    return conn.execute(PROJECT_BY_ID, {"job_id": job_id}).scalar()


class LoopReads:
    """Reads by id made from the event loop (``await reads.job(id)``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.on_loop = engine.dialect.name == "sqlite"
        self._conn: Connection | None = None

    async def job(self, job_id: str) -> JobPublic | None:
        return await self._run(read, job_id)

    async def project(self, job_id: str) -> str | None:
        """The job's project (who may see it); None for no such job."""
        return await self._run(_project, job_id)

    async def _run(self, fn, job_id: str):
        if not self.on_loop:
            return await to_thread.run_sync(_pooled, self.engine, fn, job_id)
        if self._conn is None:
            self._conn = self.engine.connect()
        try:
            return fn(self._conn, job_id)
        except BaseException:
            self.close()  # the next read starts on a fresh connection
            raise
        finally:
            if self._conn is not None:
                self._conn.rollback()  # no read snapshot is held between requests

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()
