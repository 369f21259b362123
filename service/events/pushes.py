"""The pushes service: the events-in path of the HTTP channel, from a post's check to its
storage. A post must carry the events token of the job's current attempt and name that
attempt's Ray submission id (``check``); it is then admitted one at a time per job (the
gate of ``push.py``) and stored a bounded number of events per transaction by ingestion
(``ingest.py``). Built by the composition root (``service/runtime.py``); the events route
calls it and nothing of the job core."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from api.errors import Conflict, Unauthorized
from api.schemas.events import SUBMISSION_HEADER
from service.db.models import JobRow
from service.events.ingest import Ingest
from service.events.push import PushGate, check_search_batch, chunks
from service.events.tokens import token_matches


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
