"""Reading jobs: one job, the list, and what a job left behind (its reports, log and
checkpoints). A part of its own, built by the composition root (``service/runtime.py``):
the routes read through it, and the job commands (``service/jobs.py``) answer with it."""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from api.errors import NotFound, job_not_found
from api.schemas import CheckpointPublic, JobList, JobPublic, JobStatus, MetricPoint
from service.db import job_records, listing
from service.db.event_models import CheckpointRow
from service.db.job_records import to_public
from service.db.models import JobRow
from service.events import logs
from service.events.reads import series
from service.files import archive, storage
from service.files.checkpoints import complete as checkpoint_complete
from service.settings import Settings


def job_row(s: Session, job_id: str) -> JobRow:
    """The job's row in this transaction; 404 ``job_not_found`` for no such job."""
    job = s.get(JobRow, job_id)
    if job is None:
        job_missing(job_id)
    return job


def job_missing(job_id: str):
    raise job_not_found(job_id)


class JobReads:
    """``loop``: the point reads the event loop makes (a job, its project) on a connection of their own."""

    def __init__(self, settings: Settings, sessions: sessionmaker, loop: job_records.LoopReads):
        self.settings = settings
        self.sessions = sessions
        self.loop = loop

    def prefix(self, job_id: str) -> str:
        """The job's own storage prefix: everything it may write and we may read for it."""
        return storage.job_prefix(self.settings.storage.resolved_storage_path, job_id)

    def get(self, job_id: str) -> JobPublic:
        job = job_records.read_pooled(self.loop.engine, job_id)  # the queue position is stored by the monitor
        return job if job is not None else job_missing(job_id)

    async def read(self, job_id: str) -> JobPublic:
        """``get`` for the event loop (``service/db/job_records.py``)."""
        job = await self.loop.job(job_id)
        return job if job is not None else job_missing(job_id)

    def list(
        self,
        *,
        status: JobStatus | None,
        labels: dict[str, str],
        limit: int,
        offset: int = 0,
        cursor: str | None = None,
        projects: list[str] | None = None,
    ) -> JobList:
        """Newest first; ``cursor`` (a page's ``next``) continues after that page; only
        jobs of ``projects`` (None: every project)."""
        with self.sessions() as s:
            rows, total, after = listing.page(
                s, status=status, labels=labels, limit=limit, offset=offset, cursor=cursor, projects=projects
            )
            return JobList(items=[to_public(r) for r in rows], total=total, limit=limit, offset=offset, next=after)

    def metrics(self, job_id: str, since: int = -1, limit: int = series.PAGE_DEFAULT) -> tuple[list[MetricPoint], bool]:
        """A page of reports with seq > since, and whether more follow (``service/events/reads/series.py``)."""
        with self.sessions() as s:
            job_row(s, job_id)
            return series.page(s, job_id, since, limit)

    def metrics_downsampled(
        self, job_id: str, since: int, max_points: int, until: int | None = None
    ) -> list[MetricPoint]:
        with self.sessions() as s:
            job_row(s, job_id)
            return series.downsample(s, job_id, since, max_points, until)

    def logs(self, job_id: str, offset: int = 0) -> tuple[str, int]:
        """Stored log text from character ``offset`` on (a few MiB at most) and the offset
        after it (``service/events/logs.py``)."""
        with self.sessions() as s:
            job_row(s, job_id)
            return logs.read(s, job_id, offset)

    def log_stream(self, job_id: str, offset: int = 0) -> Iterator[str]:
        """All stored log text from ``offset`` on, piece by piece."""
        self.get(job_id)
        return logs.stream(self.sessions, job_id, offset)

    def project_of(self, job_id: str) -> str | None:
        """The job's project; None for no such job."""
        with self.sessions() as s:
            return s.scalar(select(JobRow.project).where(JobRow.id == job_id))

    def checkpoints(self, job_id: str) -> list[CheckpointPublic]:
        with self.sessions() as s:
            job_row(s, job_id)
            rows = s.scalars(
                select(CheckpointRow).where(CheckpointRow.job_id == job_id).order_by(CheckpointRow.id)
            ).all()
        # Ray Train deletes checkpoints beyond `checkpoint.keep`; list only those still stored
        # (and, checked again, only inside the job's own prefix), and complete: a built-in
        # loop's folder with no manifest (or not the files it names) is a half-written one.
        prefix = self.prefix(job_id)
        owned = [r for r in rows if storage.owned(r.path, prefix)]
        stored = storage.existing([r.path for r in owned])  # one listing per folder on an object store
        return [
            CheckpointPublic(
                id=r.id, path=r.path, step=r.step, epoch=r.epoch, metrics=r.values, created_at=r.created_at
            )
            for r in owned
            if r.path in stored and checkpoint_complete(r.path, prefix)  # the stored ones only: few
        ]

    def checkpoint_archive(self, job_id: str, checkpoint_id: int) -> tuple[str, Iterator[bytes]]:
        with self.sessions() as s:
            job_row(s, job_id)
            row = s.get(CheckpointRow, checkpoint_id)
        prefix = self.prefix(job_id)
        if row is None or row.job_id != job_id or not storage.owned(row.path, prefix):
            raise NotFound(
                f"Job {job_id} has no checkpoint {checkpoint_id}. List them with GET /v1/jobs/{job_id}/checkpoints."
            )
        if not storage.exists(row.path):
            raise NotFound(f"Checkpoint {checkpoint_id} of job {job_id} was removed by retention (checkpoint.keep).")
        if not checkpoint_complete(row.path, prefix):
            raise NotFound(f"Checkpoint {checkpoint_id} of job {job_id} is not complete (its upload never finished).")
        try:
            pieces = archive.checkpoint_tar(row.path, prefix)
        except OSError:  # swapped for a link or a file since it was listed
            raise NotFound(
                f"Checkpoint {checkpoint_id} of job {job_id} is no longer a directory inside the job's storage."
            ) from None
        return f"{job_id}-checkpoint-{checkpoint_id}.tar.gz", pieces
