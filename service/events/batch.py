"""How a batch of events becomes rows: what one transaction knows (the keys already
stored, read once per table; the trial rows it read or made; the metric rows to insert
together), and the rows of metric reports, trials and trial reports, each within the
job's bounds (``service/events/limits.py``)."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from api.schemas import JobStatus, TuneSpec
from api.schemas.events import ExploitEvent, MetricEvent, TrialMetricEvent, WorkerGroupEvent
from api.schemas.trials import better, metric_value
from service import lifecycle
from service.db.event_models import ExploitRow, MetricRow, TrialMetricRow, TrialRow, WorkerGroupRow
from service.db.models import EventKey, JobRow
from service.events import limits, phases, rollups
from service.events.limits import room
from service.settings.events import EventSettings
from service.stored.specs import stored_search

KEY_BATCH = 500  # event keys looked up per query
# Where each keyed event is stored (its (attempt, src_seq) once).
KEYED: dict[type, type[EventKey]] = {
    MetricEvent: MetricRow,
    TrialMetricEvent: TrialMetricRow,
    WorkerGroupEvent: WorkerGroupRow,
    ExploitEvent: ExploitRow,
}


class Batch:
    """What one transaction of events knows: the keys already stored (read once per
    table, for the seqs the batch holds) and the metric rows to insert together."""

    def __init__(self, s: Session, job: JobRow, events: list[Any], limits: EventSettings):
        self.s, self.job, self.limits = s, job, limits
        self.wanted: defaultdict[type[EventKey], set[int]] = defaultdict(set)
        for e in events:
            if (table := KEYED.get(type(e))) is not None:
                self.wanted[table].add(e.seq)
        self.stored: dict[type[EventKey], set[int]] = {}
        self.trials: dict[str, TrialRow] = {}  # trial rows this batch read or made
        self.metrics: list[dict[str, Any]] = []
        self._search: TuneSpec | None = None

    @property
    def search(self) -> TuneSpec:
        """The job's spec as a search, read once per batch."""
        if self._search is None:
            self._search = stored_search(self.job.spec)
        return self._search

    def seen(self, table: type[EventKey], seq: int) -> bool:
        if table not in self.stored:
            wanted, found = sorted(self.wanted[table]), set()
            for i in range(0, len(wanted), KEY_BATCH):
                part = wanted[i : i + KEY_BATCH]
                # The range too: PostgreSQL, its statistics not yet updated after a fast
                # insert, may read the list as a filter over the attempt's every key.
                q = select(table.src_seq).where(
                    table.job_id == self.job.id,
                    table.attempt == self.job.attempt,
                    table.src_seq.between(part[0], part[-1]),
                    table.src_seq.in_(part),
                )
                found.update(self.s.scalars(q))
            self.stored[table] = found
        return seq in self.stored[table]

    def stored_now(self, table: type[EventKey], seq: int) -> None:
        self.stored.setdefault(table, set()).add(seq)

    def flush(self) -> None:
        if self.metrics:
            self.s.execute(insert(MetricRow), self.metrics)
            rollups.add(self.s, self.job.id, self.metrics)  # the blocks a downsampled series reads
            self.metrics = []


def metric(s: Session, job: JobRow, event: MetricEvent, push: bool, batch: Batch) -> None:
    if batch.seen(MetricRow, event.seq):
        return
    if job.attempt_metrics_of != job.attempt:
        job.attempt_metrics_of, job.attempt_metrics = job.attempt, 0
    if push and event.seq != job.attempt_metrics:
        # The fast channel only extends an unbroken series; after a gap (the API was
        # down) the log brings the missing reports in order, so seq follows src_seq.
        return
    room(batch.limits, job, "metrics")
    m = event.metrics
    batch.metrics.append(
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
    batch.stored_now(MetricRow, event.seq)
    if job.attempt_metrics == 0:
        phases.first_metric(job)
    job.metrics_stored += 1
    job.attempt_metrics += 1
    job.latest_metrics = m
    if job.status == JobStatus.STARTING.value:
        lifecycle.transition(s, job, JobStatus.RUNNING, reason="training")


def trial_row(s: Session, job: JobRow, trial_id: str, batch: Batch) -> TrialRow:
    """The trial's row (made on its first event), looked up once per batch."""
    row = batch.trials.get(trial_id)
    if row is None:
        row = s.scalar(select(TrialRow).where(TrialRow.job_id == job.id, TrialRow.trial_id == trial_id))
    if row is None:
        room(batch.limits, job, "trials")
        row = TrialRow(
            job_id=job.id,
            trial_id=trial_id,
            status="PENDING",
            config={},
            reports=0,
            exploits=0,
            event_attempt=0,
            event_seq=-1,
        )
        s.add(row)
        s.flush()
        limits.stored(job, "trials")
    batch.trials[trial_id] = row
    return row


def trial_metric(s: Session, job: JobRow, event: TrialMetricEvent, batch: Batch) -> None:
    if batch.seen(TrialMetricRow, event.seq):
        return
    room(batch.limits, job, "trial_reports")
    row = trial_row(s, job, event.trial_id, batch)
    batch.stored_now(TrialMetricRow, event.seq)
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
    if row.reports == 0 and row.started_ts is not None:
        row.first_metric_s = round(max(time.time() - row.started_ts, 0.0), 3)
    phases.first_metric(job)  # a no-op after the attempt's first report (a dict lookup)
    row.reports += 1
    row.last_metrics = m
    search = batch.search
    row.last_time = metric_value(m.get(search.unit))
    value = metric_value(m.get(search.metric))
    if value is not None and (row.best_metric is None or better(value, row.best_metric, search.mode)):
        row.best_metric = value
        row.best_attempt, row.best_seq = job.attempt, event.seq  # the report GET /best answers with


def as_int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    i = int(v)
    return i if -(2**63) <= i < 2**63 else None
