"""The job service: submit, inspect, cancel and delete jobs, and take in what running
jobs report. Route handlers call this and nothing else; it never waits on training.
Submission only records the job (QUEUED); the monitor starts it on the cluster."""

from __future__ import annotations

import importlib.util
import json
import secrets
import threading
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from api.errors import CapacityExceeded, Conflict, InvalidSpec, NotFound
from api.schemas import (
    CheckpointPublic,
    FailureCause,
    JobList,
    JobPublic,
    JobSpec,
    JobStatus,
    MetricPoint,
    RestartInfo,
)
from service import lifecycle, storage
from service.ray_backend import ClusterUnavailable, RayBackend
from service.settings import Settings
from service.store import CheckpointRow, JobRow, LogChunkRow, MetricRow, utcnow
from service.elastic import apply_event as apply_worker_group_event
from service.elastic import graceful_stop_env
from service.trials import apply_event as apply_trial_event
from tuning.budget import check_search_budget, search_demand
from trainers.events import parse_line


def to_public(job: JobRow, queue_position: int | None = None) -> JobPublic:
    return JobPublic(
        id=job.id,
        name=job.name,
        kind=job.kind,
        status=JobStatus(job.status),
        status_reason=job.status_reason,
        failure_cause=FailureCause(job.failure_cause) if job.status == JobStatus.FAILED.value and job.failure_cause else None,
        error=job.error if job.status == JobStatus.FAILED.value else None,
        labels=job.labels or {},
        spec=job.spec,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        attempt=job.attempt,
        ray_job_id=job.ray_job_id,
        latest_metrics=job.latest_metrics,
        queue_position=queue_position if job.status == JobStatus.QUEUED.value else None,
        restarts=[RestartInfo(**r) for r in (job.restarts or [])],
    )


def queue_order(query):
    """The one queue order: priority first, then arrival."""
    return query.order_by(JobRow.priority.desc(), JobRow.queued_at, JobRow.id)


def demand(spec: JobSpec) -> tuple[float, float]:
    """(CPUs, GPUs) a job needs on the cluster to start (an elastic job: its min workers)."""
    if spec.kind == "tune":  # a search holds its concurrent trials (tuning/budget.py)
        return search_demand(spec)
    s = spec.scaling
    return s.min_workers * s.cpus_per_worker, (s.min_workers if s.use_gpu else 0.0)


