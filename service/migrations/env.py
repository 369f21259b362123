"""Alembic environment: migrations of raydock's store, run at server start-up
(``service.db.engine.make_engine``) or by hand with ``alembic -c service/alembic.ini``."""

from alembic import context
from sqlalchemy import engine_from_config, pool

from service.db import (  # noqa: F401  (their tables join Base's metadata)
    event_models,
    eventlog_models,
    lease_models,
    pipeline_models,
    schedule_models,
    tenancy_models,
    tracking_models,
)
from service.db.models import Base  # the tables: service/db/models.py and service/db/event_models.py

target_metadata = Base.metadata
config = context.config


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with engine.connect() as conn:
        _migrate(conn)


def _migrate(connection) -> None:
    # SQLite cannot ALTER most things in place: batch mode rebuilds tables for it.
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


run()
