"""``GET /v1/jobs/{id}`` on PostgreSQL reads through a pool of its own, in autocommit and
without a ping on checkout (service/db/engine.py's ``point_read_engine``): a connection
the database dropped is replaced and the read answered, never a 500."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import create_engine, text

from bench.harness.replicas import replica
from bench.harness.specs import digits_spec
from service.db.engine import make_engine, point_read_engine

TERMINATE = text(
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


@pytest.fixture
def store(postgres_server):
    name = postgres_server.create_database()
    yield postgres_server.url(name)
    postgres_server.drop_database(name)


def terminate_others(url: str) -> int:
    """End every other connection to this database, as a restart of the database would."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(TERMINATE).scalar_one()
    finally:
        engine.dispose()


def test_reads_after_the_database_drops_every_connection_answer_without_a_500(tmp_path, store):
    server = replica(tmp_path / "a", store, ttl_s=12.0)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            job = c.post("/v1/jobs", json=digits_spec(name="kept")).raise_for_status().json()

            def get(_: int) -> tuple[int, str | None]:
                r = c.get(f"/v1/jobs/{job['id']}")
                return r.status_code, r.json().get("id")

            with ThreadPoolExecutor(8) as pool:  # several connections in the read pool
                assert set(pool.map(get, range(64))) == {(200, job["id"])}
                assert terminate_others(store) >= 2
                assert [get(0) for _ in range(3)] == [(200, job["id"])] * 3
                assert set(pool.map(get, range(64))) == {(200, job["id"])}
            # the server's other connections (pinged on checkout) are replaced too
            assert c.post("/v1/jobs", json=digits_spec(name="after")).status_code == 202
            assert c.get(f"/v1/jobs/{job['id']}").json()["status"] == "QUEUED"
    finally:
        server.stop()


def test_sqlite_reads_through_the_stores_own_engine(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    assert point_read_engine(engine) is engine
    engine.dispose()
