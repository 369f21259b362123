"""The store's engine: SQLite in WAL mode by default (writes serialized in the process,
``service/db/sqlite_writes.py``), PostgreSQL by URL, brought to the newest schema on start."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from service.db.sqlite_writes import serialize_writes

READ_POOL = (8, 4)  # (kept, more at a peak) connections of point_read_engine's pool


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(conn, _record) -> None:
            # WAL lets readers (streams, list calls) run while the monitor writes.
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        serialize_writes(engine)  # service/db/sqlite_writes.py
    else:
        engine = create_engine(url, pool_pre_ping=True)
    migrate(engine)
    if url.startswith("sqlite:///"):
        _owner_only(path)
    return engine


def _owner_only(db: Path) -> None:
    # The store holds every job's record: readable by the server's user alone.
    for p in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        if p.exists() and stat.S_IMODE(p.stat().st_mode) & 0o077:
            os.chmod(p, 0o600)


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (creating it on a new database)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", "service:migrations")
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def point_read_engine(engine: Engine) -> Engine:
    """The engine that ``GET /v1/jobs/{id}`` reads through (service/db/job_records.py).

    SQLite: ``engine`` itself. PostgreSQL: a pool of its own in autocommit, without the
    ping on checkout: a read by primary key is one statement, so it needs no BEGIN and no
    ROLLBACK, and with them and the ping gone it is one round trip instead of four. A
    connection the server dropped (a restart, ``pg_terminate_backend``) fails its read;
    the pool then replaces every connection made before, and the read is made once more
    (``job_records.read_pooled``). Its pool keeps ``READ_POOL`` connections: with fewer
    than the reads in flight, each read over it opened and closed a connection of its own."""
    if engine.dialect.name == "sqlite":
        return engine
    return create_engine(engine.url, isolation_level="AUTOCOMMIT", pool_size=READ_POOL[0], max_overflow=READ_POOL[1])


def make_sessionmaker(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)
