"""Listing jobs, newest first, in SQL: status and label filters on indexes, and keyset
pages. A page's ``next`` cursor names the last job it holds (its ``created_at`` and id),
and the next page starts right after it, so paging stays complete and stable while jobs
are added (new jobs sort before the cursor) and costs the same at any depth."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime, timezone

from sqlalchemy import Select, exists, func, select, tuple_
from sqlalchemy.orm import Session, aliased

from api.errors import InvalidSpec
from api.schemas import JobStatus
from service.db.models import JobLabelRow, JobRow, aware

MAX_CURSOR_CHARS = 200


def encode_cursor(created_at: datetime, job_id: str) -> str:
    raw = json.dumps([aware(created_at).isoformat(), job_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (created_at, id) a cursor names; a cursor this server did not hand out is a 422."""
    bad = InvalidSpec(
        "The cursor is not one this server handed out. Pass the `next` value of the previous page as it was, "
        "or leave `cursor` out to start from the newest job.",
        code="invalid_cursor",
        details=[{"loc": "query.cursor", "msg": "invalid cursor"}],
    )
    if len(cursor) > MAX_CURSOR_CHARS:
        raise bad
    try:
        at, job_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        created_at = datetime.fromisoformat(at)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise bad from None
    if not isinstance(job_id, str) or len(job_id) > 32:
        raise bad
    return (created_at if created_at.tzinfo else created_at.replace(tzinfo=timezone.utc)), job_id


def filtered(
    query: Select, status: JobStatus | None, labels: dict[str, str], projects: list[str] | None = None
) -> Select:
    """``query`` restricted to jobs in ``status`` carrying every ``key=value`` of ``labels``
    (a job matches a label when it has that key with exactly that value), in one of
    ``projects`` (None: any project)."""
    if projects is not None:
        query = query.where(JobRow.project.in_(projects))
    if status is not None:
        query = query.where(JobRow.status == status.value)
    for key, value in labels.items():
        label = aliased(JobLabelRow)  # its own name: the page may be read from JobLabelRow itself
        query = query.where(exists().where(label.job_id == JobRow.id, label.key == key, label.value == value))
    return query


def page(
    s: Session,
    *,
    status: JobStatus | None,
    labels: dict[str, str],
    limit: int,
    offset: int = 0,
    cursor: str | None = None,
    projects: list[str] | None = None,
) -> tuple[list[JobRow], int, str | None]:
    """One page of jobs (newest first), how many match in all, and the cursor of the
    next page (None on the last). With a label filter the page is read from the label
    rows' index (key, value, created_at), so it costs the same however common the label."""
    rows_q, count_q = select(JobRow), select(func.count()).select_from(JobRow)
    newest_first = (JobRow.created_at, JobRow.id)
    if labels:
        (key, value), *rest = labels.items()
        first = (JobLabelRow.job_id == JobRow.id) & (JobLabelRow.key == key) & (JobLabelRow.value == value)
        rows_q, count_q = (
            rows_q.join(JobLabelRow, first),
            select(func.count()).select_from(JobLabelRow).join(JobRow, first),
        )
        newest_first, labels = (JobLabelRow.created_at, JobLabelRow.job_id), dict(rest)
    rows_q, count_q = filtered(rows_q, status, labels, projects), filtered(count_q, status, labels, projects)
    if cursor:
        rows_q = rows_q.where(tuple_(*newest_first) < tuple_(*decode_cursor(cursor)))
    rows = list(s.scalars(rows_q.order_by(*(c.desc() for c in newest_first)).offset(offset).limit(limit + 1)))
    total = int(s.scalar(count_q) or 0)
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, total, encode_cursor(rows[-1].created_at, rows[-1].id) if more else None
