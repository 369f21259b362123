"""The job commands: submit, cancel, resume and delete jobs (reading them is
``service/job_reads.py``; what running jobs push is ``service/events/push.py``). Built by
the composition root (``service/runtime.py``), which hands it the store, the cluster, the
code store and the reads by name. It never waits on training: a submit only records the
job (QUEUED); the monitor starts it on the cluster (``service/attempts.py``)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from typing import Any, Callable

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from api.errors import ClusterUnavailable, Conflict, NotFound
from api.schemas import (
    CODE_REF_PREFIX,
    CancelledJobs,
    CancelRefusal,
    JobPublic,
    JobSpec,
    JobStatus,
    code_spec,
)
from api.schemas.tenancy import DEFAULT_PROJECT
from service import lifecycle
from service.cluster.ray_backend import RayBackend
from service.code import user_code
from service.code.packages import CodeStore
from service.db import job_records, purge
from service.db.event_models import CheckpointRow
from service.db.job_records import to_public
from service.db.models import JobRow, count, utcnow
from service.eventlog import subscriptions
from service.eventlog.log import SYSTEM, record
from service.files import storage
from service.job_reads import JobReads, job_missing, job_row
from service.pipelines import dependencies
from service.scheduling import admission, node_fit, queue
from service.settings import Settings
from service.stored import phases
from service.telemetry import instruments
from service.tenancy import quotas
from service.tracking import enrol as tracking

log = logging.getLogger("raydock.jobs")

CAPACITY_TTL_S = 2.0  # how long the submit-time capacity check reuses Ray's answer
DEADLOCK = "40P01"  # PostgreSQL's SQLSTATE for a transaction it rolled back to break a deadlock


def body_hash(spec: JobSpec) -> str:
    return hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


class JobCommands:
    def __init__(
        self, settings: Settings, sessions: sessionmaker, backend: RayBackend, code: CodeStore, reads: JobReads
    ):
        self.settings = settings
        self.sessions = sessions
        self.backend = backend
        self.code = code  # uploaded code packages (service/code/packages.py)
        self.reads = reads  # a command answers with the job as read back
        self.on_submit: Callable[[], None] = lambda: None  # the monitor wakes up on it
        self._capacity_seen: tuple[float, Any] = (float("-inf"), None)

    # ------------------------------------------------------------------ submit

    def validate(self, spec: JobSpec, project: str = DEFAULT_PROJECT) -> None:
        """Refuse at submit what can never run, so nothing is stored half-valid."""
        user_code.check_user_code(
            spec, self.settings
        )  # code paths, runtime_env, entrypoint (service/code/user_code.py)
        tracking.check(spec, self.settings)  # a tracker the server has (service/tracking/enrol.py)
        subscriptions.check_notify(spec.notify, self.settings)  # webhook URLs (service/eventlog/url_policy.py)
        train = code_spec(spec)
        if train.is_user_code and train.code:
            self.code.check_ref(train.code, train.entrypoint, ["base"] if spec.kind == "tune" else [], project)
        try:
            info, extra = self._capacity()
        except ClusterUnavailable:
            return  # the job waits QUEUED for the cluster; admission checks again
        max_cpus, max_gpus = admission.max_capacity(info, extra)
        if (refusal := node_fit.refusal(spec, info)) is not None:  # what no node has (an accelerator type, ...)
            raise refusal
        if (refusal := admission.capacity_refusal(spec, max_cpus, max_gpus, info.autoscaler is not None)) is not None:
            raise refusal

    def _capacity(self):
        """The cluster's capacity for the submit-time check, asked of Ray at most every
        CAPACITY_TTL_S: a burst of submits costs one call to the dashboard, not one each."""
        at, answer = self._capacity_seen
        if time.monotonic() - at >= CAPACITY_TTL_S:
            try:
                answer = self.backend.capacity()
            except ClusterUnavailable as exc:
                answer = exc
            self._capacity_seen = (time.monotonic(), answer)
        if isinstance(answer, ClusterUnavailable):
            raise answer
        return answer

    def submit(
        self,
        spec: JobSpec,
        idempotency_key: str | None = None,
        *,
        actor: str = SYSTEM,
        project: str | None = None,
        user_id: int | None = None,
    ) -> tuple[JobPublic, bool]:
        """Record a job in ``project`` (the route passes the one the caller may submit to:
        service/http/access.py; None: the spec's, else ``default``); returns it and whether
        it was created (False: the same Idempotency-Key came with the same body to the same
        project before, and this is that job)."""
        project = project or spec.project or DEFAULT_PROJECT
        digest = body_hash(spec) if idempotency_key else None  # only a key's retries are compared
        if idempotency_key and (existing := self._by_key(idempotency_key, digest, project)) is not None:
            return existing, False
        self.validate(spec, project)
        try:
            with self.sessions.begin() as s:  # a Core insert: the ORM's unit of work costs more than the write
                job = self.insert(s, spec, actor=actor, project=project, user_id=user_id, key=(idempotency_key, digest))
        except IntegrityError:
            # A concurrent POST with the same key won the race: answer with its job.
            if idempotency_key and (existing := self._by_key(idempotency_key, digest, project)) is not None:
                return existing, False
            raise
        instruments.submitted(spec.kind)
        self.on_submit()
        return job, True

    def insert(
        self,
        s: Session,
        spec: JobSpec,
        *,
        actor: str,
        project: str,
        user_id: int | None,
        key: tuple[str | None, str | None] = (None, None),
        pipeline_id: str | None = None,
    ) -> JobPublic:
        """Record a validated job in ``s``'s transaction (a submit's, or a schedule's firing
        with its tick: service/schedules/firing.py): the project's queue room, the row, its
        code reference, tracking, webhooks and the ``submitted`` event, all or nothing."""
        now = utcnow()
        stored = spec.model_dump(mode="json")
        named = dependencies.check(s, spec, project)  # each a job of this project (422 if not)
        deps = dependencies.effective(stored)  # none: it joins the queue now; else it WAITs for them
        row = {
            "id": "j" + uuid.uuid4().hex[:11],
            "name": spec.name,
            "kind": spec.kind,
            "status": (JobStatus.WAITING if deps else JobStatus.QUEUED).value,
            "status_reason": dependencies.waiting_reason(deps, named) if deps else "waiting to be scheduled",
            "labels": spec.labels,
            "spec": stored,
            "pipeline_id": pipeline_id,
            **queue.typed_columns(spec),
            "project_idempotency_key": key[0],
            "idempotency_hash": key[1],
            "created_at": now,
            "queued_at": now,
            "project": project,
            "user_id": user_id,
            "start_phases": phases.fresh(now.timestamp()),
        }
        quotas.check_queue_room(s, project, self.settings.scheduling.default_quota)  # 429 past max_queued
        job = job_records.insert_job(s.connection(), row)
        if (code := code_spec(spec).code) is not None:
            self.code.reference(s, job.id, code.removeprefix(CODE_REF_PREFIX))
        tracking.enrol(s, job.id, spec)
        subscriptions.add_job_webhooks(s, job.id, spec.notify)
        record(s, "submitted", job_id=job.id, actor=actor, name=spec.name, kind=spec.kind, project=project)
        return job

    def _by_key(self, key: str, digest: str, project: str) -> JobPublic | None:
        with self.sessions() as s:
            q = select(JobRow.id, JobRow.idempotency_hash).where(
                JobRow.project == project, JobRow.project_idempotency_key == key
            )  # keys are per project: another project's use of one is neither seen nor in the way
            row = s.execute(q).first()
        if row is None:
            return None
        if row.idempotency_hash is not None and row.idempotency_hash != digest:
            raise Conflict(
                f"Idempotency-Key {key!r} was used for job {row.id} with a different body. "
                "Send the same body to retry that submit, or use a new key for a new job.",
                code="idempotency_key_reused",
            )
        return self.reads.get(row.id)

    # ------------------------------------------------------------------ control

    def cancel(self, job_id: str, *, actor: str = SYSTEM) -> JobPublic:
        with self.sessions.begin() as s:
            job = job_row(s, job_id)
            for _ in range(3):  # a lost race re-reads the job and decides again
                status = JobStatus(job.status)
                if status.is_terminal():
                    raise Conflict(
                        f"Job {job_id} already ended ({status.value}); nothing to cancel.", code="job_finished"
                    )
                if status == JobStatus.CANCELLING:
                    break
                if status in (JobStatus.QUEUED, JobStatus.WAITING):
                    # A submit in flight (submission_id set) finds the job CANCELLED and
                    # stops what Ray accepted; reconciliation catches it if that fails.
                    gone = {"submission_id": None, "queue_position": None}  # the submit's confirm then finds it gone
                    if lifecycle.transition(
                        s, job, JobStatus.CANCELLED, reason="cancelled before it started", also=gone, actor=actor
                    ):
                        record(s, "cancelled", job_id=job_id, actor=actor, status=status.value)
                        break
                elif lifecycle.transition(s, job, JobStatus.CANCELLING, reason="cancel requested", actor=actor):
                    record(s, "cancelled", job_id=job_id, actor=actor, status=status.value)
                    break
            public, stopping = to_public(job), job.status == JobStatus.CANCELLING.value
        if stopping:  # the monitor stops the Ray job (now, and again each tick while it is CANCELLING)
            self.on_submit()
        return public

    def cancel_many(self, job_ids: list[str], *, actor: str = SYSTEM) -> CancelledJobs:
        """Cancel many jobs in one transaction of compare-and-set statements: queued ones
        CANCELLED, started ones CANCELLING (the monitor stops their Ray jobs); the rest
        (already cancelling, ended, unknown, or moved meanwhile) one by one, each refusal
        said per job. Nothing here waits on Ray."""
        ids = list(dict.fromkeys(job_ids))
        for tries_left in reversed(range(3)):
            try:
                with self.sessions.begin() as s:
                    known = set(s.scalars(select(JobRow.id).where(JobRow.id.in_(ids))))
                    gone = {
                        "submission_id": None,
                        "queue_position": None,
                    }  # as for one cancel: a submit in flight finds it gone
                    why = "cancelled before it started"
                    moved = []
                    for unstarted in (JobStatus.WAITING, JobStatus.QUEUED):
                        moved += lifecycle.transition_many(
                            s, ids, unstarted, JobStatus.CANCELLED, reason=why, also=gone, actor=actor
                        )
                    for started in (JobStatus.STARTING, JobStatus.RUNNING):  # the monitor stops their Ray jobs
                        moved += lifecycle.transition_many(
                            s, ids, started, JobStatus.CANCELLING, reason="cancel requested", actor=actor
                        )
                    for job_id in moved:
                        record(s, "cancelled", job_id=job_id, actor=actor)
                break
            except DBAPIError as exc:  # PostgreSQL chose this transaction to end a deadlock: nothing was written
                if tries_left == 0 or getattr(exc.orig, "sqlstate", None) != DEADLOCK:
                    raise
        done = set(moved)
        if done:
            self.on_submit()  # the monitor stops the CANCELLING jobs' Ray jobs now
        cancelled, refused = [i for i in ids if i in done], []
        for job_id in ids:
            if job_id in done:
                continue
            try:
                if job_id not in known:
                    job_missing(job_id)
                self.cancel(job_id, actor=actor)
                cancelled.append(job_id)
            except (Conflict, NotFound) as exc:
                refused.append(CancelRefusal(id=job_id, code=exc.code, message=exc.message))
        return CancelledJobs(cancelled=cancelled, refused=refused)

    def resume(self, job_id: str, *, actor: str = SYSTEM) -> JobPublic:
        """A new attempt of a FAILED or CANCELLED job. Ray Train finds the run's
        checkpoint state under the same storage name, so the loop's
        ``ray.train.get_checkpoint()`` returns the last checkpoint."""
        with self.sessions.begin() as s:
            job = job_row(s, job_id)
            status = JobStatus(job.status)
            if job.deleting:
                raise Conflict(f"Job {job_id} is being deleted; it cannot be resumed.", code="job_being_deleted")
            if status not in (JobStatus.FAILED, JobStatus.CANCELLED):
                raise Conflict(
                    f"Job {job_id} is {status.value}; only FAILED or CANCELLED jobs can be resumed.",
                    code="job_not_resumable",
                )
            has_checkpoint = count(s, CheckpointRow, CheckpointRow.job_id == job_id)
            reason = (
                "resumed from its last checkpoint"
                if has_checkpoint
                else "resumed (no checkpoint yet: starts from scratch)"
            )
            # The ended attempt's driver can no longer push; the next attempt gets a new token.
            fresh = {"events_token_hash": None, "submission_id": None, "queue_position": None}
            if not lifecycle.transition(s, job, JobStatus.QUEUED, reason=reason, also=fresh, actor=actor):
                raise Conflict(f"Job {job_id} changed while it was being resumed; try again.", code="job_not_resumable")
            record(s, "resumed", job_id=job_id, actor=actor, status=status.value, from_checkpoint=bool(has_checkpoint))
        self.on_submit()
        return self.reads.get(job_id)

    def delete(self, job_id: str, *, actor: str = SYSTEM) -> None:
        with self.sessions.begin() as s:
            job = job_row(s, job_id)
            if not JobStatus(job.status).is_terminal():
                raise Conflict(
                    f"Job {job_id} is {job.status}; cancel it first (POST /v1/jobs/{job_id}/cancel), then delete it.",
                    code="job_not_finished",
                )
            ray_job_id = job.ray_job_id
            job.deleting = True  # a resume now refuses it
            record(s, "deleted", job_id=job_id, actor=actor, name=job.name, status=job.status)
        # A chunk of its rows per transaction, the job row last (service/purge.py).
        purge.delete_jobs(self.sessions, [job_id])
        # The rows are gone first: a crash here leaves files, never a row without files.
        try:
            storage.remove(self.reads.prefix(job_id))
        except OSError as exc:  # a job still writing there; what it left is only ever its own
            log.warning("job %s deleted; its storage could not be removed: %s", job_id, exc)
        if ray_job_id:
            try:
                self.backend.delete(ray_job_id)
            except ClusterUnavailable:
                pass
