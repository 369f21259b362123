"""What one transaction of events knows, shared by the writers of one batch: the job and
its bounds, which channel brought the events, the keys already stored (read once per
table, for the seqs the batch holds), the trial rows it read or made, and the metric rows
to insert together (with the rollup blocks they fall in, ``service/events/rollups.py``)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from api.schemas import TuneSpec
from api.schemas.events import ExploitEvent, MetricEvent, TrialMetricEvent, WorkerGroupEvent
from service.db.event_models import ExploitRow, MetricRow, TrialMetricRow, TrialRow, WorkerGroupRow
from service.db.models import EventKey, JobRow
from service.events import rollups
from service.events.limits import Dropped
from service.files import storage
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

    def __init__(
        self,
        s: Session,
        job: JobRow,
        events: list[Any],
        limits: EventSettings,
        *,
        push: bool,
        storage_path: str,
    ):
        self.s, self.job, self.limits = s, job, limits
        self.push = push  # the fast channel (HTTP), not the log
        self.storage_path = storage_path
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

    def own_path(self, path: str | None, whole: bool = False) -> str | None:
        """``path`` when it lies in the job's storage prefix; raises ``Dropped`` otherwise."""
        if path is not None and not storage.owned(
            path, storage.job_prefix(self.storage_path, self.job.id), whole=whole
        ):
            raise Dropped(f"path {path[:200]!r} is outside the job's storage prefix (or in its {storage.LAUNCH_DIR}/)")
        return path

    def flush(self) -> None:
        if self.metrics:
            self.s.execute(insert(MetricRow), self.metrics)
            rollups.add(self.s, self.job.id, self.metrics)  # the blocks a downsampled series reads
            self.metrics = []


def as_int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    i = int(v)
    return i if -(2**63) <= i < 2**63 else None
