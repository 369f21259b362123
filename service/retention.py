"""History retention: finished jobs older than ``RAYDOCK_RETENTION_DAYS``, or beyond the
newest ``RAYDOCK_RETENTION_MAX_FINISHED``, are deleted with every row they own (status
history, metrics, logs, checkpoints, trials: ON DELETE CASCADE) and their storage prefix.

It runs in the background (``sweep``, a unit wired in service/runtime.py), a small batch per transaction with a pause between
batches, so requests and the monitor never wait on it for long; ``raydock gc`` runs the
same sweep by hand, or only lists what it would delete (``--dry-run``). A job that is not
finished is never deleted: the DELETE itself says ``status IN (finished)``, so a job
resumed after it was picked stays, and only the prefixes of rows really deleted go.

Ray keeps a record of every Ray job (one per attempt) until it is deleted. After the rows,
each sweep deletes the records of this store's Ray jobs (their ``raydock_store`` metadata)
whose raydock job is no longer in the store: those of the jobs just deleted, of any
attempt, and any left by an earlier sweep or a ``DELETE /v1/jobs/{id}`` while the cluster
did not answer. A cluster that does not answer never holds up the rows: its records wait
for the next sweep, and the outage is logged once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select, tuple_
from sqlalchemy.orm import sessionmaker

from api.errors import ClusterUnavailable
from api.schemas import JobStatus
from service.cluster.ray_backend import RayBackend
from service.db import purge
from service.db.leases import Fence
from service.db.models import JobRow, aware, store_id, utcnow
from service.eventlog import log as eventlog
from service.eventlog.log import record
from service.files import storage
from service.settings import Settings

log = logging.getLogger("raydock.retention")

FINISHED = (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value)
BATCH = 200
PAUSE_S = 0.05  # between batches: other writers get the database
RAY_DELETES = 1000  # Ray job records deleted per sweep at most (one call each); the rest next sweep


@dataclass(frozen=True)
class Policy:
    days: float | None = None  # finished longer ago than this
    max_finished: int | None = None  # keep at most this many finished jobs, the newest

    @classmethod
    def from_settings(cls, settings: Settings) -> "Policy":
        return cls(settings.retention.retention_days, settings.retention.retention_max_finished)

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


@dataclass(frozen=True)
class RayRecords:
    """What a sweep did with the Ray records of jobs gone from the store."""

    deleted: int = 0
    left: int = 0  # still there: past RAY_DELETES, or Ray would not delete them yet
    unreachable: bool = False  # the cluster did not answer: none were looked at


class Retention:
    def __init__(
        self,
        sessions: sessionmaker,
        storage_path: str,
        policy: Policy,
        interval_s: float = 60.0,
        ray: RayBackend | None = None,
        event_log_days: float | None = None,
    ):
        self.sessions, self.storage_path, self.policy, self.interval_s = sessions, storage_path, policy, interval_s
        self.ray = ray  # None: Ray's records are left to a sweep that has the cluster
        self.ray_records = RayRecords()  # the last sweep's
        self._ray_down = False
        self._store: str | None = None
        self.event_log_days = event_log_days  # None: the event log is not trimmed by this sweep

    def _condition(self, s, now: datetime):
        """SQL for "this finished job is past the policy", or None when nothing is."""
        past = []
        if self.policy.days is not None:
            past.append(JobRow.finished_at < now - timedelta(days=self.policy.days))
        if self.policy.max_finished is not None:
            # The newest job beyond the count; it and every older one go.
            newest_first = select(JobRow.finished_at, JobRow.id).where(
                JobRow.status.in_(FINISHED), JobRow.finished_at.is_not(None)
            )
            edge = s.execute(
                newest_first.order_by(JobRow.finished_at.desc(), JobRow.id.desc())
                .offset(self.policy.max_finished)
                .limit(1)
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

    def delete_batch(self, job_ids: list[str], fence: Fence | None = None) -> list[str]:
        """Delete these jobs if they are still finished, then their storage; returns the
        ids deleted. The rows go first: a crash in between leaves files, never a row
        without its files. With ``fence`` (the retention unit's lease), they are marked
        only while it is held."""
        if not job_ids:
            return []
        # Marked while still finished (a resume then refuses them), and deleted a chunk of
        # rows per transaction: a job with a million reports never holds the write lock long.
        gone = purge.delete_jobs(self.sessions, purge.mark(self.sessions, job_ids, FINISHED, fence))
        for job_id in gone:
            try:
                storage.remove(storage.job_prefix(self.storage_path, job_id))
            except OSError as exc:
                log.warning("job %s deleted; its storage could not be removed: %s", job_id, exc)
        return gone

    def sweep(self, max_batches: int | None = None, fence: Fence | None = None) -> int:
        """Delete everything the policy names, a batch at a time; returns how many jobs.
        With ``fence``, a replica that lost the unit's lease while paused deletes nothing
        more (LeaseLost)."""
        deleted, batches = 0, 0
        while self.policy.is_set and (max_batches is None or batches < max_batches):
            doomed, _ = self.due()
            if not doomed:
                break
            gone = self.delete_batch([d.id for d in doomed], fence)
            if not gone:
                break  # all resumed meanwhile: the next sweep looks again
            deleted, batches = deleted + len(gone), batches + 1
            time.sleep(PAUSE_S)
        if deleted:
            log.info("retention (%s): deleted %d finished jobs", self.policy, deleted)
        trimmed = self.trim_event_log(fence)
        if deleted or trimmed:
            with self.sessions.begin() as s:
                record(s, "retention_sweep", jobs_deleted=deleted, events_deleted=trimmed, policy=str(self.policy))
        if self.ray is not None and self.policy.is_set:
            self.ray_records = self.forget_ray_jobs()
        return deleted

    def trim_event_log(self, fence: Fence | None = None) -> int:
        """Delete event-log rows (and webhook deliveries) past their retention, a batch per transaction."""
        if self.event_log_days is None:
            return 0
        trimmed = 0
        while True:
            with self.sessions.begin() as s:
                if fence is not None:
                    fence.hold(s)
                n = eventlog.trim(s, self.event_log_days)
            trimmed += n
            if n < eventlog.TRIM_BATCH:
                return trimmed
            time.sleep(PAUSE_S)

    def forget_ray_jobs(self) -> RayRecords:
        """Delete Ray's records of this store's ended Ray jobs whose raydock job is gone."""
        try:
            ours = [
                j
                for j in self.ray.list_jobs()
                if j.metadata.get("raydock_store") == self._store_id() and not j.is_active
            ]
            kept: set[str] = set()
            ids = sorted({j.metadata.get("raydock_job", "") for j in ours})
            with self.sessions() as s:
                for i in range(0, len(ids), 500):
                    kept.update(s.scalars(select(JobRow.id).where(JobRow.id.in_(ids[i : i + 500]))))
            orphans = [j.submission_id for j in ours if j.metadata.get("raydock_job", "") not in kept]
            deleted = sum(self.ray.delete(sid) for sid in orphans[:RAY_DELETES])
        except ClusterUnavailable as exc:
            if not self._ray_down:
                log.warning("retention: Ray's records of deleted jobs stay until the cluster answers: %s", exc)
            self._ray_down = True
            return RayRecords(unreachable=True)
        if self._ray_down:
            log.info("retention: the cluster answers again; deleting Ray's records of deleted jobs")
        self._ray_down = False
        if deleted:
            log.info("retention: deleted Ray's records of %d Ray jobs of deleted jobs", deleted)
        return RayRecords(deleted=deleted, left=len(orphans) - deleted)

    def _store_id(self) -> str:
        if self._store is None:
            self._store = store_id(self.sessions)
        return self._store
