"""History retention: finished jobs older than ``RAYDOCK_RETENTION_DAYS``, or beyond the
newest ``RAYDOCK_RETENTION_MAX_FINISHED``, are deleted with every row they own (status
history, metrics, logs, checkpoints, trials: ON DELETE CASCADE) and their storage prefix.

It runs in the background (``run``), a small batch per transaction with a pause between
batches, so requests and the monitor never wait on it for long; ``raydock gc`` runs the
same sweep by hand, or only lists what it would delete (``--dry-run``). A job that is not
finished is never deleted: the DELETE itself says ``status IN (finished)``, so a job
resumed after it was picked stays, and only the prefixes of rows really deleted go.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, tuple_
from sqlalchemy.orm import sessionmaker

from api.schemas import JobStatus
from service import storage
from service.settings import Settings
from service.store import JobRow, aware, utcnow

log = logging.getLogger("raydock.retention")

FINISHED = (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value)
BATCH = 200
PAUSE_S = 0.05  # between batches: other writers get the database


@dataclass(frozen=True)
class Policy:
    days: float | None = None  # finished longer ago than this
    max_finished: int | None = None  # keep at most this many finished jobs, the newest

    @classmethod
    def from_settings(cls, settings: Settings) -> "Policy":
        return cls(settings.retention_days, settings.retention_max_finished)

    @property
    def is_set(self) -> bool:
        return self.days is not None or self.max_finished is not None

    def __str__(self) -> str:
        parts = []
        if self.days is not None:
            parts.append(f"finished more than {self.days:g} days ago")
        if self.max_finished is not None:
            parts.append(f"beyond the newest {self.max_finished} finished")
        return " or ".join(parts) or "none"


@dataclass(frozen=True)
class Doomed:
    id: str
    name: str
    status: str
    finished_at: datetime


class Retention:
    def __init__(self, sessions: sessionmaker, storage_path: str, policy: Policy, interval_s: float = 60.0):
        self.sessions, self.storage_path, self.policy, self.interval_s = sessions, storage_path, policy, interval_s

    def _condition(self, s, now: datetime):
        """SQL for "this finished job is past the policy", or None when nothing is."""
        past = []
        if self.policy.days is not None:
            past.append(JobRow.finished_at < now - timedelta(days=self.policy.days))
        if self.policy.max_finished is not None:
            # The newest job beyond the count; it and every older one go.
            newest_first = select(JobRow.finished_at, JobRow.id).where(JobRow.status.in_(FINISHED), JobRow.finished_at.is_not(None))
            edge = s.execute(
                newest_first.order_by(JobRow.finished_at.desc(), JobRow.id.desc()).offset(self.policy.max_finished).limit(1)
            ).first()
            if edge is not None:
                past.append(tuple_(JobRow.finished_at, JobRow.id) <= tuple_(edge.finished_at, edge.id))
        if not past:
            return None
        cond = past[0]
        for more in past[1:]:
            cond = cond | more
        return JobRow.status.in_(FINISHED) & JobRow.finished_at.is_not(None) & cond

    def due(self, limit: int = BATCH, now: datetime | None = None) -> tuple[list[Doomed], int]:
        """The oldest ``limit`` jobs the policy deletes, and how many it deletes in all."""
        with self.sessions() as s:
            cond = self._condition(s, now or utcnow())
            if cond is None:
                return [], 0
            q = select(JobRow.id, JobRow.name, JobRow.status, JobRow.finished_at).where(cond)
            rows = s.execute(q.order_by(JobRow.finished_at, JobRow.id).limit(limit)).all()
            total = int(s.scalar(select(func.count()).select_from(JobRow).where(cond)) or 0)
        return [Doomed(r.id, r.name, r.status, aware(r.finished_at)) for r in rows], total

    def delete_batch(self, job_ids: list[str]) -> list[str]:
        """Delete these jobs if they are still finished, then their storage; returns the
        ids deleted. The rows go first: a crash in between leaves files, never a row
        without its files."""
        if not job_ids:
            return []
        with self.sessions.begin() as s:
            gone = list(s.scalars(delete(JobRow).where(JobRow.id.in_(job_ids), JobRow.status.in_(FINISHED)).returning(JobRow.id)))
        for job_id in gone:
            try:
                storage.delete_tree(storage.job_prefix(self.storage_path, job_id))
            except OSError as exc:
                log.warning("job %s deleted; its storage could not be removed: %s", job_id, exc)
        return gone

    def sweep(self, max_batches: int | None = None) -> int:
        """Delete everything the policy names, a batch at a time; returns how many jobs."""
        deleted, batches = 0, 0
        while max_batches is None or batches < max_batches:
            doomed, _ = self.due()
            if not doomed:
                break
            gone = self.delete_batch([d.id for d in doomed])
            if not gone:
                break  # all resumed meanwhile: the next sweep looks again
            deleted, batches = deleted + len(gone), batches + 1
            time.sleep(PAUSE_S)
        if deleted:
            log.info("retention (%s): deleted %d finished jobs", self.policy, deleted)
        return deleted

    async def run(self) -> None:
        """The background loop: a sweep every ``interval_s``."""
        while True:
            try:
                await asyncio.to_thread(self.sweep)
            except Exception:  # noqa: BLE001 - retention must never stop the server
                log.exception("retention sweep failed")
            await asyncio.sleep(self.interval_s)
