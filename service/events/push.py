"""The pushes service: what an events post goes through before ingestion stores it. The
post must carry the events token of the job's current attempt and name that attempt's Ray
submission id (``Pushes.check``); one post is in flight per job (a second one, sent while
the first is being stored, is turned away with 429 and a ``Retry-After``: the pusher
retries it, and the log carries every event anyway); one post carries a bounded number of
search events; and it is stored in transactions of a bounded number of events, letting
other writers (a submit, the monitor) in between (ingestion validates every event before
the write transaction opens, so the write lock is held only for writing). Built by the
composition root (``service/runtime.py``); the events route calls it and nothing of the
job core."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from api.errors import Busy, Conflict, RaydockError, Unauthorized
from api.schemas.events import SUBMISSION_HEADER
from service.db.models import JobRow
from service.events.ingest import Ingest
from service.events.tokens import token_matches

SEARCH_TYPES = frozenset({"trial_metric", "trial", "exploit", "best_trial"})
RETRY_AFTER_S = 1


class PushBusy(Busy):
    """Another post of this job's events is being stored."""

    status, code = 429, "events_push_in_flight"
    retry_after_s = RETRY_AFTER_S


class BatchTooLarge(RaydockError):
    status, code = 413, "event_batch_too_large"


class PushGate:
    """At most one post of a job's events in flight; jobs never wait on each other."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()

    @contextlib.contextmanager
    def admit(self, job_id: str) -> Iterator[None]:
        with self._lock:
            if job_id in self._in_flight:
                raise PushBusy(
                    f"Job {job_id} has a post of events being stored; send one post at a time "
                    f"(retry after {RETRY_AFTER_S} s, as the Retry-After header says).",
                )
            self._in_flight.add(job_id)
        try:
            yield
        finally:
            with self._lock:
                self._in_flight.discard(job_id)


def check_search_batch(events: list[Any], max_search_events: int) -> None:
    """Refuse a post with more search events than one post may carry (each is a few
    writes: its trial, its report); the pusher sends far fewer per post."""
    n = sum(1 for e in events if isinstance(e, dict) and e.get("type") in SEARCH_TYPES)
    if n > max_search_events:
        raise BatchTooLarge(
            f"This post carries {n} search events; one post may carry at most {max_search_events} "
            "(RAYDOCK_MAX_SEARCH_EVENTS_PER_PUSH). Send them in smaller posts.",
        )


def chunks(events: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(events), size):
        yield events[i : i + size]


class Pushes:
    """``max_search_events``: the search events one post may carry; ``events_per_transaction``:
    how many of a post's events are stored per transaction."""

    def __init__(
        self, sessions: sessionmaker, ingest: Ingest, *, max_search_events: int, events_per_transaction: int
    ) -> None:
        self.sessions = sessions
        self.ingest = ingest
        self.max_search_events = max_search_events
        self.events_per_transaction = events_per_transaction
        self.gate = PushGate()  # one post of a job's events in flight

    def check(self, job_id: str, token: str | None, submission_id: str | None) -> None:
        """An events post must carry the events token of the job's current attempt
        (401 otherwise) and name that attempt's Ray submission id (409 otherwise): one
        read of the job's row for both."""
        with self.sessions() as s:
            q = select(JobRow.events_token_hash, JobRow.ray_job_id, JobRow.submission_id).where(JobRow.id == job_id)
            row = s.execute(q).first()
        if row is None or not token_matches(row.events_token_hash, token):
            raise Unauthorized("unknown job or wrong events token")
        if not submission_id or submission_id not in (row.ray_job_id, row.submission_id):
            raise Conflict(
                f"This post names {'no' if not submission_id else 'another'} attempt of job {job_id}; events are "
                f"taken only from its current attempt, named by the {SUBMISSION_HEADER} header (its Ray submission id).",
                code="not_current_attempt",
            )

    def take(self, job_id: str, events: list[Any], submission_id: str | None = None) -> None:
        """A post of the attempt ``submission_id``: admitted one at a time per job, its
        events stored a bounded number per transaction."""
        check_search_batch(events, self.max_search_events)
        with self.gate.admit(job_id):
            for part in chunks(events, self.events_per_transaction):
                self.ingest.take(job_id, part, push=True, attempt_of=submission_id)
