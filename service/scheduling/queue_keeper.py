"""The queue keeper: applies admission's plan (service/scheduling/admission.py) to the queue in SQL
(service/scheduling/queue.py) on each monitor tick, and remembers what its last pass saw so the
next one looks again only at what changed.

Each pass fails what missed its deadline or can never fit, says why the rest wait, stores
every waiting job's place, and returns its decision (``Admitted``): the jobs to start and
the borrowed jobs to preempt, if any; the monitor carries it out. It reads the typed
columns filled at submit and looks again only at jobs created or moved since the last
pass (all of them every ``FULL_PASS_S``), so a quiet pass writes nothing and reads no
more than the head of the queue.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Protocol

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from api.errors import ClusterUnavailable
from api.schemas import ClusterInfo, FailureCause, JobSpec, JobStatus, QuotaSpec
from service import lifecycle
from service.db.leases import Fence
from service.db.models import JobRow, utcnow
from service.scheduling import admission, fair_share, queue
from service.stored.specs import stored_spec
from service.tenancy import quotas

log = logging.getLogger("raydock.monitor")

FULL_PASS_S = 30.0  # every queued job's reason and place are read again at least this often
BIG_MOVE, POSITIONS_EVERY_S = 1000, 2.0  # places rewritten for the whole queue at most this often


class Capacity(Protocol):
    """What the keeper asks of the cluster (``RayBackend`` answers it): the room the
    scheduling room needs, without importing the module that talks to Ray."""

    def capacity(self) -> tuple[ClusterInfo, tuple[float, float]]: ...


@dataclass(frozen=True)
class Preemption:
    """Borrowed jobs to preempt for a project under its guarantee, and the job they make room for."""

    victims: list[str]
    for_job: str
    for_project: str


@dataclass(frozen=True)
class Admitted:
    """One pass's decision: the jobs to submit, and the preemption to make (None: none)."""

    start: list[str] = field(default_factory=list)
    preempt: Preemption | None = None


