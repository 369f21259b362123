"""The store's schema comes from Alembic migrations, and they match the models."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import inspect

from service.store import Base, import_models, make_engine


def test_migrations_create_the_schema_and_match_the_models(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    engine = make_engine(url)
    import_models()
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
