"""The writers of the events every job sends (training job or search driver alike): its
start, metric reports, start-up phases, checkpoints, worker failures and worker groups,
its error and its result. Each checks its event before its first write, so a refused
event (``Dropped``, counted by ingestion) leaves nothing behind."""

from __future__ import annotations

from sqlalchemy import select

import service.telemetry.instruments as instruments
from api.schemas import FailureCause, JobStatus
from api.schemas.events import (
    CheckpointEvent,
    ErrorEvent,
    MetricEvent,
    PhaseEvent,
    ResultEvent,
    StartedEvent,
    WorkerFailureEvent,
    WorkerGroupEvent,
)
from service import lifecycle
from service.db.event_models import CheckpointRow, MetricRow, WorkerGroupRow
from service.db.models import count
from service.eventlog.log import job_may_log, record
from service.events import limits, phases
from service.events.limits import room
from service.events.writers import search_events
from service.events.writers.batch import Batch, as_int


def started(b: Batch, event: StartedEvent) -> None:
    if b.job.status == JobStatus.STARTING.value:
        lifecycle.transition(b.s, b.job, JobStatus.RUNNING, reason="driver started")


def metric(b: Batch, event: MetricEvent) -> None:
    job = b.job
    if b.seen(MetricRow, event.seq):
        return
    if job.attempt_metrics_of != job.attempt:
        job.attempt_metrics_of, job.attempt_metrics = job.attempt, 0
    if b.push and event.seq != job.attempt_metrics:
        # The fast channel only extends an unbroken series; after a gap (the API was
        # down) the log brings the missing reports in order, so seq follows src_seq.
        return
    room(b.limits, job, "metrics")
    m = event.metrics
    b.metrics.append(
        dict(
            job_id=job.id,
            attempt=job.attempt,
            src_seq=event.seq,
            seq=job.metrics_stored,
            ts=event.ts,
            step=as_int(m.get("step")),
            epoch=as_int(m.get("epoch")),
            values=m,
        )
    )
    b.stored_now(MetricRow, event.seq)
    if job.attempt_metrics == 0:
        phases.first_metric(job)
    job.metrics_stored += 1
    job.attempt_metrics += 1
    job.latest_metrics = m
    if job.status == JobStatus.STARTING.value:
        lifecycle.transition(b.s, job, JobStatus.RUNNING, reason="training")


def phase(b: Batch, event: PhaseEvent) -> None:
    phases.take(b.job, event)
    if event.trial_id is not None and event.phase == "first_step":
        search_events.trial_mark(b, event.trial_id, "first_step", event.ts)


def checkpoint(b: Batch, event: CheckpointEvent) -> None:
    s, job = b.s, b.job
    path = b.own_path(event.path)
    if count(s, CheckpointRow, CheckpointRow.job_id == job.id, CheckpointRow.path == path):
        return
    room(b.limits, job, "checkpoints")
    limits.stored(job, "checkpoints")
    m = event.metrics
    s.add(
        CheckpointRow(
            job_id=job.id,
            attempt=job.attempt,
            path=path,
            step=as_int(m.get("step")),
            epoch=as_int(m.get("epoch")),
            values=m,
        )
    )
    if job_may_log(job, b.limits.max_log_events_per_job):
        step, epoch = as_int(m.get("step")), as_int(m.get("epoch"))
        record(s, "checkpointed", job_id=job.id, attempt=job.attempt, path=path, step=step, epoch=epoch)


def worker_failure(b: Batch, event: WorkerFailureEvent) -> None:
    job = b.job
    limits.add_restart(job, job.attempt, event.ts, event.reason, b.limits.max_restarts_kept)
    instruments.worker_restarted()
    if job_may_log(job, b.limits.max_log_events_per_job):
        record(b.s, "retried", job_id=job.id, attempt=job.attempt, reason=event.reason)


def error(b: Batch, event: ErrorEvent) -> None:
    # Recorded now; the status follows when Ray reports the driver's exit.
    lifecycle.record_cause(b.job, FailureCause(event.cause), f"{event.message}\n\n{event.traceback}".strip())


def result(b: Batch, event: ResultEvent) -> None:
    b.own_path(event.path, whole=True)  # a run's directory is the job's prefix
    if event.metrics and not b.job.latest_metrics:
        b.job.latest_metrics = event.metrics


def worker_group(b: Batch, event: WorkerGroupEvent) -> None:
    s, job = b.s, b.job
    if b.seen(WorkerGroupRow, event.seq):
        return
    room(b.limits, job, "worker_groups")
    trial_id = event.trial_id if job.kind == "tune" else None
    if trial_id is not None:
        search_events.trial_mark(b, trial_id, "placed", event.ts)
    else:
        _log_resize(b, event.world_size)  # before the new row: it compares with the last
    s.add(
        WorkerGroupRow(
            job_id=job.id,
            attempt=job.attempt,
            src_seq=event.seq,
            ts=event.ts,
            seq=job.worker_groups_stored,
            world_size=event.world_size,
            nodes=[n.model_dump() for n in event.nodes],
            trial_id=trial_id,
        )
    )
    b.stored_now(WorkerGroupRow, event.seq)
    job.worker_groups_stored += 1


def _log_resize(b: Batch, world_size: int) -> None:
    """A worker group of another size than the attempt's last one: ``resized``."""
    s, job = b.s, b.job
    last = s.scalar(
        select(WorkerGroupRow.world_size)
        .where(WorkerGroupRow.job_id == job.id, WorkerGroupRow.attempt == job.attempt)
        .order_by(WorkerGroupRow.seq.desc())
        .limit(1)
    )
    if last is not None and last != world_size and job_may_log(job, b.limits.max_log_events_per_job):
        record(s, "resized", job_id=job.id, attempt=job.attempt, **{"from": last, "to": world_size})