class QueueKeeper:
    def __init__(
        self,
        sessions,
        backend: Capacity,
        active: tuple[str, ...],
        default_quota: QuotaSpec | None = None,
        half_life_s: float = 3600.0,
    ):
        self.sessions = sessions
        self.backend = backend
        self.active = active
        self.default_quota = default_quota or QuotaSpec()
        self.half_life_s = half_life_s
        self._marks: queue.Marks | None = None  # None: the next pass reads the whole queue
        self._full_pass_at = float("-inf")
        self._rest_reason: str | None = None
        self._seen: set[str] = set()  # the jobs the last plan looked at
        self._unplaced: set[str] = set()  # touched jobs whose places are not stored yet
        self._big_move_at = float("-inf")

    def admit(self, fence: Fence | None = None, starting: frozenset[str] = frozenset()) -> Admitted:
        """One admission pass (its failures of waiting jobs fenced by the monitor's lease). The jobs to submit are those the plan starts, and those
        whose submit is under way or was cut short (their submission id is fixed, so they
        hold their resources already and are submitted again with the same id).

        ``starting``: the jobs the monitor dispatched and is still starting. They hold their
        resources whatever the store shows of them yet: one that fixes its submission id
        between this pass's read of what is held and its read of the queue would otherwise
        be in neither, and its CPUs planned for another job."""
        with self.sessions() as s:
            now_marks = queue.marks(s)  # before any read: what changes after is seen next pass
            if self._marks is None:
                self._type_old_jobs(s)
            in_flight = queue.in_flight(s)
            held, held_extra = queue.held(s, self.active, starting)
            late = admission.overdue(queue.with_deadline(s), utcnow())
            full = self._marks is None or time.monotonic() - self._full_pass_at >= FULL_PASS_S
            touched = None if full else queue.touched_since(s, self._marks)
        try:
            info, extra = self.backend.capacity()
        except ClusterUnavailable as exc:
            self.fail_queued(late, fence)
            self._tell(admission.Plan(), f"waiting for the Ray cluster: {exc}", touched, now_marks)
            return Admitted(in_flight)
        # A job submitted while Ray did not answer skipped the submit-time check: one that can
        # never fit fails here instead of blocking the queue behind it for ever.
        max_cpus, max_gpus = admission.max_capacity(info, extra)
        with self.sessions() as s:
            too_big = queue.never_fit(s, max_cpus, max_gpus)
        self.fail_queued(late + self._refusals(too_big, max_cpus, max_gpus, info.autoscaler is not None), fence)
        skip = {f.job_id for f in late} | set(too_big) | starting
        with self.sessions() as s:
            # Ray counts its usage every few seconds: a job of ours that ended since still counts there.
            released = (
                queue.released_since(s, self.active, datetime.fromtimestamp(info.usage_at, timezone.utc))
                if info.usage_at is not None
                else (0.0, 0.0)
            )
            free_extra = admission.extra_free(info, held_extra)
            loads = quotas.loads(s, self.active, self.default_quota, self.half_life_s)
            heads = {p: queue.head(s, skip=skip, project=p) for p in loads}
            order = admission.fair_order(heads, loads)
            ceiling = admission.Ceiling(max_cpus, max_gpus, admission.extra_free(info, []))
            plan = admission.plan(order, admission.free(info, held, extra, released), free_extra, loads, ceiling)
            preempt = self._victims(s, plan, loads)
        self._tell(plan, admission.BEHIND, touched, now_marks)
        return Admitted(in_flight + plan.start, preempt)

    def _victims(self, s: Session, plan: admission.Plan, loads) -> Preemption | None:
        """The borrowed jobs to preempt for the first waiting job within its project's
        guarantee; none while an earlier preemption is still stopping its jobs."""
        if plan.wants is None:
            return None
        job, need = plan.wants
        preempted = JobStatus.PREEMPTED.value
        if s.scalar(select(JobRow.id).where(JobRow.status == preempted).limit(1)) is not None:
            plan.reasons[job.id] = (
                f"waiting for preempted borrowed jobs to stop: project {job.project} is under its guarantee"
            )
            return None
        chosen = fair_share.victims(quotas.running(s, (JobStatus.RUNNING.value,)), loads, need, job.project)
        if not chosen:
            return None
        plan.reasons[job.id] = (
            f"waiting for preempted borrowed jobs to stop: project {job.project} is under its guarantee"
        )
        return Preemption(chosen, job.id, job.project)

    def fail_queued(self, failures: list[admission.Failure], fence: Fence | None = None) -> None:
        """Fail these jobs if they are still waiting (a record this server cannot read,
        e.g. stored by another version, fails alone; the rest of the queue goes on); with
        ``fence``, only while the monitor's lease is held under it (else LeaseLost)."""
        if not failures:
            return
        with self.sessions.begin() as s:
            if fence is not None:
                fence.hold(s)
            for f in failures:
                job = s.get(JobRow, f.job_id)
                if job is not None and job.status == JobStatus.QUEUED.value and job.submission_id is None:
                    lifecycle.fail(s, job, f.cause, f.error, reason=f.reason)

    def _tell(self, plan: admission.Plan, rest: str, touched: set[str] | None, now_marks: queue.Marks) -> None:
        """Write the plan's reasons, ``rest`` for every other waiting job whose reason may
        differ (all of them when ``touched`` is None or ``rest`` changed; else those
        touched since the last pass and those the last plan looked at), and the places."""
        full = touched is None or rest != self._rest_reason
        with self.sessions.begin() as s:
            queue.record_starts(s, plan)
            for job_id, reason in plan.reasons.items():
                waiting = (JobRow.id == job_id, JobRow.status == JobStatus.QUEUED.value)
                s.execute(update(JobRow).where(*waiting).values(status_reason=reason))
            queue.tell_the_rest(s, rest, exclude=plan.seen, only=None if full else touched | self._seen)
            self._store_positions(s, None if full else touched)
        if touched is None:
            self._full_pass_at = time.monotonic()
        self._marks, self._rest_reason, self._seen = now_marks, rest, plan.seen

    def _store_positions(self, s: Session, touched: set[str] | None) -> None:
        """Store the places in the queue. When the whole queue moves (its head left) every
        place is rewritten; while that keeps happening (a mass cancel) it is done at most
        every POSITIONS_EVERY_S, the jobs touched meanwhile kept for the next time."""
        if touched is not None:
            touched = touched | self._unplaced
            if not touched or time.monotonic() - self._big_move_at < POSITIONS_EVERY_S:
                self._unplaced = touched
                return
        moved = queue.store_positions(s, touched)
        self._unplaced = set()
        if moved >= BIG_MOVE:
            self._big_move_at = time.monotonic()

    def _type_old_jobs(self, s: Session) -> None:
        """Jobs stored before the typed columns existed get them, on this keeper's first
        pass (unreadable queued ones fail alone; the rest of the queue goes on)."""
        untyped = queue.untyped(s, (JobStatus.QUEUED.value, *self.active))
        if not untyped:
            return
        unreadable = []
        with self.sessions.begin() as w:
            for job_id, spec in untyped:
                parsed = _spec(job_id, spec)
                if parsed is None:
                    unreadable.append(_unreadable(job_id))
                else:
                    w.execute(update(JobRow).where(JobRow.id == job_id).values(**queue.typed_columns(parsed)))
        self.fail_queued(unreadable)

    def _refusals(
        self, job_ids: list[str], max_cpus: float, max_gpus: float, autoscaled: bool
    ) -> list[admission.Failure]:
        """Why each of these jobs can never fit (their specs read once, as they fail)."""
        if not job_ids:
            return []
        with self.sessions() as s:
            specs = dict(s.execute(select(JobRow.id, JobRow.spec).where(JobRow.id.in_(job_ids))).all())
        out = []
        for job_id, spec in specs.items():
            parsed = _spec(job_id, spec)
            if parsed is None:
                out.append(_unreadable(job_id))
            elif (refusal := admission.capacity_refusal(parsed, max_cpus, max_gpus, autoscaled)) is not None:
                out.append(
                    admission.Failure(job_id, FailureCause.NO_RESOURCES, "can never fit the cluster", refusal.message)
                )
        return out


def _unreadable(job_id: str) -> admission.Failure:
    why = "the stored job spec no longer validates"
    return admission.Failure(job_id, FailureCause.INFRASTRUCTURE, why, why)


def _spec(job_id: str, spec: dict) -> JobSpec | None:
    try:
        return stored_spec(spec)
    except ValueError:  # pydantic's ValidationError included
        log.warning("job %s: its stored spec no longer validates", job_id)
        return None
