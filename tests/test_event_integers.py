"""Values a job's events carry that the contract allows, stored on SQLite and PostgreSQL
alike: integers at and over 2**31 (sequence numbers, steps, epochs), trial ids at the
columns' length, and a value the database itself refuses (a NUL character in text on
PostgreSQL) dropped and counted, never a 500 on the push nor a failed job from the log.
And migration 0006, up and down, on both."""

from __future__ import annotations

import httpx
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import select

from api.schemas import JobStatus
from api.schemas.events import MARKER, MAX_TRIAL_ID
from bench.harness import attacks
from service.db.event_models import CheckpointRow, MetricRow, TrialMetricRow, TrialRow, WorkerGroupRow
from service.db.models import JobRow

# Each test starts servers of its own and takes seconds: out of the fast command.
pytestmark = pytest.mark.slow

BIG = 2**40


@pytest.fixture()
def target(tmp_path, database_url):
    t = attacks.start_target(tmp_path, database_url)
    yield t
    t.stop()


def job_of(target, job_id: str) -> JobRow:
    with target.service.sessions() as s:
        return s.get(JobRow, job_id)


def test_integers_over_int32_are_stored_from_either_channel(target):
    job_id = target.running_job()
    pushed = [
        {"type": "metric", "seq": 0, "ts": 1.0, "metrics": {"step": BIG, "epoch": 2**31}},
        {"type": "worker_group", "seq": 2**31, "world_size": 1, "nodes": []},
        {
            "type": "checkpoint",
            "seq": 0,
            "path": f"{target.service.reads.prefix(job_id)}/ckpt",
            "metrics": {"step": BIG},
        },
    ]
    r = target.push(job_id, pushed)
    assert r.status_code == 204, r.text
    # The log channel (the monitor reads it): a report numbered past int32.
    line = '%s{"type": "metric", "seq": %d, "ts": 2.0, "metrics": {"step": %d}}\n' % (MARKER, 2**33, 2**62)
    assert target.service.ingest.log(job_id, line, 0) == len(line)
    job = job_of(target, job_id)
    assert job.status == JobStatus.RUNNING.value and job.dropped_events == 0, job.last_dropped_reason
    with target.service.sessions() as s:
        assert sorted(s.scalars(select(MetricRow.step).where(MetricRow.job_id == job_id))) == [BIG, 2**62]
        assert s.scalar(select(WorkerGroupRow.src_seq).where(WorkerGroupRow.job_id == job_id)) == 2**31
        assert s.scalar(select(CheckpointRow.step).where(CheckpointRow.job_id == job_id)) == BIG


def test_search_events_with_big_seqs_and_long_trial_ids(target):
    job_id = target.running_search()
    long_id = "t" * (MAX_TRIAL_ID + 1)
    events = [
        {
            "type": "trial_metric",
            "seq": 2**31,
            "trial_id": "a" * MAX_TRIAL_ID,
            "metrics": {"val_acc": 0.5, "step": BIG},
        },
        {"type": "trial", "seq": 2**35, "trial_id": "a" * MAX_TRIAL_ID, "status": "RUNNING"},
        {"type": "trial", "seq": 0, "trial_id": long_id, "status": "RUNNING"},
        {"type": "exploit", "seq": 1, "trial_id": "b", "donor_trial_id": long_id},
    ]
    r = target.push(job_id, events)
    assert r.status_code == 204, r.text
    job = job_of(target, job_id)
    assert job.status == JobStatus.RUNNING.value
    assert job.dropped_events == 2 and "trial_id" in job.last_dropped_reason, job.last_dropped_reason
    with target.service.sessions() as s:
        trial = s.scalar(select(TrialRow).where(TrialRow.job_id == job_id))
        assert (trial.event_seq, trial.best_seq) == (2**35, 2**31)
        assert s.scalar(select(TrialMetricRow.step).where(TrialMetricRow.job_id == job_id)) == BIG
    best = httpx.get(f"{target.url}/v1/jobs/{job_id}/best").json()
    assert best["trial_id"] == "a" * MAX_TRIAL_ID


