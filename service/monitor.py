"""The monitor: the steps of the server's job-following background units (wired as
periodic units in service/runtime.py, run by service/background/). Each tick follows the
active jobs (status and logs), now and then reconciles Ray's jobs with ours, and has the
queue keeper (service/scheduling/queue_keeper.py) apply admission's plan and start what it admits;
``account`` counts the running attempts' usage on a cadence of its own.

Everything it knows is re-read from the database and from Ray on every tick, so a
restarted server picks up where the last one stopped: running jobs are reattached,
jobs that ended meanwhile get their true final status, and log events already stored
are not stored twice (the log offset and event keys are in the database).

Jobs are isolated from each other: each job's follow runs in its own try, and a job
whose follow fails ``FOLLOW_FAILURES`` times in a row fails INFRASTRUCTURE while the
rest go on. Submits (which upload code) run off the tick, on a small pool.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from api.errors import ClusterUnavailable
from api.schemas import FailureCause, JobStatus
from service import lifecycle
from service.attempts import ACTIVE, Attempts
from service.cluster.ray_backend import RayBackend
from service.db.leases import Fence, LeaseLost
from service.db.models import JobRow, aware, utcnow
from service.events import logs
from service.events.log_tails import LogTails
from service.pipelines.release import Release
from service.scheduling.preemption import Preemptions
from service.scheduling.queue_keeper import QueueKeeper
from service.settings import Settings
from service.tenancy import usage

log = logging.getLogger("raydock.monitor")

LOG_TAIL_IN_ERROR = 3000
FOLLOW_FAILURES = 5  # consecutive failed follows of one job before it fails INFRASTRUCTURE
# Reconciliation stays inside the tick (not a unit of its own): it runs every tick while
# the cluster is out, and before admission in the same pass.
RECONCILE_EVERY_S = 5.0
ACCOUNT_EVERY_S = 2.0  # running attempts' usage is counted this often (an attempt's end at once)
# A lone submit is started at once (it wakes a waiting monitor); a burst is taken in
# batches, at most one tick per gap: each tick reads the queue's head (~10 ms with 10k
# queued), which at 20 a second was a fifth of the API's CPU during a burst of submits.
MIN_TICK_GAP_S = 0.25


class Outage:
    """Logs an outage of the cluster once: its first sign as a warning, the rest while it
    lasts at debug level (every tick meets it), and its end."""

    def __init__(self) -> None:
        self.since: float | None = None

    def failed(self, what: str, exc: Exception) -> None:
        if self.since is None:
            self.since = time.monotonic()
            log.warning("%s: %s (said once until the cluster answers again)", what, exc)
        else:
            log.debug("%s: %s", what, exc)

    def answered(self) -> None:
        if self.since is not None:
            log.warning("the Ray cluster answers again, after %.0f s", time.monotonic() - self.since)
            self.since = None


class Monitor:
    """Its collaborators come by name from the composition root (service/runtime.py): the
    attempts it starts and reconciles, the queue keeper whose decisions it carries out, the
    preemptions it makes and the log tails it reads."""

    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker,
        backend: RayBackend,
        *,
        attempts: Attempts,
        queue: QueueKeeper,
        preemptions: Preemptions,
        tails: LogTails,
        release: Release | None = None,
    ):
        self.settings = settings
        self.sessions = sessions
        self.backend = backend
        self.attempts = attempts
        # Wakes the tick's unit (service/runtime.py points it there): a submit starts at once.
        self.wake: Callable[[], None] = lambda: None
        self._reconciled_at = float("-inf")
        self._follow_failures: dict[str, int] = {}
        self.tails = tails
        self._submitting: set[str] = set()
        self._submit_lock = threading.Lock()
        # The tick and the usage count are units of their own but never run at once: an
        # attempt's end is counted by the same follow that moves it, as when they were one loop.
        self._passes = threading.Lock()
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="raydock-submit")
        self.queue = queue
        self.preemptions = preemptions
        self.release = release  # queues (or stops) the jobs waiting for others: service/pipelines/
        self._outage = Outage()

    # ------------------------------------------------------------------ one pass

    def tick(self, fence: Fence | None = None) -> None:
        """One pass; ``fence``: the monitor's lease this pass runs under (service/db/leases.py),
        which the attempts it starts prove in the transactions that admit and start them."""
        with self._passes:
            try:
                self._tick(fence)
            except LeaseLost as exc:  # paused past its lease: the new holder's pass does this one's work
                log.warning("this replica no longer runs the monitor: %s", exc)

    def _tick(self, fence: Fence | None) -> None:
        with self.sessions() as s:
            active = s.scalars(select(JobRow.id).where(JobRow.status.in_(ACTIVE))).all()
        for job_id in active:
            try:
                self.follow(job_id)
            except ClusterUnavailable as exc:
                self._cluster_unreachable(active, exc)
                return
            except Exception as exc:  # noqa: BLE001 - one job's fault must not stop the others
                self._follow_failed(job_id, exc)
            else:
                self._follow_failures.pop(job_id, None)
        self.tails.forget(set(active))
        try:
            if self._outage.since is not None or time.monotonic() - self._reconciled_at >= RECONCILE_EVERY_S:
                self.attempts.reconcile()
                self._reconciled_at = time.monotonic()
                self._outage.answered()
        except ClusterUnavailable as exc:
            self._outage.failed("cannot reconcile with Ray", exc)
        if self.release is not None:  # a dependency that ended in this pass's follows queues its job now
            try:
                self.release.release(fence)
            except LeaseLost:
                raise
            except Exception:  # noqa: BLE001 - the waiting jobs wait a pass longer; the queue goes on
                log.exception("queueing the jobs that wait for others failed; tried again next pass")
        with self._submit_lock:
            starting = frozenset(self._submitting)  # before admission reads: each counts as held
        admitted = self.queue.admit(fence, starting)
        for job_id in admitted.start:
            self._dispatch(job_id, fence)
        if (preempt := admitted.preempt) is not None:
            self.preemptions.preempt(preempt.victims, preempt.for_job, preempt.for_project, fence)

    def account(self, fence: Fence | None = None) -> None:
        """Count the running attempts' usage up to now and add what was counted to the
        projects' decayed usage (service/tenancy/usage.py); a unit runs it every ACCOUNT_EVERY_S.
        With ``fence`` (the usage unit's lease), only while that lease is held: a replica
        paused past it counts nothing the new holder counts too (LeaseLost)."""
        with self._passes:
            self._account(fence)

    def _account(self, fence: Fence | None = None) -> None:
        running = tuple(s.value for s in lifecycle.RUNNING_STATES)
        with self.sessions.begin() as s:
            if fence is not None:
                fence.hold(s)  # first: a take-over waits for this count, or refuses it
            now = utcnow()
            usage.accrue_running(s, running, now)
            usage.bill(s, now, self.settings.scheduling.fair_share_half_life_s)

    def _follow_failed(self, job_id: str, exc: Exception) -> None:
        n = self._follow_failures.get(job_id, 0) + 1
        self._follow_failures[job_id] = n
        log.warning("following job %s failed (%d in a row): %s: %s", job_id, n, type(exc).__name__, exc)
        if n < FOLLOW_FAILURES:
            return
        self._follow_failures.pop(job_id, None)
        with self.sessions.begin() as s:
            job = s.get(JobRow, job_id)
            if job is not None and job.status in ACTIVE:
                lifecycle.fail(
                    s,
                    job,
                    FailureCause.INFRASTRUCTURE,
                    f"{type(exc).__name__}: {exc}"[:LOG_TAIL_IN_ERROR],
                    reason=f"the server could not follow the job ({FOLLOW_FAILURES} tries in a row)",
                )
        # Its Ray job is stopped by reconciliation: it is no longer active in that attempt.

    def _cluster_unreachable(self, active: list[str], exc: Exception) -> None:
        """A cluster gone for good fails its jobs (history kept); a blip does not. Their
        Ray jobs are stopped by reconciliation once the cluster answers again."""
        self._outage.failed("cannot reach Ray", exc)
        if time.monotonic() - self._outage.since < self.settings.cluster.cluster_lost_after_s:
            return
        with self.sessions.begin() as s:
            for job_id in active:
                job = s.get(JobRow, job_id)
                if job is not None and job.status in ACTIVE:
                    lifecycle.fail(
                        s,
                        job,
                        FailureCause.INFRASTRUCTURE,
                        str(exc),
                        reason=f"the Ray cluster has been unreachable for {self.settings.cluster.cluster_lost_after_s:g}s",
                    )

    # ------------------------------------------------------------------ starting jobs

    def _dispatch(self, job_id: str, fence: Fence | None) -> None:
        with self._submit_lock:
            if job_id in self._submitting:
                return
            self._submitting.add(job_id)
        self._pool.submit(self._start, job_id, fence)

    def _start(self, job_id: str, fence: Fence | None) -> None:
        try:
            self.attempts.start(job_id, fence)
        except LeaseLost as exc:  # another replica runs the monitor now: it starts the job
            log.warning("job %s is left to the replica that holds the monitor now: %s", job_id, exc)
        except ClusterUnavailable as exc:
            self._outage.failed(f"submit of job {job_id} waits for the cluster", exc)
        except Exception:  # noqa: BLE001 - the next tick submits the same id again
            log.exception("submit of job %s failed; it is retried with the same submission id", job_id)
        finally:
            with self._submit_lock:
                self._submitting.discard(job_id)
            self.wake()

    # ------------------------------------------------------------------ one job

    def follow(self, job_id: str) -> None:
        with self.sessions() as s:
            job = s.get(JobRow, job_id)
            if job is None or job.ray_job_id is None:
                return
            submission_id, current, log_offset = job.ray_job_id, JobStatus(job.status), job.log_offset
        # Status first, then logs: once Ray says the job ended, the log we read is complete.
        state = self.backend.state(submission_id)
        if state is None:
            with self.sessions.begin() as s:
                job = s.get(JobRow, job_id)
                lifecycle.fail(
                    s,
                    job,
                    FailureCause.INFRASTRUCTURE,
                    reason="the Ray cluster has no record of this job (the cluster was restarted or replaced)",
                )
            return
        target = lifecycle.from_ray(state.status, current)
        # What the attempt logged since the last tick (service/events/log_tails.py); once Ray says
        # it ended, its whole log is stored before its end is.
        if not self.tails.read(job_id, submission_id, log_offset, target.is_terminal()):
            return
        if current == JobStatus.CANCELLING and not target.is_terminal():
            self.backend.stop(submission_id)  # a stop lost to a restart is asked again
            return
        if current == JobStatus.PREEMPTED and not target.is_terminal():
            if self.preemptions.stop_due(job_id):  # its checkpoint is in, or its grace is over
                self.backend.stop(submission_id)
            return
        if not target.is_terminal() and self._past_max_runtime(job_id):
            self.backend.stop(submission_id)
            return
        with self.sessions.begin() as s:
            job = s.get(JobRow, job_id)
            if job.ray_job_id != submission_id:
                return  # a new attempt started meanwhile
            log_tail = logs.tail(s, job, LOG_TAIL_IN_ERROR) if target.is_terminal() else ""
            decision = lifecycle.decide(job, state.status, state.message, log_tail)
            if decision.target is not None:
                lifecycle.transition(
                    s,
                    job,
                    decision.target,
                    reason=decision.reason,
                    cause=decision.cause,
                    error=decision.error,
                    also=decision.also,
                )

    def _past_max_runtime(self, job_id: str) -> bool:
        """Whether this attempt ran past max_runtime_s; if so the job is moved to
        CANCELLING with the TIMEOUT recorded, so the STOPPED that follows reads as one."""
        with self.sessions.begin() as s:
            job = s.get(JobRow, job_id)
            limit, since = job.max_runtime_s, job.attempt_started_at
            if limit is None or since is None or (utcnow() - aware(since)).total_seconds() <= limit:
                return False
            error = f"The job ran longer than max_runtime_s={limit:g} and was stopped. Raise max_runtime_s if it needs longer."
            timeout = {
                "failure_cause": FailureCause.TIMEOUT.value,
                "error": error,
            }  # written with the move, or not at all
            lifecycle.transition(s, job, JobStatus.CANCELLING, reason="stopping: exceeded max_runtime_s", also=timeout)
        return True
