"""The background units besides the monitor write under their lease's fence
(service/db/leases.py): a replica that lost a unit's lease while paused, and runs one more
step when it resumes, writes nothing its new holder writes too. Usage is not counted
twice, a webhook delivery is not marked (so not skipped or reordered) and no delivery row
is made, retention and code collection delete nothing; the holder's fence does all of it.
And an attempt confirmed already is never stopped by a second confirm of it (two passes
that both started the same submission id). On real SQLite and PostgreSQL, no Ray."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from sqlalchemy import select

from api.schemas import JobStatus
from bench.harness.jobstore import job_service, set_columns, submit
from service.db.eventlog_models import DeliveryRow, EventLogRow
from service.db.leases import LeaseLost, Leases
from service.db.models import CodePackageRow, JobRow, utcnow
from service.db.tenancy_models import JobUsageRow
from service.eventlog.deliverer import Deliverer, _post
from service.eventlog.log import record
from service.eventlog.poster import Outcome
from service.eventlog.subscriptions import by_id
from service.retention import Policy, Retention
from service.settings import Settings


def _fences(engine, name: str):
    """A's fence on ``name``, then B's after A's TTL ran out: A's is stale."""
    a = Leases(engine, ttl_s=0.05, holder="host-a/1/aa").claim([name])[name]
    taker = Leases(engine, ttl_s=60.0, holder="host-b/2/bb")
    for _ in range(2000):
        if name in (held := taker.claim([name])):
            return a, held[name]
        time.sleep(0.005)
    raise AssertionError("B never took the lease")


def test_usage_is_counted_by_the_holder_only(database_url, tmp_path):
    side = job_service(database_url, tmp_path)
    job_id = submit(side)
    started = utcnow() - timedelta(hours=1)
    set_columns(side, job_id, status=JobStatus.RUNNING.value, attempt=1, attempt_started_at=started, holds_cpus=1.0)
    stale, held = _fences(side.sessions.kw["bind"], "usage")

    with pytest.raises(LeaseLost):
        side.monitor.account(stale)
    with side.sessions() as s:
        assert (s.get(JobRow, job_id).cpu_seconds or 0.0) == 0.0
        assert s.scalars(select(JobUsageRow)).all() == []

    side.monitor.account(held)
    with side.sessions() as s:
        assert s.get(JobRow, job_id).cpu_seconds >= 3600.0
        assert len(s.scalars(select(JobUsageRow)).all()) == 1


def test_a_stale_deliverer_makes_and_marks_no_delivery(database_url, tmp_path):
    side = job_service(database_url, tmp_path)
    hooks = [{"name": "ops", "url": "https://hooks.example.com/x", "events": ["*"], "secret": "s" * 16}]
    settings = Settings(storage={"data_dir": tmp_path}, webhooks={"webhooks_raw": json.dumps(hooks)})
    deliverer = Deliverer(settings, side.sessions)
    with side.sessions.begin() as s:
        record(s, "code_uploaded", n=1)
    stale, held = _fences(side.sessions.kw["bind"], "webhooks")

    deliverer._fence = stale
    with pytest.raises(LeaseLost):
        deliverer.fan_out()
    with side.sessions() as s:
        assert s.scalars(select(DeliveryRow)).all() == []

    deliverer._fence = held
    assert deliverer.fan_out() >= 1
    with side.sessions() as s:
        first = s.scalars(select(DeliveryRow).order_by(DeliveryRow.event_id)).first()
        post = _post(first, s.get(EventLogRow, first.event_id), by_id(s, first.subscription, deliverer.server))

    deliverer._fence = stale  # A posted before its pause; its answer settles nothing now
    with pytest.raises(LeaseLost):
        deliverer._settle(post, Outcome(ok=True, status=200, error=None, duration_s=0.01))
    with side.sessions() as s:
        row = s.get(DeliveryRow, first.id)
        assert (row.state, row.attempts, row.delivered_at) == ("pending", 0, None)

    deliverer._fence = held
    deliverer._settle(post, Outcome(ok=True, status=200, error=None, duration_s=0.01))
    with side.sessions() as s:
        row = s.get(DeliveryRow, first.id)
        assert (row.state, row.attempts) == ("delivered", 1)


def test_stale_retention_and_code_collection_delete_nothing(database_url, tmp_path):
    side = job_service(database_url, tmp_path)
    job_id = submit(side)
    old = utcnow() - timedelta(days=30)
    set_columns(side, job_id, status=JobStatus.SUCCEEDED.value, finished_at=old)
    with side.sessions.begin() as s:
        s.add(CodePackageRow(sha256="a" * 64, size_bytes=1, files=1, content_bytes=1, created_at=old, last_used_at=old))
    engine = side.sessions.kw["bind"]
    retention = Retention(side.sessions, side.settings.storage.resolved_storage_path, Policy(days=1.0))
    stale_r, held_r = _fences(engine, "retention")
    stale_c, held_c = _fences(engine, "code-collection")

    with pytest.raises(LeaseLost):
        retention.sweep(fence=stale_r)
    with pytest.raises(LeaseLost):
        side.code.collect(stale_c)
    with side.sessions() as s:
        assert s.get(JobRow, job_id) is not None and not s.get(JobRow, job_id).deleting
        assert s.get(CodePackageRow, "a" * 64) is not None

    assert retention.sweep(fence=held_r) == 1
    assert side.code.collect(held_c) == ["a" * 64]
    with side.sessions() as s:
        assert s.get(JobRow, job_id) is None and s.get(CodePackageRow, "a" * 64) is None


def test_a_second_confirm_of_a_started_attempt_leaves_it_running(database_url, tmp_path):
    """Two passes started the same submission id (Ray recognises the second submit): the
    later confirm finds the attempt counted and leaves its Ray job alone. Before, it read
    the attempt as cancelled meanwhile and stopped it: a job CANCELLED by nobody. Here
    Ray does not answer, so a stop would raise."""
    side = job_service(database_url, tmp_path)
    job_id = submit(side)
    prepared = side.monitor.attempts.prepare(job_id)
    side.monitor.attempts.confirm(job_id, prepared.submission_id, prepared.attempt)
    side.monitor.attempts.confirm(job_id, prepared.submission_id, prepared.attempt)  # no stop asked
    with side.sessions() as s:
        job = s.get(JobRow, job_id)
        assert (job.status, job.ray_job_id, job.attempt) == (JobStatus.STARTING.value, prepared.submission_id, 1)
