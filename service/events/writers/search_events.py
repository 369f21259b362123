"""The writers of a search's events (``kind: tune`` jobs alone): its trials' reports and
statuses, PBT's exploits and the search's best trial. A trial's row is made on its first
event, within the job's bounds (``service/events/limits.py``)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import select

from api.schemas import TrialStatus
from api.schemas.events import BestTrialEvent, ExploitEvent, TrialEvent, TrialMetricEvent
from api.schemas.trials import better, metric_value
from service.db.event_models import ExploitRow, SearchResultRow, TrialMetricRow, TrialRow
from service.events import limits, phases, trial_phases
from service.events.limits import Dropped, room
from service.events.writers.batch import Batch, as_int

E = TypeVar("E")


def search_event(write: Callable[[Batch, E], None]) -> Callable[[Batch, E], None]:
    """A writer of an event only a search sends: from a job of another kind it is dropped."""

    @functools.wraps(write)
    def checked(b: Batch, event: Any) -> None:
        if b.job.kind != "tune":
            raise Dropped(f"a {b.job.kind} job sent a search event ({event.type})")
        write(b, event)

    return checked


def trial_row(b: Batch, trial_id: str) -> TrialRow:
    """The trial's row (made on its first event), looked up once per batch."""
    s, job = b.s, b.job
    row = b.trials.get(trial_id)
    if row is None:
        row = s.scalar(select(TrialRow).where(TrialRow.job_id == job.id, TrialRow.trial_id == trial_id))
    if row is None:
        room(b.limits, job, "trials")
        row = TrialRow(
            job_id=job.id,
            trial_id=trial_id,
            status=TrialStatus.PENDING.value,
            config={},
            reports=0,
            exploits=0,
            event_attempt=0,
            event_seq=-1,
        )
        s.add(row)
        s.flush()
        limits.stored(job, "trials")
    b.trials[trial_id] = row
    return row


@search_event
def trial_metric(b: Batch, event: TrialMetricEvent) -> None:
    s, job = b.s, b.job
    if b.seen(TrialMetricRow, event.seq):
        return
    room(b.limits, job, "trial_reports")
    row = trial_row(b, event.trial_id)
    b.stored_now(TrialMetricRow, event.seq)
    limits.stored(job, "trial_reports")
    m = event.metrics
    s.add(
        TrialMetricRow(
            job_id=job.id,
            attempt=job.attempt,
            src_seq=event.seq,
            trial_id=event.trial_id,
            ts=event.ts,
            epoch=as_int(m.get("epoch")),
            step=as_int(m.get("step")),
            values=m,
            config=event.config,
        )
    )
    trial_phases.note(row, "first_metric", event.ts)
    if row.reports == 0 and row.started_ts is not None:
        row.first_metric_s = round(max(time.time() - row.started_ts, 0.0), 3)
    phases.first_metric(job)  # a no-op after the attempt's first report (a dict lookup)
    row.reports += 1
    row.last_metrics = m
    search = b.search
    row.last_time = metric_value(m.get(search.unit))
    value = metric_value(m.get(search.metric))
    if value is not None and (row.best_metric is None or better(value, row.best_metric, search.mode)):
        row.best_metric = value
        row.best_attempt, row.best_seq = job.attempt, event.seq  # the report GET /best answers with


@search_event
def trial(b: Batch, event: TrialEvent) -> None:
    job = b.job
    row = trial_row(b, event.trial_id)
    trial_phases.status(row, event.status, event.ts)  # by its time: a late status still marks its phase
    if (job.attempt, event.seq) <= (row.event_attempt, row.event_seq):
        return  # a late, older status must not roll the trial back
    row.event_attempt, row.event_seq = job.attempt, event.seq
    if event.status == TrialStatus.RUNNING.value and row.started_ts is None:
        row.started_ts = event.ts  # its start-up counts from here (first_metric_s)
    row.status, row.config = event.status, event.config or row.config
    if event.error:
        row.error = event.error
    if event.note:
        row.note = event.note


@search_event
def exploit(b: Batch, event: ExploitEvent) -> None:
    s, job = b.s, b.job
    b.own_path(event.checkpoint_path)
    if b.seen(ExploitRow, event.seq):
        return
    room(b.limits, job, "exploits")
    row = trial_row(b, event.trial_id)
    b.stored_now(ExploitRow, event.seq)
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
    row.exploits += 1
    trial_phases.exploited(row, event.ts)


def trial_mark(b: Batch, trial_id: str, mark: str, ts: float) -> None:
    """A phase of a search trial that its Train run marked (its worker group placed, its
    first step); from a job of another kind the trial is ignored."""
    if b.job.kind == "tune":
        trial_phases.note(trial_row(b, trial_id), mark, ts)


@search_event
def best_trial(b: Batch, event: BestTrialEvent) -> None:
    s, job = b.s, b.job
    b.own_path(event.checkpoint_path)
    row = s.get(SearchResultRow, job.id) or SearchResultRow(job_id=job.id)
    row.attempt, row.trial_id, row.value = job.attempt, event.trial_id, event.value
    row.config, row.values, row.checkpoint_path = event.config, event.metrics, event.checkpoint_path
    s.add(row)
    job.latest_metrics = {**event.metrics, "trial_id": event.trial_id}