def test_a_value_the_database_refuses_is_a_dropped_event(target, database_url):
    """PostgreSQL text holds no NUL character; the contract allows one."""
    job_id = target.running_search()
    events = [
        {"type": "trial", "seq": 0, "trial_id": "a", "status": "ERROR", "error": "bad\x00byte"},
        {"type": "trial", "seq": 0, "trial_id": "b", "status": "RUNNING"},
    ]
    r = target.push(job_id, events)
    assert r.status_code == 204, r.text
    line = MARKER + '{"type": "error", "seq": 0, "cause": "USER_CODE", "message": "nul \\u0000 here"}\n'
    assert target.service.ingest.log(job_id, line, 0) == len(line)
    job = job_of(target, job_id)
    assert job.status == JobStatus.RUNNING.value
    with target.service.sessions() as s:
        trials = sorted(s.scalars(select(TrialRow.trial_id).where(TrialRow.job_id == job_id)))
    if database_url.startswith("postgresql"):
        assert trials == ["b"] and job.dropped_events == 2, job.last_dropped_reason
        assert "the store refused" in job.last_dropped_reason
        assert job.log_offset == len(line)  # the log text was taken all the same
    else:
        assert trials == ["a", "b"] and job.dropped_events == 0


# ------------------------------------------------------------------ migration 0006

BIGINT_COLUMNS = {
    "metrics": ["src_seq", "step", "epoch"],
    "worker_groups": ["src_seq"],
    "trial_metrics": ["src_seq", "step", "epoch"],
    "trial_exploits": ["src_seq"],
    "checkpoints": ["step", "epoch"],
    "trials": ["best_seq", "event_seq"],
}


def alembic(conn) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", "service:migrations")
    cfg.attributes["connection"] = conn
    return cfg


def types(engine, table: str) -> dict[str, str]:
    return {c["name"]: type(c["type"]).__name__.upper() for c in sa.inspect(engine).get_columns(table)}


@pytest.mark.empty_database
def test_migration_0007_up_and_down(database_url):
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        command.upgrade(alembic(conn), "0006_names")
        conn.execute(
            sa.text(
                "INSERT INTO jobs (id, name, kind, status, labels, spec, created_at, attempt, log_offset, priority, restarts)"
                " VALUES ('j1', 'n', 'tune', 'RUNNING', '{}', '{}', '2026-01-01', 1, 0, 0, '[]')"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO metrics (job_id, attempt, src_seq, seq, ts, step, \"values\") VALUES ('j1', 1, 7, 0, 1.0, 3, '{}')"
            )
        )
    with engine.begin() as conn:
        command.upgrade(alembic(conn), "head")
    for table, columns in BIGINT_COLUMNS.items():
        assert all("BIG" in types(engine, table)[c] for c in columns), (table, types(engine, table))
    with engine.begin() as conn:
        command.check(alembic(conn))  # the models and the migrated schema agree
        conn.execute(
            sa.text(
                "INSERT INTO metrics (job_id, attempt, src_seq, seq, ts, step, \"values\") VALUES ('j1', 1, :s, 1, 2.0, :s, '{}')"
            ),
            {"s": 2**40},
        )
        conn.execute(
            sa.text(
                "INSERT INTO trials (job_id, trial_id, status, config, reports, exploits, event_attempt, event_seq, best_seq) "
                "VALUES ('j1', 't', 'RUNNING', '{}', 0, 0, 1, :s, :s)"
            ),
            {"s": 2**40},
        )
    with engine.begin() as conn:
        command.downgrade(alembic(conn), "0006_names")
    assert all("BIG" not in types(engine, "metrics")[c] for c in BIGINT_COLUMNS["metrics"])
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT src_seq, step FROM metrics")).all() == [
            (7, 3)
        ]  # the row INTEGER cannot hold went
        assert conn.execute(sa.text("SELECT event_seq, best_seq FROM trials")).one() == (-1, None)
        assert conn.execute(sa.text("SELECT count(*) FROM jobs")).scalar() == 1  # the rebuilds cascaded to nothing
    with engine.begin() as conn:
        command.upgrade(alembic(conn), "head")
    engine.dispose()


def test_a_nul_character_in_a_log_is_stored_as_a_replacement(target):
    """A job that prints a NUL byte: its log is stored, on PostgreSQL too, and its events with it."""
    job_id = target.running_job()
    text = "before\x00after\n" + MARKER + '{"type": "metric", "seq": 0, "ts": 1.0, "metrics": {"step": 1}}\n'
    assert target.service.ingest.log(job_id, text, 0) == len(text)
    job = job_of(target, job_id)
    assert job.status == JobStatus.RUNNING.value and job.log_offset == len(text)
    assert httpx.get(f"{target.url}/v1/jobs/{job_id}/logs").text == text.replace("\x00", "\ufffd")
    assert len(httpx.get(f"{target.url}/v1/jobs/{job_id}/metrics").json()) == 1
