"""Writing and reading the event log. ``record`` adds an event to the caller's session,
so it commits with the change it records or not at all (an outbox): a status change and
its event are one transaction. Readers page by the event id, which only grows.

Bounds: an event's ``data`` is cut to ``MAX_DATA_CHARS`` of JSON (long strings first); the
events a job's own driver causes (checkpoints, restarts, resizes) are capped per job by
the caller on the job row's ``log_events`` (``job_may_log``); and ``trim`` deletes what is
older than the retention (called by the retention sweep)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from api.schemas.eventlog import EVENT_TYPES, EventList, EventPublic
from service.db.eventlog_models import DeliveryRow, EventLogRow, WebhookRow
from service.db.models import JobRow, utcnow

SYSTEM = "system"  # the server itself: the monitor, admission, retention
MAX_DATA_CHARS = 4096
MAX_STRING_CHARS = 1000
MAX_ACTOR_CHARS = 128
TRIM_BATCH = 5000


def record(session: Session, type: str, *, job_id: str | None = None, actor: str = SYSTEM, **data: Any) -> EventLogRow:
    """Add one event to ``session``'s transaction."""
    if type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {type!r}")
    row = EventLogRow(at=utcnow(), job_id=job_id, type=type, actor=actor[:MAX_ACTOR_CHARS], data=bounded(data))
    session.add(row)
    return row


def bounded(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with None values left out and long strings cut, so one event's JSON stays
    under MAX_DATA_CHARS whatever a reason or a path holds."""
    out = {k: (v[:MAX_STRING_CHARS] if isinstance(v, str) else v) for k, v in data.items() if v is not None}
    if len(json.dumps(out, default=str)) <= MAX_DATA_CHARS:
        return out
    small = {k: v for k, v in out.items() if isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) < 200)}
    return {**small, "truncated": True}


def job_may_log(job: JobRow, cap: int) -> bool:
    """Whether a job (read for update) may log one more event its driver caused; counts it."""
    job.log_events = (job.log_events or 0) + 1
    return job.log_events <= cap


def public(row: EventLogRow) -> EventPublic:
    return EventPublic(id=row.id, type=row.type, at=row.at, job_id=row.job_id, actor=row.actor, data=row.data or {})


def page(
    session: Session,
    *,
    job_id: str | None = None,
    type: str | None = None,
    since: int = 0,
    limit: int = 100,
    projects: list[str] | None = None,
) -> EventList:
    """Events with id > ``since``, oldest first; ``next`` is the cursor of the next page.
    ``projects``: only events of jobs (still stored) in those projects; None: every event."""
    q = select(EventLogRow).where(EventLogRow.id > since)
    if projects is not None:
        q = q.where(EventLogRow.job_id.in_(select(JobRow.id).where(JobRow.project.in_(projects))))
    if job_id is not None:
        q = q.where(EventLogRow.job_id == job_id)
    if type is not None:
        q = q.where(EventLogRow.type == type)
    rows = list(session.scalars(q.order_by(EventLogRow.id).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return EventList(items=[public(r) for r in rows], next=rows[-1].id if more else None)


def trim(session: Session, days: float) -> int:
    """Delete a batch of events older than ``days``, their deliveries, and the webhooks
    of jobs that are gone and were made before then. Returns the events deleted."""
    cutoff = utcnow() - timedelta(days=days)
    ids = list(session.scalars(select(EventLogRow.id).where(EventLogRow.at < cutoff).limit(TRIM_BATCH)))
    if ids:
        session.execute(delete(DeliveryRow).where(DeliveryRow.event_id.in_(ids)))
        session.execute(delete(EventLogRow).where(EventLogRow.id.in_(ids)))
    session.execute(delete(DeliveryRow).where(DeliveryRow.created_at < cutoff))
    gone = select(JobRow.id).where(JobRow.id == WebhookRow.job_id).exists()
    session.execute(delete(WebhookRow).where(WebhookRow.created_at < cutoff, ~gone))
    return len(ids)
