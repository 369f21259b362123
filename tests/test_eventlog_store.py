"""The event log in the store: its migration up and down (SQLite and PostgreSQL), an
event that commits with the change it records or not at all, the per-job cap, and the
retention trim. Real databases, no server."""

from __future__ import annotations

from datetime import timedelta

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, delete, inspect, select, text, update

from api.schemas import JobStatus
from service import lifecycle
from service.db.engine import make_engine, make_sessionmaker
from service.db.eventlog_models import DeliveryRow, EventLogRow, WebhookRow
from service.db.models import JobRow, utcnow
from service.eventlog import log as eventlog
from service.eventlog.log import job_may_log, record

TABLES = {"event_log", "webhooks", "webhook_deliveries"}


def _cfg() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", "service:migrations")
    return cfg


@pytest.mark.slow  # seconds: every migration, on both databases
@pytest.mark.empty_database
def test_the_eventlog_migration_goes_up_and_down_keeping_the_jobs(database_url):
    cfg, old = _cfg(), create_engine(database_url)
    with old.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0009_tracking")
        conn.execute(
            text(
                "INSERT INTO jobs (id, name, kind, status, labels, spec, created_at, attempt, log_offset, priority,"
                " restarts) VALUES ('j1', 'n', 'train', 'RUNNING', '{}', '{}', '2026-01-01', 1, 0, 0, '[]')"
            )
        )
        conn.execute(text("INSERT INTO job_transitions (job_id, to_status, at) VALUES ('j1', 'RUNNING', '2026-01-01')"))
    old.dispose()
    engine = make_engine(database_url)  # up to the newest revision
    assert TABLES <= set(inspect(engine).get_table_names())
    with engine.begin() as conn:
        assert conn.execute(text("SELECT log_events FROM jobs WHERE id = 'j1'")).scalar() == 0
        conn.execute(
            text("INSERT INTO event_log (at, type, actor, data) VALUES ('2026-01-02', 'deleted', 'loopback', '{}')")
        )
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0009_tracking")
    assert not TABLES & set(inspect(engine).get_table_names())
    with engine.connect() as conn:  # the downgrade touched neither the job nor its history
        assert conn.execute(text("SELECT count(*) FROM job_transitions WHERE job_id = 'j1'")).scalar() == 1
        assert "log_events" not in {c["name"] for c in inspect(engine).get_columns("jobs")}
    engine.dispose()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_sessionmaker(make_engine(f"sqlite:///{tmp_path_factory.mktemp('eventlog') / 'store.db'}"))


@pytest.fixture()
def sessions(store):
    """The module's store, emptied of events, with one running job j1."""
    with store.begin() as s:
        for table in (EventLogRow, DeliveryRow, WebhookRow, JobRow):
            s.execute(delete(table))
        s.add(JobRow(id="j1", name="n", kind="train", status="RUNNING", labels={}, spec={}, attempt=1))
    return store


def test_an_event_commits_with_the_change_it_records_or_not_at_all(sessions):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with sessions.begin() as s:
            job = s.get(JobRow, "j1")
            assert lifecycle.transition(s, job, JobStatus.CANCELLING, reason="cancel requested", actor="api-token")
            raise Boom  # the transaction rolls back: neither the status nor its event stays
    with sessions() as s:
        assert s.get(JobRow, "j1").status == "RUNNING"
        assert s.scalar(select(EventLogRow.id)) is None
    with sessions.begin() as s:
        lifecycle.transition(s, s.get(JobRow, "j1"), JobStatus.CANCELLING, reason="cancel requested", actor="api-token")
    with sessions() as s:
        [event] = eventlog.page(s, job_id="j1").items
    assert (event.type, event.actor, event.data) == (
        "status_changed",
        "api-token",
        {"from": "RUNNING", "to": "CANCELLING", "reason": "cancel requested", "attempt": 1},
    )


def test_a_jobs_own_events_are_capped_and_counted(sessions):
    with sessions.begin() as s:
        job = s.get(JobRow, "j1")
        for step in range(25):
            if job_may_log(job, 10):
                record(s, "checkpointed", job_id="j1", step=step)
    with sessions() as s:
        page = eventlog.page(s, job_id="j1", type="checkpointed", limit=1000)
        assert [e.data["step"] for e in page.items] == list(range(10))
        assert s.get(JobRow, "j1").log_events == 25  # what was not logged is still counted


