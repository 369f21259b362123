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
