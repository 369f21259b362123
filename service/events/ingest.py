"""What running jobs report, taken in: the typed events of ``api.schemas.events``, from
either channel (the ``RAYDOCK_EVENT`` log lines the monitor reads, and the HTTP push),
each stored by its type's writer (``service/events/writers/``, one per event type).

Events are data, not trust. Each is validated (``parse_event``); one that does not
validate, names a path outside the job's own storage prefix, or does not belong to the
job's kind is dropped and counted on the job (``dropped_events``, ``last_dropped_reason``),
never raised. Events of a job that is not running (ended, or queued for its next
attempt) are ignored: a push carries the token of the attempt that sent it and names its
Ray submission id, and a new attempt gets a new token (``service/events/tokens.py``).
Every stored event is keyed by ``(job, attempt, src_seq)`` and stored once.

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
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import DataError
from sqlalchemy.orm import sessionmaker

import service.telemetry.instruments as instruments
from api.schemas import JobStatus
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
from service.db.models import JobRow
from service.events import logs
from service.events.limits import Dropped
from service.events.writers import job_events, search_events
from service.events.writers.batch import Batch
from service.settings.events import EventSettings

RECEIVING = (
    JobStatus.STARTING.value,
    JobStatus.RUNNING.value,
    JobStatus.CANCELLING.value,
    JobStatus.PREEMPTED.value,
)
MAX_LINE = 1 << 20  # an event line longer than this is dropped unread
MAX_REASON = 300

Writer = Callable[[Batch, Any], None]
# Who stores each event type (service/events/writers/): a writer checks its event before
# its first write, so one it refuses (Dropped, or a value out of bounds) leaves nothing.
WRITERS: dict[type, Writer] = {
    StartedEvent: job_events.started,
    MetricEvent: job_events.metric,
    PhaseEvent: job_events.phase,
    CheckpointEvent: job_events.checkpoint,
    WorkerFailureEvent: job_events.worker_failure,
    ErrorEvent: job_events.error,
    ResultEvent: job_events.result,
    WorkerGroupEvent: job_events.worker_group,
    TrialMetricEvent: search_events.trial_metric,
    TrialEvent: search_events.trial,
    ExploitEvent: search_events.exploit,
    BestTrialEvent: search_events.best_trial,
}


_decoder = json.JSONDecoder()


def parse_log_events(text: str) -> list[Any]:
    """The raw events in log text: the JSON value after each marker, decoded (undecodable
    ones as the text itself, so they are counted as dropped). A line may hold more than
    one: a driver's threads write to one stream (its own events, and the workers' lines
    Ray forwards, each ``print`` two writes), so one line can end where another begins,
    ``(RayTrainWorker pid=1) RAYDOCK_EVENT {...}RAYDOCK_EVENT {...}``. What follows a
    value up to the next marker is not the event's (Ray's ``[repeated 2x across cluster]``)."""
    out: list[Any] = []
    for line in text.splitlines():
        at = line.find(MARKER)
        if at >= 0 and len(line) - at > MAX_LINE:
            out.append(f"<event line of {len(line) - at} characters>")
            continue
        while at >= 0:
            start = at + len(MARKER)
            while start < len(line) and line[start].isspace():
                start += 1
            try:
                value, end = _decoder.raw_decode(line, start)
            except (json.JSONDecodeError, RecursionError):
                nxt = line.find(MARKER, start)
                out.append(line[start : nxt if nxt >= 0 else len(line)].strip()[:MAX_REASON])
                at = nxt
                continue
            out.append(value)
            at = line.find(MARKER, end)  # a marker inside the value is the value's text
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
        limits: EventSettings | None = None,
    ):
        self.sessions = sessions
        self.limits = limits or EventSettings()
        self.storage_path = storage_path
        self.max_log_bytes = self.limits.max_log_bytes
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
                batch = Batch(s, job, parsed, self.limits, push=push, storage_path=self.storage_path)
                for event in parsed:
                    try:
                        WRITERS[type(event)](batch, event)
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


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        errs = exc.errors(include_url=False, include_input=False)
        first = errs[0] if errs else {}
        loc = ".".join(str(p) for p in first.get("loc", ()))
        text = f"invalid event: {loc}: {first.get('msg', '')}" + (f" (+{len(errs) - 1} more)" if len(errs) > 1 else "")
    else:
        text = str(exc) or type(exc).__name__
    return text[:MAX_REASON]
