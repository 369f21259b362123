"""A job's record on the API's hot path, on SQLite and on a real PostgreSQL: the read by
id that ``GET /v1/jobs/{id}`` makes from the event loop (on SQLite, on a connection of
the loop's own) and the row a submit stores and answers with. No Ray: jobs stay QUEUED."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from sqlalchemy import update
from sqlalchemy.exc import DBAPIError

from api.errors import NotFound
from api.schemas import JobStatus, parse_job_spec
from bench.harness.jobstore import job_service, submit
from bench.harness.specs import digits_spec
from service.db.models import JobRow


@pytest.fixture()
def service(database_url, tmp_path):
    svc = job_service(database_url, tmp_path)
    yield svc
    svc.reads.loop.close()
    svc.sessions.kw["bind"].dispose()


def read(service, job_id: str):
    return asyncio.run(asyncio.wait_for(service.reads.read(job_id), timeout=10))


def test_a_submit_answers_with_the_job_as_stored(service):
    spec = parse_job_spec(digits_spec(name="stored", labels={"team": "vision", "tier": "gold"}, priority=2))
    job, created = service.jobs.submit(spec)
    assert created
    assert job == service.reads.get(job.id) == read(service, job.id)  # every field, defaults included
    assert (
        job.status == JobStatus.QUEUED and job.attempt == 0 and job.restarts == [] and job.created_at.tzinfo is not None
    )
    assert job.labels == {"team": "vision", "tier": "gold"} and job.spec["priority"] == 2
    found = service.reads.list(status=None, labels={"team": "vision", "tier": "gold"}, limit=10)
    assert [j.id for j in found.items] == [job.id]  # its labels are in the indexed table too


def test_the_loop_read_sees_each_committed_change_and_no_uncommitted_one(service):
    a, b = submit(service, name="a"), submit(service, name="b")
    assert read(service, a).status == JobStatus.QUEUED
    service.jobs.cancel(a)
    assert read(service, a).status == JobStatus.CANCELLED  # no snapshot kept from the last read
    with service.sessions.begin() as s:  # a writer in the middle of its transaction
        s.execute(update(JobRow).where(JobRow.id == b).values(status_reason="being written"))
        seen = read(service, b)  # SQLite in WAL mode and PostgreSQL: a reader does not wait for it
    assert seen.status_reason == "waiting to be scheduled"
    assert read(service, b).status_reason == "being written"


def test_an_unknown_job_is_not_found_on_the_loop(service):
    submit(service, name="other")
    with pytest.raises(NotFound) as err:
        read(service, "j000000000000")
    assert err.value.code == "job_not_found" and "GET /v1/jobs" in err.value.message


def test_the_loop_holds_no_read_transaction_between_reads(service, database_url):
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite's own reader lock; PostgreSQL reads run on the engine's pool")
    ids = [submit(service, name=f"r{i}") for i in range(3)]
    for job_id in ids * 5:
        read(service, job_id)
    submit(service, name="after")  # something in the WAL to move back into the database
    db = sqlite3.connect(database_url.removeprefix("sqlite:///"), timeout=0)
    try:
        busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        db.close()
    assert busy == 0  # a reader holding a snapshot would keep the WAL from being truncated


def test_a_broken_loop_connection_is_replaced_on_the_next_read(service, database_url):
    if not database_url.startswith("sqlite"):
        pytest.skip("the loop has a connection of its own only on SQLite")
    job_id = submit(service, name="x")
    read(service, job_id)
    service.reads.loop._conn.connection.dbapi_connection.close()  # the database connection under it goes away
    with pytest.raises(DBAPIError):
        read(service, job_id)
    assert read(service, job_id).id == job_id
