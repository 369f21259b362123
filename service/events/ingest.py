"""What running jobs report, taken in: one ``match`` over the typed events of
``api.schemas.events``, from either channel (the ``RAYDOCK_EVENT`` log lines the monitor
reads, and the HTTP push).

Events are data, not trust. Each is validated (``parse_event``); one that does not
validate, names a path outside the job's own storage prefix, or does not belong to the
job's kind is dropped and counted on the job (``dropped_events``, ``last_dropped_reason``),
never raised. Events of a job that is not running (ended, or queued for its next
attempt) are ignored: a push carries the token of the attempt that sent it and names its
Ray submission id, and a new attempt gets a new token (``service/events/tokens.py``). Every stored event is keyed by ``(job, attempt, src_seq)``
and stored once.

Both channels hand over many events at once (a log read, a pushed batch), taken in one
transaction: the keys a batch already has are read with one indexed query per table,
sequence numbers come from per-job counters on the job row (never from counting a
series), and new metric rows are inserted together, with the rollup blocks they fall in
(``service/events/rollups.py``), so the cost of an event does not grow with the length of its
job's series.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import DataError
from sqlalchemy.orm import Session, sessionmaker

import service.telemetry.instruments as instruments
from api.schemas import FailureCause, JobStatus
from api.schemas.events import (
    MARKER,
    BestTrialEvent,
    CheckpointEvent,
    ErrorEvent,
    ExploitEvent,
    MetricEvent,
    PhaseEvent,
    ResultEvent,
    StartedEvent,
    TrialEvent,
    TrialMetricEvent,
    WorkerFailureEvent,
    WorkerGroupEvent,
    parse_event,
)
from service import lifecycle
from service.db.event_models import CheckpointRow, ExploitRow, SearchResultRow, WorkerGroupRow
from service.db.models import JobRow, count
from service.eventlog.log import job_may_log, record
from service.events import limits, logs, phases
from service.events.batch import Batch, as_int, metric, trial_metric, trial_row
from service.events.limits import Dropped, EventLimits, room
from service.files import storage

RECEIVING = (
    JobStatus.STARTING.value,
    JobStatus.RUNNING.value,
    JobStatus.CANCELLING.value,
    JobStatus.PREEMPTED.value,
)
MAX_LINE = 1 << 20  # an event line longer than this is dropped unread
MAX_REASON = 300


def parse_log_events(text: str) -> list[Any]:
    """The raw events in log text: whatever follows the marker on each line, decoded
    (undecodable ones as the text itself, so they are counted as dropped)."""
    out: list[Any] = []
    for line in text.splitlines():
        at = line.find(MARKER)
        if at < 0:
            continue
        body = line[at + len(MARKER) :].strip()
        if len(body) > MAX_LINE:
            out.append(f"<event line of {len(body)} characters>")
            continue
        try:
            out.append(json.loads(body))
        except (json.JSONDecodeError, RecursionError):
            out.append(body[:MAX_REASON])
    return out


def parse_all(raws: list[Any]) -> tuple[list[Any], list[Exception]]:
    """The events that validate, and why each of the others does not."""
    parsed: list[Any] = []
    refused: list[Exception] = []
    for raw in raws:
        try:
            parsed.append(parse_event(raw))
        except (ValidationError, ValueError, TypeError, RecursionError) as exc:
            refused.append(exc)
    return parsed, refused


class Ingest:
    """Takes events and log text into the store. One lock per job keeps a job's two
    channels from interleaving; jobs never wait on each other."""

    def __init__(
        self,
        sessions: sessionmaker,
        storage_path: str,
        max_log_bytes: int = 64 << 20,
        limits: EventLimits | None = None,
    ):
        self.sessions = sessions
        self.limits = limits or EventLimits()
        self.storage_path = storage_path
        self.max_log_bytes = max_log_bytes
        self._locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)

    def log(self, job_id: str, text: str, at: int, *, final: bool = False) -> int:
        """Take the current attempt's log text that starts at character ``at``, up to its
        last full line (all of it when ``final``: the attempt ended). Returns how many
        characters were taken: 0 when ``at`` is not where the stored log of this attempt
        ends (the caller reads again from there)."""
        end = len(text) if final else text.rfind("\n") + 1
        if end <= 0:
            return 0
        text = text[:end]
        return end if self.take(job_id, parse_log_events(text), log_text=text, log_at=at) else 0

    def take(
        self,
        job_id: str,
        raws: list[Any],
        *,
        log_text: str | None = None,
        log_at: int | None = None,
        push: bool = False,
        attempt_of: str | None = None,
    ) -> bool:
        """Store events once each, and optionally log text of the current attempt that
        starts at ``log_at``, in one transaction. Never raises for what an event holds.
        Pushed events of an attempt (``attempt_of``: its Ray submission id) that is not
        the job's current one are ignored.
        False when nothing was taken (no such job, or the log text is not the next)."""
        parsed, refused = parse_all(raws)  # before the transaction: it holds the write lock
        try:
            return self._take(job_id, parsed, refused, log_text, log_at, push, attempt_of)
        except DataError:
            # A value the database refuses that the contract let through: the events are
            # stored one per transaction, and one the database refuses is dropped.
            for event in parsed:
                try:
                    self._take(job_id, [event], [], None, None, push, attempt_of)
                except DataError as exc:
                    why = str(getattr(exc, "orig", exc)).splitlines()[0]
                    self._take(job_id, [], [Dropped(f"the store refused a {event.type} event: {why}")], None, None)
            return self._take(job_id, [], refused, log_text, log_at, push, attempt_of)

    def _take(self, job_id, parsed, refused, log_text, log_at, push=False, attempt_of=None) -> bool:
        taken = dropped = 0
        with self._locks[job_id], self.sessions.begin() as s:
            job = s.get(JobRow, job_id, with_for_update=True)
            if job is None or (log_at is not None and log_at != job.log_offset):
                return False
            if job.status in RECEIVING and (attempt_of is None or attempt_of == job.ray_job_id):
                for exc in refused:
                    self._drop(job, exc)
                dropped = len(refused)
                batch = Batch(s, job, parsed, self.limits)
                for event in parsed:
                    try:
                        # Every check of an event comes before its first write: a refused
                        # event leaves nothing behind.
                        self._apply(s, job, event, push, batch)
                        taken += 1
                    except (ValidationError, Dropped, ValueError, TypeError, OverflowError) as exc:
                        self._drop(job, exc)
                        dropped += 1
                batch.flush()
            if log_text is not None and log_at is not None:
                logs.append(s, job, log_text, self.max_log_bytes)
                job.log_offset = log_at + len(log_text)
        instruments.events("push" if push else "log", taken, dropped)  # once committed
        return True

    @staticmethod
    def _drop(job: JobRow, exc: Exception) -> None:
        job.dropped_events = (job.dropped_events or 0) + 1
        job.last_dropped_reason = _reason(exc)

    # ------------------------------------------------------------------ one event

    def _own_path(self, job: JobRow, path: str | None, whole: bool = False) -> str | None:
        if path is not None and not storage.owned(path, storage.job_prefix(self.storage_path, job.id), whole=whole):
            raise Dropped(f"path {path[:200]!r} is outside the job's storage prefix (or in its {storage.LAUNCH_DIR}/)")
        return path

    def _apply(self, s: Session, job: JobRow, event: Any, push: bool, batch: Batch) -> None:
        match event:
            case StartedEvent():
                if job.status == JobStatus.STARTING.value:
                    lifecycle.transition(s, job, JobStatus.RUNNING, reason="driver started")
            case MetricEvent():
                metric(s, job, event, push, batch)
            case PhaseEvent():
                phases.take(job, event)
            case CheckpointEvent():
                path = self._own_path(job, event.path)
                if count(s, CheckpointRow, CheckpointRow.job_id == job.id, CheckpointRow.path == path):
                    return
                room(self.limits, job, "checkpoints")
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
                if job_may_log(job, self.limits.log_events):
                    step, epoch = as_int(m.get("step")), as_int(m.get("epoch"))
                    record(s, "checkpointed", job_id=job.id, attempt=job.attempt, path=path, step=step, epoch=epoch)
            case WorkerFailureEvent():
                limits.add_restart(job, job.attempt, event.ts, event.reason, self.limits.restarts_kept)
                instruments.worker_restarted()
                if job_may_log(job, self.limits.log_events):
                    record(s, "retried", job_id=job.id, attempt=job.attempt, reason=event.reason)
            case ErrorEvent():
                # Recorded now; the status follows when Ray reports the driver's exit.
                lifecycle.record_cause(job, FailureCause(event.cause), f"{event.message}\n\n{event.traceback}".strip())
            case ResultEvent():
                self._own_path(job, event.path, whole=True)  # a run's directory is the job's prefix
                if event.metrics and not job.latest_metrics:
                    job.latest_metrics = event.metrics
            case WorkerGroupEvent():
                if batch.seen(WorkerGroupRow, event.seq):
                    return
                room(self.limits, job, "worker_groups")
                self._log_resize(s, job, event.world_size)  # before the new row: it compares with the last
                s.add(
                    WorkerGroupRow(
                        job_id=job.id,
                        attempt=job.attempt,
                        src_seq=event.seq,
                        ts=event.ts,
                        seq=job.worker_groups_stored,
                        world_size=event.world_size,
                        nodes=[n.model_dump() for n in event.nodes],
                    )
                )
                batch.stored_now(WorkerGroupRow, event.seq)
                job.worker_groups_stored += 1
            case TrialMetricEvent() | TrialEvent() | ExploitEvent() | BestTrialEvent() if job.kind != "tune":
                raise Dropped(f"a {job.kind} job sent a search event ({event.type})")
            case TrialMetricEvent():
                trial_metric(s, job, event, batch)
            case TrialEvent():
                row = trial_row(s, job, event.trial_id, batch)
                if (job.attempt, event.seq) <= (row.event_attempt, row.event_seq):
                    return  # a late, older status must not roll the trial back
                row.event_attempt, row.event_seq = job.attempt, event.seq
                if event.status == "RUNNING" and row.started_ts is None:
                    row.started_ts = event.ts  # its start-up counts from here (first_metric_s)
                row.status, row.config = event.status, event.config or row.config
                if event.error:
                    row.error = event.error
                if event.note:
                    row.note = event.note
            case ExploitEvent():
                self._own_path(job, event.checkpoint_path)
                if batch.seen(ExploitRow, event.seq):
                    return
                room(self.limits, job, "exploits")
                trial = trial_row(s, job, event.trial_id, batch)
                batch.stored_now(ExploitRow, event.seq)
                limits.stored(job, "exploits")
                s.add(
                    ExploitRow(
                        job_id=job.id,
                        attempt=job.attempt,
                        src_seq=event.seq,
                        ts=event.ts,
                        trial_id=event.trial_id,
                        donor_trial_id=event.donor_trial_id,
                        donor_time=event.donor_time,
                        trial_time=event.trial_time,
                        donor_metric=event.donor_metric,
                        old_config=event.old_config,
                        donor_config=event.donor_config,
                        new_config=event.new_config,
                        checkpoint_path=event.checkpoint_path,
                    )
                )
                trial.exploits += 1
            case BestTrialEvent():
                self._own_path(job, event.checkpoint_path)
                row = s.get(SearchResultRow, job.id) or SearchResultRow(job_id=job.id)
                row.attempt, row.trial_id, row.value = job.attempt, event.trial_id, event.value
                row.config, row.values, row.checkpoint_path = event.config, event.metrics, event.checkpoint_path
                s.add(row)
                job.latest_metrics = {**event.metrics, "trial_id": event.trial_id}

    def _log_resize(self, s: Session, job: JobRow, world_size: int) -> None:
        """A worker group of another size than the attempt's last one: ``resized``."""
        last = s.scalar(
            select(WorkerGroupRow.world_size)
            .where(WorkerGroupRow.job_id == job.id, WorkerGroupRow.attempt == job.attempt)
            .order_by(WorkerGroupRow.seq.desc())
            .limit(1)
        )
        if last is not None and last != world_size and job_may_log(job, self.limits.log_events):
            record(s, "resized", job_id=job.id, attempt=job.attempt, **{"from": last, "to": world_size})


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        errs = exc.errors(include_url=False, include_input=False)
        first = errs[0] if errs else {}
        loc = ".".join(str(p) for p in first.get("loc", ()))
        text = f"invalid event: {loc}: {first.get('msg', '')}" + (f" (+{len(errs) - 1} more)" if len(errs) > 1 else "")
    else:
        text = str(exc) or type(exc).__name__
    return text[:MAX_REASON]