def test_pages_follow_the_cursor_and_retention_trims_old_events(sessions):
    with sessions.begin() as s:
        for i in range(5):
            record(s, "code_uploaded", actor="loopback", n=i)
        s.add(WebhookRow(id="gone-1", job_id="gone", url="http://x", events=["*"], secret="s"))
    with sessions() as s:
        first = eventlog.page(s, limit=2)
        second = eventlog.page(s, since=first.next, limit=2)
        third = eventlog.page(s, since=second.next, limit=2)
    assert [e.data["n"] for e in first.items + second.items + third.items] == [0, 1, 2, 3, 4]
    assert third.next is None
    old = utcnow() - timedelta(days=10)
    with sessions.begin() as s:
        s.execute(update(EventLogRow).where(EventLogRow.id <= first.next).values(at=old))
        s.execute(update(WebhookRow).values(created_at=old))
        s.add(DeliveryRow(subscription="server:a", event_id=first.next))
    with sessions.begin() as s:
        assert eventlog.trim(s, days=7) == 2
    with sessions() as s:
        assert [e.data["n"] for e in eventlog.page(s).items] == [2, 3, 4]
        assert s.scalar(select(DeliveryRow.id)) is None and s.scalar(select(WebhookRow.id)) is None


@pytest.mark.slow  # seconds: a job service on a fresh store
def test_what_callers_do_is_logged_with_their_name_and_outlives_the_job(tmp_path):
    """Submit, cancel, resume, a bulk cancel and delete through the job service (no Ray:
    jobs stay QUEUED), each named by its actor; the log of a deleted job stays, and a
    loopback webhook is refused at submit."""
    from api.errors import InvalidSpec
    from api.schemas import parse_job_spec
    from bench.harness.jobstore import job_service
    from bench.harness.specs import digits_spec
    from service.eventlog import subscriptions

    service = job_service(f"sqlite:///{tmp_path / 'jobs.db'}", tmp_path)
    notify = [{"url": "https://hooks.example.com/raydock", "events": ["*"]}]
    job, _ = service.jobs.submit(parse_job_spec(digits_spec(notify=notify)), actor="alice")
    service.jobs.cancel(job.id, actor="api-token")
    service.jobs.resume(job.id, actor="loopback")
    service.jobs.cancel_many([job.id], actor="bob")
    service.jobs.delete(job.id, actor="carol")
    with service.sessions() as s:
        events = eventlog.page(s, job_id=job.id).items
        [hook] = subscriptions.job_webhooks(
            s, job.id, with_secrets=True
        )  # kept after the job, to tell it the job is gone
    assert [(e.type, e.actor) for e in events if e.type != "status_changed"] == [
        ("submitted", "alice"),
        ("cancelled", "api-token"),
        ("resumed", "loopback"),
        ("cancelled", "bob"),
        ("deleted", "carol"),
    ]
    assert [(e.data["to"], e.actor) for e in events if e.type == "status_changed"] == [
        ("CANCELLED", "api-token"),
        ("QUEUED", "loopback"),
        ("CANCELLED", "bob"),
    ]
    assert hook.id == f"{job.id}-1" and hook.secret.startswith("whsec_") and len(hook.secret) > 30

    loopback = digits_spec(notify=[{"url": "http://localhost:8000/v1/jobs"}])
    with pytest.raises(InvalidSpec) as refused:
        service.jobs.submit(parse_job_spec(loopback))
    assert refused.value.code == "webhook_url_refused" and "notify.0.url" in refused.value.message
    service.sessions.kw["bind"].dispose()


def test_the_fan_out_makes_each_delivery_once_and_waits_for_late_commits(sessions, tmp_path):
    """On PostgreSQL an event id can commit after a higher one: the fan-out cursor stays
    behind events younger than SETTLE_S, so one that appears late below the newest is
    still fanned out, and a rescan makes no second delivery."""
    import json

    from service.db.models import ServerMetaRow
    from service.eventlog.deliverer import Deliverer
    from service.eventlog.fanout import CURSOR_KEY
    from service.settings import Settings

    hooks = [{"name": "ops", "url": "https://hooks.example.com/x", "events": ["*"], "secret": "s" * 16}]
    deliverer = Deliverer(
        Settings(storage={"data_dir": tmp_path}, webhooks={"webhooks_raw": json.dumps(hooks)}), sessions
    )
    with sessions.begin() as s:
        s.execute(delete(ServerMetaRow).where(ServerMetaRow.key == CURSOR_KEY))
        ids = [record(s, "code_uploaded", n=i) for i in range(3)]
    ids = [r.id for r in ids]
    with sessions.begin() as s:  # the middle one "commits late": absent at the first fan-out
        late = s.get(EventLogRow, ids[1])
        kept = {"at": late.at, "type": late.type, "actor": late.actor, "data": late.data}
        s.delete(late)
    assert deliverer.fan_out() == 2 and deliverer.fan_out() == 0
    with sessions.begin() as s:
        s.add(EventLogRow(id=ids[1], **kept))
    assert deliverer.fan_out() == 1
    with sessions.begin() as s:
        s.execute(update(EventLogRow).values(at=utcnow() - timedelta(minutes=1)))  # all settled now
    deliverer.fan_out()
    with sessions() as s:
        assert s.get(ServerMetaRow, CURSOR_KEY).value == str(ids[-1])
        assert sorted(s.scalars(select(DeliveryRow.event_id))) == ids
