"""The store's schema comes from Alembic migrations, and they match the models."""

from __future__ import annotations

import json

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import inspect

from service.db.engine import make_engine
from service.db.models import Base


def test_migrations_create_the_schema_and_match_the_models(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    engine = make_engine(url)
    assert set(Base.metadata.tables) <= set(inspect(engine).get_table_names())
    assert "alembic_version" in inspect(engine).get_table_names()

    cfg = Config()
    cfg.set_main_option("script_location", "service:migrations")
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.check(cfg)  # raises if the models changed without a migration
    make_engine(url)  # a second start on the same database is a no-op


def test_upgrade_keeps_running_jobs_tokens_valid_and_stores_them_hashed(tmp_path):
    import hashlib
    import os
    import stat

    from sqlalchemy import create_engine, text

    url = f"sqlite:///{tmp_path / 'old.db'}"
    cfg = Config()
    cfg.set_main_option("script_location", "service:migrations")
    old = create_engine(url)
    with old.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")  # the schema before tokens were hashed
        conn.execute(
            text(
                "INSERT INTO jobs (id, name, kind, status, labels, spec, created_at, attempt, log_offset, priority, restarts, events_token)"
                " VALUES ('j1', 'n', 'train', 'RUNNING', '{}', '{}', '2026-01-01', 1, 0, 0, '[]', 'the-token')"
            )
        )
    old.dispose()

    engine = make_engine(url)
    with engine.begin() as conn:
        row = conn.execute(text("SELECT events_token_hash, dropped_events FROM jobs WHERE id = 'j1'")).one()
    assert row == (hashlib.sha256(b"the-token").hexdigest(), 0)
    assert "events_token" not in {c["name"] for c in inspect(engine).get_columns("jobs")}
    assert stat.S_IMODE(os.stat(tmp_path / "old.db").st_mode) == 0o600


@pytest.mark.empty_database
def test_upgrade_rolls_up_stored_series_so_they_downsample_as_from_every_report(database_url):
    import json

    from sqlalchemy import create_engine, text

    from service.db.engine import make_sessionmaker
    from service.events.reads import series

    url = database_url
    cfg = Config()
    cfg.set_main_option("script_location", "service:migrations")
    old = create_engine(url)
    n = 9000  # more than one chunk of the backfill
    with old.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0003")  # the schema before rollups
        conn.execute(
            text(
                "INSERT INTO jobs (id, name, kind, status, labels, spec, created_at, attempt, log_offset, priority, restarts, metrics_stored)"
                f" VALUES ('j1', 'n', 'train', 'SUCCEEDED', '{{}}', '{{}}', '2026-01-01', 1, 0, 0, '[]', {n})"
            )
        )
        rows = [
            {
                "seq": i,
                "ts": float(i),
                "values": json.dumps({"loss": ((i * 7919) % 1000) / 7.0, "step": i, "tag": "x", "ok": True}),
            }
            for i in range(n)
        ]
        conn.execute(
            text(
                "INSERT INTO metrics (job_id, attempt, src_seq, seq, ts, \"values\") VALUES ('j1', 1, :seq, :seq, :ts, :values)"
            ),
            rows,
        )
    old.dispose()

    engine = make_engine(url)  # upgrades to the newest revision, rolling up the stored series
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM metric_rollups WHERE job_id = 'j1'")).scalar() > n // 16
    with make_sessionmaker(engine)() as s:
        for since, max_points in ((-1, 2), (-1, 7), (-1, 300), (4321, 40)):
            assert series.downsample(s, "j1", since, max_points) == series._downsample_here(
                s, "j1", since, max_points, n - 1
            )
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0003")
    assert "metric_rollups" not in inspect(engine).get_table_names()


@pytest.mark.empty_database
def test_event_bounds_migration_counts_and_cuts_what_was_stored(database_url):
    """0005 fills each job's counters from the rows it has and keeps its newest ten
    restarts listed with their count; the best of a trial stored before it is still found."""
    from sqlalchemy import create_engine, text

    from service.db.engine import make_engine, make_sessionmaker
    from service.events.reads.trials import best_report

    cfg = Config()
    cfg.set_main_option("script_location", "service:migrations")
    old = create_engine(database_url)
    restarts = [{"attempt": 1, "ts": float(i), "reason": f"lost {i}"} for i in range(15)]
    with old.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0004")
        conn.execute(
            text(
                "INSERT INTO jobs (id, name, kind, status, labels, spec, created_at, attempt, log_offset, priority,"
                " restarts, metrics_stored) VALUES ('j1', 'n', 'tune', 'RUNNING', '{}', '{}', '2026-01-01', 1, 0, 0,"
                " :restarts, 0)"
            ),
            {"restarts": json.dumps(restarts)},
        )
        for t, best in (("t1", 0.5), ("t2", 0.25), ("t3", None)):
            conn.execute(
                text(
                    "INSERT INTO trials (job_id, trial_id, status, config, reports, best_metric, exploits,"
                    " event_attempt, event_seq) VALUES ('j1', :t, 'RUNNING', '{}', 2, :best, 0, 0, -1)"
                ),
                {"t": t, "best": best},
            )
        for seq, (t, loss) in enumerate((("t1", 0.9), ("t1", 0.5), ("t2", 0.25), ("t2", 0.4))):
            conn.execute(
                text(
                    'INSERT INTO trial_metrics (job_id, attempt, src_seq, trial_id, ts, "values", config)'
                    " VALUES ('j1', 1, :seq, :t, 0, :values, '{}')"
                ),
                {"seq": seq, "t": t, "values": json.dumps({"loss": loss})},
            )
    old.dispose()

    engine = make_engine(database_url)  # upgrades to the newest revision
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT restarts, restarts_total, trials_stored, trial_metrics_stored FROM jobs WHERE id = 'j1'")
        ).one()
    kept = row[0] if isinstance(row[0], list) else json.loads(row[0])
    assert (row[1], row[2], row[3]) == (15, 3, 4)
    assert [r["reason"] for r in kept] == [f"lost {i}" for i in range(5, 15)]
    with make_sessionmaker(engine)() as s:
        best = best_report(s, "j1", "loss", "min")
    assert (best.trial_id, best.values["loss"]) == ("t2", 0.25)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0004")
    assert "restarts_total" not in {c["name"] for c in inspect(engine).get_columns("jobs")}
    engine.dispose()


