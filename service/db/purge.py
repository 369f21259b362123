"""Deleting jobs whose rows may be many (a million metric reports, a search's trial
reports): the rows a job owns are deleted a chunk per transaction, with a pause between
chunks, and the job row last. On SQLite a transaction holds the one write lock, so a
single cascading DELETE of a big job would keep every submit, push and monitor write
waiting for as long as it runs; chunked, none waits longer than one chunk.

A job is marked ``deleting`` first, in the transaction that checks it is finished: a
resume then refuses it, so no new attempt starts on a job whose rows are going. A crash
in the middle leaves a marked job with part of its rows, which a later delete finishes.
"""

from __future__ import annotations

import time

from sqlalchemy import delete, select, tuple_, update
from sqlalchemy.orm import sessionmaker

from service.db.event_models import (
    CheckpointRow,
    ExploitRow,
    LogChunkRow,
    MetricRollupRow,
    MetricRow,
    TrialMetricRow,
    TrialRow,
    WorkerGroupRow,
)
from service.db.leases import Fence
from service.db.models import JobRow, TransitionRow

CHUNK_ROWS = 5000  # rows deleted per transaction
PAUSE_S = 0.01  # between chunks: other writers get the database
# The tables whose rows a job may own in numbers (the few others go with the job row).
CHILDREN = (
    MetricRow,
    TrialMetricRow,
    MetricRollupRow,
    LogChunkRow,
    WorkerGroupRow,
    ExploitRow,
    CheckpointRow,
    TrialRow,
    TransitionRow,
)


def mark(
    sessions: sessionmaker, job_ids: list[str], statuses: tuple[str, ...], fence: Fence | None = None
) -> list[str]:
    """Mark those of ``job_ids`` still in one of ``statuses`` as being deleted; returns them.
    With ``fence``, only while that lease is held (else LeaseLost, nothing marked)."""
    if not job_ids:
        return []
    with sessions.begin() as s:
        if fence is not None:
            fence.hold(s)
        q = update(JobRow).where(JobRow.id.in_(job_ids), JobRow.status.in_(statuses)).values(deleting=True)
        s.execute(q)
        return list(s.scalars(select(JobRow.id).where(JobRow.id.in_(job_ids), JobRow.deleting.is_(True))))


def purge(sessions: sessionmaker, job_id: str, chunk: int = CHUNK_ROWS, pause_s: float = PAUSE_S) -> int:
    """Delete the rows job ``job_id`` owns, ``chunk`` per transaction; returns how many."""
    total = 0
    for table in CHILDREN:
        while True:
            with sessions.begin() as s:
                n = _delete_some(s, table, job_id, chunk)
            total += n
            if n < chunk:
                break
            time.sleep(pause_s)
    return total


def _delete_some(s, table, job_id: str, chunk: int) -> int:
    if table is MetricRollupRow:  # no id column: by its primary key
        key = (table.level, table.block, table.key)
        some = s.execute(select(*key).where(table.job_id == job_id).limit(chunk)).all()
        if not some:
            return 0
        s.execute(delete(table).where(table.job_id == job_id, tuple_(*key).in_([tuple(r) for r in some])))
        return len(some)
    ids = list(s.scalars(select(table.id).where(table.job_id == job_id).limit(chunk)))
    if ids:
        s.execute(delete(table).where(table.id.in_(ids)))
    return len(ids)


def delete_jobs(sessions: sessionmaker, job_ids: list[str], chunk: int = CHUNK_ROWS) -> list[str]:
    """Delete marked jobs: their rows a chunk at a time, then each job row (only while
    it is still marked); returns the ids deleted."""
    gone: list[str] = []
    for job_id in job_ids:
        purge(sessions, job_id, chunk)
        with sessions.begin() as s:
            if s.execute(delete(JobRow).where(JobRow.id == job_id, JobRow.deleting.is_(True))).rowcount:
                gone.append(job_id)
    return gone
