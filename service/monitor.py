"""The monitor: the server's one background loop. It starts queued jobs on the cluster
when they fit, follows running ones (status and logs) and records how they end.

Everything it knows is re-read from the database and from Ray on every tick, so a
restarted server picks up where the last one stopped: running jobs are reattached,
jobs that ended meanwhile get their true final status, and log events already stored
are not stored twice (the log offset and event keys are in the database).
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone

from sqlalchemy import select

from api.schemas import FailureCause, JobStatus, parse_job_spec
from service import lifecycle
from service.autoscaler import addable
from service.elastic import holds
from service.jobs import JobService, demand, queue_order, spec_env
from service.ray_backend import ClusterUnavailable
from service.store import JobRow, utcnow

log = logging.getLogger("raydock.monitor")

ACTIVE = (JobStatus.STARTING.value, JobStatus.RUNNING.value, JobStatus.CANCELLING.value)
LOG_TAIL_IN_ERROR = 3000


class Monitor:
    def __init__(self, service: JobService):
        self.service = service
        self.sessions = service.sessions
        self.backend = service.backend
        self.interval = service.settings.monitor_interval_s
        self._wake: asyncio.Event | None = None
        self._unreachable_since: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def wake(self) -> None:
        """Called from request threads after a submit: start the job without waiting a tick."""
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def run(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        while True:
            try:
                await asyncio.to_thread(self.tick)
            except Exception:  # noqa: BLE001 - the loop must outlive any one bad tick
                log.exception("monitor tick failed")
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval)
            except TimeoutError:
                pass
            self._wake.clear()

    # ------------------------------------------------------------------ one pass

    def tick(self) -> None:
        with self.sessions() as s:
            active = s.scalars(select(JobRow.id).where(JobRow.status.in_(ACTIVE))).all()
        for job_id in active:
            try:
                self.follow(job_id)
            except ClusterUnavailable as exc:
                self._cluster_unreachable(active, exc)
                return
        self._unreachable_since = None
        self.admit()

    def _cluster_unreachable(self, active: list[str], exc: Exception) -> None:
        """A cluster gone for good fails its jobs (history kept); a blip does not."""
        now = time.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since = now
        log.warning("cannot reach Ray: %s", exc)
        if now - self._unreachable_since < self.service.settings.cluster_lost_after_s:
            return
        with self.sessions.begin() as s:
            for job_id in active:
                job = s.get(JobRow, job_id)
                if job is not None and not JobStatus(job.status).is_terminal():
                    lifecycle.transition(
                        s, job, JobStatus.FAILED, cause=FailureCause.INFRASTRUCTURE,
                        reason=f"the Ray cluster has been unreachable for {self.service.settings.cluster_lost_after_s:g}s",
                        error=str(exc),
                    )  # fmt: skip

    def _missed_scheduling_deadline(self, job: JobRow) -> bool:
        timeout = parse_job_spec(job.spec).scheduling_timeout_s
        if timeout is None or job.queued_at is None or (utcnow() - _aware(job.queued_at)).total_seconds() <= timeout:
            return False
        with self.sessions.begin() as s:
            row = s.get(JobRow, job.id)
            if row is not None and row.status == JobStatus.QUEUED.value:
                lifecycle.transition(
                    s, row, JobStatus.FAILED, cause=FailureCause.NO_RESOURCES,
                    reason=f"no resources within scheduling_timeout_s={timeout:g}",
                    error=f"The cluster could not start the job within {timeout:g}s ({row.status_reason}). "
                    "Lower scaling.num_workers / cpus_per_worker, raise scheduling_timeout_s, or add nodes.",
                )  # fmt: skip
        return True

    def admit(self) -> None:
        """Start queued jobs in queue order (priority, then arrival) while the cluster
        has room; fail those whose scheduling deadline has passed."""
        with self.sessions() as s:
            queued = s.scalars(queue_order(select(JobRow).where(JobRow.status == JobStatus.QUEUED.value))).all()
            held = [parse_job_spec(j.spec) for j in s.scalars(select(JobRow).where(JobRow.status.in_(ACTIVE)))]
        queued = [j for j in queued if not self._missed_scheduling_deadline(j)]
        if not queued:
            return
        try:
            info = self.backend.cluster_info()
        except ClusterUnavailable as exc:
            self._set_reason([j.id for j in queued], f"waiting for the Ray cluster: {exc}")
            return
        # Our own reservations count from submit on; Ray's free count also sees other users.
        # An elastic job holds room to grow to its max (service/elastic.py). What an
        # autoscaler can still add counts as free: a started job's pending demand asks for it.
        holding = [holds(x, demand(x)) for x in held]
        held_cpus, held_gpus = sum(h[0] for h in holding), sum(h[1] for h in holding)
        extra_cpus, extra_gpus = addable(info)
        free_cpus = min(info.cpus_total - held_cpus, info.cpus_free) + extra_cpus
        free_gpus = min(info.gpus_total - held_gpus, info.gpus_free) + extra_gpus
        blocked = 0
        for job in queued:
            cpus, gpus = demand(parse_job_spec(job.spec))
            # Strict queue order: once one job waits, every later one waits behind it.
            if blocked or cpus > free_cpus or gpus > free_gpus:
                ahead = f"; {blocked} job(s) ahead of it in the queue" if blocked else ""
                self._set_reason(
                    [job.id],
                    f"waiting for resources: needs {cpus:g} CPUs / {gpus:g} GPUs, "
                    f"{max(free_cpus, 0):g} / {max(free_gpus, 0):g} free{ahead}",
                )
                blocked += 1
                continue
            self.start(job.id)
            free_cpus, free_gpus = free_cpus - cpus, free_gpus - gpus

    def start(self, job_id: str) -> None:
        with self.sessions.begin() as s:
            job = s.get(JobRow, job_id)
            if job is None or job.status != JobStatus.QUEUED.value:
                return
            job.attempt += 1
            job.log_offset = 0
            submission_id = f"raydock-{job.id}-{job.attempt}"
            job.ray_job_id = submission_id
            env = spec_env(self.service.settings, job)
            spec = parse_job_spec(job.spec)
        try:
            self.backend.submit(submission_id, spec, env)
        except ClusterUnavailable:
            self._undo_start(job_id)
            raise
        except Exception as exc:  # noqa: BLE001 - Ray refused the job: say why, keep the record
            if "No available agent" in str(exc):
                # A head that just started has no job agent yet: the job stays QUEUED
                # and is submitted again on the next tick.
                self._undo_start(job_id)
                return
            with self.sessions.begin() as s:
                job = s.get(JobRow, job_id)
                lifecycle.transition(s, job, JobStatus.FAILED, reason="Ray refused the job", cause=FailureCause.INFRASTRUCTURE, error=f"{type(exc).__name__}: {exc}")
            return
        with self.sessions.begin() as s:
            job = s.get(JobRow, job_id)
            cancelled_meanwhile = job.status != JobStatus.QUEUED.value
            if not cancelled_meanwhile:
                lifecycle.transition(s, job, JobStatus.STARTING, reason="submitted to Ray")
        if cancelled_meanwhile:
            # Cancelled while it was being submitted: the Ray job must not train on.
            self.backend.stop(submission_id)

    def _undo_start(self, job_id: str) -> None:
        with self.sessions.begin() as s:
            job = s.get(JobRow, job_id)
            job.attempt -= 1
            job.ray_job_id = None

    def follow(self, job_id: str) -> None:
        with self.sessions() as s:
            job = s.get(JobRow, job_id)
            submission_id, current = job.ray_job_id, JobStatus(job.status)
        if submission_id is None:
            return
        # Status first, then logs: once Ray says the job ended, the log we read is complete.
        state = self.backend.state(submission_id)
        if state is None:
            with self.sessions.begin() as s:
                job = s.get(JobRow, job_id)
                lifecycle.transition(
                    s, job, JobStatus.FAILED, cause=FailureCause.INFRASTRUCTURE,
                    reason="the Ray cluster has no record of this job (the cluster was restarted or replaced)",
                )  # fmt: skip
            return
        full_log = self.backend.logs(submission_id)
        self.service.ingest_log(job_id, full_log)
        target = lifecycle.from_ray(state.status, current)
        if current == JobStatus.CANCELLING and not target.is_terminal():
            self.backend.stop(submission_id)  # a stop lost to a restart is asked again
            return
        if not target.is_terminal() and self._past_max_runtime(job_id):
            self.backend.stop(submission_id)
            return
        with self.sessions.begin() as s:
            job = s.get(JobRow, job_id)
            if target == JobStatus.FAILED:
                cause = FailureCause(job.failure_cause) if job.failure_cause else FailureCause.INFRASTRUCTURE
                error = job.error or state.message or full_log[-LOG_TAIL_IN_ERROR:]
                reason = {
                    FailureCause.USER_CODE: "the training code raised an error",
                    FailureCause.NO_RESOURCES: "the cluster could not provide the resources",
                    FailureCause.INFRASTRUCTURE: (state.message or "the job driver failed").splitlines()[0],
                }[cause]
                lifecycle.transition(s, job, target, reason=reason, cause=cause, error=error)
            elif target == JobStatus.CANCELLED and job.failure_cause == FailureCause.TIMEOUT.value:
                lifecycle.transition(s, job, JobStatus.FAILED, reason="exceeded max_runtime_s", cause=FailureCause.TIMEOUT, error=job.error)
            elif target == JobStatus.CANCELLED:
                lifecycle.transition(s, job, target, reason="cancelled")
            elif target == JobStatus.SUCCEEDED:
                lifecycle.transition(s, job, target, reason="training finished")
            elif target != current and not (current == JobStatus.RUNNING and target == JobStatus.STARTING):
                lifecycle.transition(s, job, target, reason="driver running" if target == JobStatus.RUNNING else None)

    def _past_max_runtime(self, job_id: str) -> bool:
        with self.sessions.begin() as s:
            job = s.get(JobRow, job_id)
            limit = parse_job_spec(job.spec).max_runtime_s
            if limit is None or job.started_at is None or (utcnow() - _aware(job.started_at)).total_seconds() <= limit:
                return False
            # Recorded before the stop, so the STOPPED that follows reads as a timeout.
            job.failure_cause = FailureCause.TIMEOUT.value
            job.error = f"The job ran longer than max_runtime_s={limit:g} and was stopped. Raise max_runtime_s if it needs longer."
            lifecycle.transition(s, job, JobStatus.CANCELLING, reason="stopping: exceeded max_runtime_s")
        return True

    def _set_reason(self, job_ids: list[str], reason: str) -> None:
        with self.sessions.begin() as s:
            for job_id in job_ids:
                job = s.get(JobRow, job_id)
                if job is not None and job.status == JobStatus.QUEUED.value:
                    job.status_reason = reason


def _aware(t: datetime) -> datetime:
    """SQLite returns naive datetimes for what was stored as UTC."""
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
