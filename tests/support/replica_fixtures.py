"""Fixtures of the replica tests (tests/test_replicas.py, tests/test_replicas_ray.py): a fresh
database on the session's PostgreSQL at the newest schema (``store``), and the replicas a test started
(``started``), killed at its end (a paused one woken first, so it hears its end)."""

from __future__ import annotations

import os
import signal

import pytest


@pytest.fixture
def store(postgres_server):
    name = postgres_server.create_database(migrated=True)  # the first replica need not migrate it
    yield postgres_server.url(name)
    postgres_server.drop_database(name)


@pytest.fixture
def started():
    servers = []
    yield servers
    for server in servers:
        if server.proc is not None and server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)  # a paused one must hear its stop
        server.kill()