def test_the_drop_reason_column_is_renamed_in_place_both_ways_keeping_every_row(database_url):
    """0006 renames jobs.last_drop_reason without copying the table: the value moves with
    the column, and the rows the job owns (foreign keys on, ON DELETE CASCADE) stay."""
    from sqlalchemy import text

    engine = make_engine(database_url)  # every revision, with the server's connection settings
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (id, name, kind, status, labels, spec, created_at, attempt, log_offset, priority, restarts, last_dropped_reason)"
                " VALUES ('j1', 'n', 'train', 'RUNNING', '{}', '{}', '2026-01-01', 1, 0, 0, '[]', 'too many checkpoints')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO metrics (job_id, attempt, src_seq, seq, ts, \"values\") VALUES ('j1', 1, 0, 0, 1.0, '{}')"
            )
        )
    cfg = Config()
    cfg.set_main_option("script_location", "service:migrations")

    def kept(column: str) -> tuple:
        with engine.connect() as conn:
            reason = conn.execute(text(f"SELECT {column} FROM jobs WHERE id = 'j1'")).scalar()
            metrics = conn.execute(text("SELECT count(*) FROM metrics WHERE job_id = 'j1'")).scalar()
        columns = {c["name"] for c in inspect(engine).get_columns("jobs")}
        return reason, metrics, {"last_drop_reason", "last_dropped_reason"} & columns

    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0005_event_bounds")
    assert kept("last_drop_reason") == ("too many checkpoints", 1, {"last_drop_reason"})
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    assert kept("last_dropped_reason") == ("too many checkpoints", 1, {"last_dropped_reason"})