class JobService:
    def __init__(self, settings: Settings, sessions: sessionmaker, backend: RayBackend):
        self.settings = settings
        self.sessions = sessions
        self.backend = backend
        self.on_submit: Callable[[], None] = lambda: None  # the monitor wakes up on it
        self._locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)

    # ------------------------------------------------------------------ submit

    def validate(self, spec: JobSpec) -> None:
        """Refuse at submit what can never run, so nothing is stored half-valid."""
        if spec.is_user_code:
            self._check_entrypoint(spec)
        cpus, gpus = demand(spec)
        try:
            max_cpus, max_gpus = self.backend.max_node_capacity()
        except ClusterUnavailable:
            return  # the job waits QUEUED for the cluster; admission checks again
        if spec.kind == "tune":  # a search's concurrent trials against the cluster (tuning/budget.py)
            return check_search_budget(spec, max_cpus, max_gpus)
        if cpus > max_cpus or gpus > max_gpus:
            need = f"{spec.scaling.min_workers} workers x {spec.scaling.cpus_per_worker:g} CPU"
            if spec.scaling.use_gpu:
                need += " + 1 GPU"
            if spec.scaling.is_elastic:
                need = f"at least {need} (scaling.num_workers.min)"
            scaler = "counting what its autoscaler can add" if self.backend.has_autoscaler else "and no autoscaler"
            raise CapacityExceeded(
                f"The job asks for {need} ({cpus:g} CPUs, {gpus:g} GPUs) but the cluster has "
                f"{max_cpus:g} CPUs and {max_gpus:g} GPUs in all, {scaler}. "
                "Lower scaling.num_workers or scaling.cpus_per_worker, or add nodes.",
                details=[{"loc": ["scaling", "num_workers"], "msg": "exceeds cluster capacity"}],
            )

    def _check_entrypoint(self, spec: JobSpec) -> None:
        module = spec.entrypoint.split(":")[0]
        if spec.working_dir:
            root = Path(spec.working_dir)
            if not root.is_dir():
                raise InvalidSpec(
                    f"working_dir {spec.working_dir!r} is not a directory on the server. Give a path the server can read.",
                    code="working_dir_not_found",
                    details=[{"loc": ["working_dir"], "msg": "not a directory"}],
                )
            rel = Path(*module.split("."))
            found = (root / rel).with_suffix(".py").is_file() or (root / rel / "__init__.py").is_file()
        else:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
        if not found:
            where = f"in working_dir {spec.working_dir!r}" if spec.working_dir else "on the server's Python path"
            raise InvalidSpec(
                f"entrypoint module {module!r} was not found {where}. "
                "Check the module path in `entrypoint`, or set `working_dir` to the directory that contains it.",
                code="entrypoint_not_found",
                details=[{"loc": ["entrypoint"], "msg": "module not found"}],
            )

    def submit(self, spec: JobSpec, idempotency_key: str | None = None) -> tuple[JobPublic, bool]:
        """Record a job; returns it and whether it was created (False: the same
        Idempotency-Key was seen before, and this is that job)."""
        if idempotency_key and (existing := self._by_key(idempotency_key)) is not None:
            return existing, False
        self.validate(spec)
        job = JobRow(
            id="j" + uuid.uuid4().hex[:11],
            name=spec.name,
            kind=spec.kind,
            status=JobStatus.QUEUED.value,
            status_reason="waiting to be scheduled",
            labels=spec.labels,
            spec=spec.model_dump(mode="json"),
            events_token=secrets.token_urlsafe(24),
            priority=getattr(spec, "priority", 0),
            idempotency_key=idempotency_key,
            queued_at=utcnow(),
        )
        try:
            with self.sessions.begin() as s:
                s.add(job)
        except IntegrityError:
            # A concurrent POST with the same key won the race: answer with its job.
            if idempotency_key and (existing := self._by_key(idempotency_key)) is not None:
                return existing, False
            raise
        self.on_submit()
        return self.get(job.id), True

    def _by_key(self, key: str) -> JobPublic | None:
        with self.sessions() as s:
            job_id = s.scalar(select(JobRow.id).where(JobRow.idempotency_key == key))
        return self.get(job_id) if job_id else None

    # ------------------------------------------------------------------ read

    def _job(self, s: Session, job_id: str) -> JobRow:
        job = s.get(JobRow, job_id)
        if job is None:
            raise NotFound(f"No job {job_id!r}. List jobs with GET /v1/jobs.", code="job_not_found")
        return job

    def _positions(self, s: Session) -> dict[str, int]:
        queued = s.scalars(queue_order(select(JobRow.id).where(JobRow.status == JobStatus.QUEUED.value))).all()
        return {job_id: i + 1 for i, job_id in enumerate(queued)}

    def get(self, job_id: str) -> JobPublic:
        with self.sessions() as s:
            job = self._job(s, job_id)
            return to_public(job, self._positions(s).get(job_id) if job.status == JobStatus.QUEUED.value else None)

    def list(self, *, status: JobStatus | None, labels: dict[str, str], limit: int, offset: int) -> JobList:
        with self.sessions() as s:
            q = select(JobRow)
            if status is not None:
                q = q.where(JobRow.status == status.value)
            rows = s.scalars(q.order_by(JobRow.created_at.desc(), JobRow.id)).all()
            # Label filters are few and jobs per page small; filtering here keeps the SQL portable.
            rows = [r for r in rows if all((r.labels or {}).get(k) == v for k, v in labels.items())]
            positions = self._positions(s)
            items = [to_public(r, positions.get(r.id)) for r in rows[offset : offset + limit]]
            return JobList(items=items, total=len(rows), limit=limit, offset=offset)

    def metrics(self, job_id: str, since: int = -1) -> list[MetricPoint]:
        with self.sessions() as s:
            self._job(s, job_id)
            rows = s.scalars(select(MetricRow).where(MetricRow.job_id == job_id, MetricRow.seq > since).order_by(MetricRow.seq))
            return [MetricPoint(seq=r.seq, attempt=r.attempt, ts=r.ts, step=r.step, epoch=r.epoch, metrics=r.values) for r in rows]

    def logs(self, job_id: str, offset: int = 0) -> tuple[str, int]:
        """Log text from character ``offset`` on, and the offset after it."""
        with self.sessions() as s:
            self._job(s, job_id)
            text = "".join(s.scalars(select(LogChunkRow.text).where(LogChunkRow.job_id == job_id).order_by(LogChunkRow.id)))
        return text[offset:], len(text)

    def is_terminal(self, job_id: str) -> bool:
        return self.get(job_id).status.is_terminal()

    def checkpoints(self, job_id: str) -> list[CheckpointPublic]:
        with self.sessions() as s:
            self._job(s, job_id)
            rows = s.scalars(select(CheckpointRow).where(CheckpointRow.job_id == job_id).order_by(CheckpointRow.id)).all()
        # Ray Train deletes checkpoints beyond `checkpoint.keep`; list only those still stored.
        return [
            CheckpointPublic(id=r.id, path=r.path, step=r.step, epoch=r.epoch, metrics=r.values, created_at=r.created_at)
            for r in rows
            if storage.exists(r.path)
        ]

    def checkpoint_archive(self, job_id: str, checkpoint_id: int) -> tuple[str, bytes]:
        with self.sessions() as s:
            self._job(s, job_id)
            row = s.get(CheckpointRow, checkpoint_id)
            if row is None or row.job_id != job_id:
                raise NotFound(f"Job {job_id} has no checkpoint {checkpoint_id}. List them with GET /v1/jobs/{job_id}/checkpoints.")
        if not storage.exists(row.path):
            raise NotFound(f"Checkpoint {checkpoint_id} of job {job_id} was removed by retention (checkpoint.keep).")
        return f"{job_id}-checkpoint-{checkpoint_id}.tar.gz", storage.archive(row.path)

    # ------------------------------------------------------------------ control

    def cancel(self, job_id: str) -> JobPublic:
        with self.sessions.begin() as s:
            job = self._job(s, job_id)
            status = JobStatus(job.status)
            if status.is_terminal():
                raise Conflict(f"Job {job_id} already ended ({status.value}); nothing to cancel.", code="job_finished")
            if status == JobStatus.QUEUED:
                lifecycle.transition(s, job, JobStatus.CANCELLED, reason="cancelled before it started")
                return to_public(job)
            lifecycle.transition(s, job, JobStatus.CANCELLING, reason="cancel requested")
            ray_job_id = job.ray_job_id
        if ray_job_id:
            try:
                self.backend.stop(ray_job_id)
            except (ClusterUnavailable, RuntimeError):
                pass  # the monitor retries the stop while the job is CANCELLING
        return self.get(job_id)

    def resume(self, job_id: str) -> JobPublic:
        """A new attempt of a FAILED or CANCELLED job. Ray Train finds the run's
        checkpoint state under the same storage name, so the loop's
        ``ray.train.get_checkpoint()`` returns the last checkpoint."""
        with self.sessions.begin() as s:
            job = self._job(s, job_id)
            status = JobStatus(job.status)
            if status not in (JobStatus.FAILED, JobStatus.CANCELLED):
                raise Conflict(
                    f"Job {job_id} is {status.value}; only FAILED or CANCELLED jobs can be resumed.", code="job_not_resumable"
                )
            has_checkpoint = s.scalar(select(func.count()).select_from(CheckpointRow).where(CheckpointRow.job_id == job_id))
            reason = "resumed from its last checkpoint" if has_checkpoint else "resumed (no checkpoint yet: starts from scratch)"
            lifecycle.transition(s, job, JobStatus.QUEUED, reason=reason)
        self.on_submit()
        return self.get(job_id)

    def delete(self, job_id: str) -> None:
        with self.sessions.begin() as s:
            job = self._job(s, job_id)
            if not JobStatus(job.status).is_terminal():
                raise Conflict(
                    f"Job {job_id} is {job.status}; cancel it first (POST /v1/jobs/{job_id}/cancel), then delete it.",
                    code="job_not_finished",
                )
            ray_job_id = job.ray_job_id
            s.delete(job)
        # The rows are gone first: a crash here leaves files, never a row without files.
        storage.delete_tree(storage.join(self.settings.resolved_storage_path, job_id))
        if ray_job_id:
            try:
                self.backend.delete(ray_job_id)
            except ClusterUnavailable:
                pass

    # ------------------------------------------------------------------ events in

    def check_events_token(self, job_id: str, token: str | None) -> bool:
        with self.sessions() as s:
            job = s.get(JobRow, job_id)
            return job is not None and token is not None and secrets.compare_digest(job.events_token or "", token)

    def ingest(self, job_id: str, events: list[dict[str, Any]], *, log_text: str | None = None, log_offset: int | None = None, push: bool = False) -> None:
        """Store events (from the push channel or parsed from the log) once each, and
        optionally a log chunk with the offset it brings the job to."""
        with self._locks[job_id], self.sessions.begin() as s:
            job = s.get(JobRow, job_id)
            if job is None:
                return
            for event in events:
                self._apply(s, job, event, push=push)
            if log_text:
                s.add(LogChunkRow(job_id=job_id, text=log_text))
            if log_offset is not None:
                job.log_offset = log_offset

    def _apply(self, s: Session, job: JobRow, event: dict[str, Any], push: bool = False) -> None:
        if apply_trial_event(s, job, event):  # a search's trials, lineage and best (service/trials.py)
            return
        if apply_worker_group_event(s, job, event):  # worker count and placement over time (service/elastic.py)
            return
        kind = event.get("type")
        if kind == "metric":
            src_seq = int(event.get("seq", 0))
            exists = s.scalar(
                select(func.count()).select_from(MetricRow).where(
                    MetricRow.job_id == job.id, MetricRow.attempt == job.attempt, MetricRow.src_seq == src_seq
                )
            )
            if exists:
                return
            if push:
                # The fast channel only extends an unbroken series; after a gap (the API was
                # down) the log brings the missing reports in order, so seq follows src_seq.
                stored = s.scalar(
                    select(func.count()).select_from(MetricRow).where(MetricRow.job_id == job.id, MetricRow.attempt == job.attempt)
                )
                if src_seq != stored:
                    return
            m = event.get("metrics") or {}
            seq = s.scalar(select(func.count()).select_from(MetricRow).where(MetricRow.job_id == job.id))
            s.add(
                MetricRow(
                    job_id=job.id, attempt=job.attempt, src_seq=src_seq, seq=seq, ts=float(event.get("ts", 0.0)),
                    step=_int(m.get("step")), epoch=_int(m.get("epoch")), values=m,
                )
            )  # fmt: skip
            s.flush()  # the next event of this batch must see this row
            job.latest_metrics = m
            if job.status == JobStatus.STARTING.value:
                lifecycle.transition(s, job, JobStatus.RUNNING, reason="training")
        elif kind == "checkpoint":
            path = str(event.get("path"))
            if s.scalar(select(func.count()).select_from(CheckpointRow).where(CheckpointRow.job_id == job.id, CheckpointRow.path == path)):
                return
            m = event.get("metrics") or {}
            s.add(CheckpointRow(job_id=job.id, attempt=job.attempt, path=path, step=_int(m.get("step")), epoch=_int(m.get("epoch")), values=m))
            s.flush()
        elif kind == "started":
            if job.status == JobStatus.STARTING.value:
                lifecycle.transition(s, job, JobStatus.RUNNING, reason="driver started")
        elif kind == "worker_failure":
            entry = {"attempt": job.attempt, "at": float(event.get("ts", 0.0)), "reason": str(event.get("reason", ""))}
            if entry not in (job.restarts or []):
                job.restarts = [*(job.restarts or []), entry]
        elif kind == "error" and job.status != JobStatus.CANCELLING.value:
            # Recorded now; the status follows when Ray reports the driver's exit. A job
            # being stopped keeps the reason it is stopped for.
            job.failure_cause = str(event.get("cause") or FailureCause.INFRASTRUCTURE.value)
            job.error = f"{event.get('message', '')}\n\n{event.get('traceback', '')}".strip()

    def ingest_log(self, job_id: str, full_log: str) -> None:
        """Take the part of a job's log past what is stored, up to its last full line."""
        with self.sessions() as s:
            job = s.get(JobRow, job_id)
            if job is None:
                return
            offset = job.log_offset
        end = full_log.rfind("\n", offset) + 1
        if end <= offset:
            return
        text = full_log[offset:end]
        events = [e for line in text.splitlines() if (e := parse_line(line))]
        self.ingest(job_id, events, log_text=text, log_offset=end)


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def spec_env(settings: Settings, job: JobRow) -> dict[str, str]:
    """What the driver on the cluster needs to know, passed as environment variables."""
    return {
        "RAYDOCK_JOB_ID": job.id,
        "RAYDOCK_JOB_SPEC": json.dumps(job.spec),
        "RAYDOCK_STORAGE_PATH": settings.resolved_storage_path,
        "RAYDOCK_EVENTS_URL": f"{settings.events_base_url}/v1/internal/jobs/{job.id}/events",
        "RAYDOCK_EVENTS_TOKEN": job.events_token or "",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(settings.train_health_check_interval_s),
        "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": str(settings.worker_start_timeout_s),
        "RAY_DEDUP_LOGS": "0",
        "PYTHONUNBUFFERED": "1",
        **graceful_stop_env(job.kind),  # a cancelled run hands its CPUs back at once (service/elastic.py)
    }
