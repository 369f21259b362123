"""Shared fixtures: one real Ray cluster and one real raydock server per test session.

The cluster is a Ray head on ports of its own, started once (about 10 s here) and
stopped by the process session it was started in; never ``ray stop``.

Every Ray cluster of the run uses token auth with a token this run makes in a temp dir
of its own (``RAY_AUTH_TOKEN_PATH``, inherited by servers and CLIs the tests start):
nothing depends on ``~/.ray`` or any file outside the checkout and the run's temp dirs.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from api.client import Client
from bench.harness.databases import (  # noqa: F401  (fixtures: SQLite and a real PostgreSQL)
    database_url,
    module_database_url,
    postgres_server,
)
from bench.harness.servers import ServerProcess
from service.cluster.local_cluster import LocalHead, ensure_token, start_head
from tests.support.browser import browser, tab  # noqa: F401  (fixtures: a real Chromium and a tab on it)
from tests.support.cluster_teardown import cluster_left_as_found, module_leaves_cluster_idle  # noqa: F401  (autouse)
from tests.support.object_store import NODE_ENV, s3_env, s3_server, storage_base  # noqa: F401  (fixtures: local and S3 storage)
from tests.support.replica_fixtures import started, store  # noqa: F401  (fixtures: the replica tests' store and servers)
from tests.support.session import CLUSTER_CPUS, SESSION_RESOURCES, session_token_path

# A test that takes one of these needs the session's Ray head: it is marked ``slow``, so
# ``pytest -m "not slow"`` runs the tests with no Ray head, and ``serial``, so the test
# command runs it in its one process with one Ray head (``-m "not serial" -n 2`` runs the
# rest). Modules that start clusters of their own say ``pytestmark = [pytest.mark.slow,
# pytest.mark.serial]``; a ``long`` test is ``serial`` too.
RAY_FIXTURES = {"ray_head", "server", "client"}
_AUTH_DIR: str | None = None


def pytest_configure(config) -> None:
    global _AUTH_DIR
    _AUTH_DIR = tempfile.mkdtemp(prefix="raydock-test-auth-")
    os.environ.pop("RAY_AUTH_TOKEN", None)  # it would win over the file
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(ensure_token(Path(_AUTH_DIR) / "auth_token"))
    os.environ["RAY_AUTH_MODE"] = "token"


def pytest_collection_modifyitems(config, items) -> None:
    long_too = bool(os.environ.get("RAYDOCK_LONG_TESTS"))
    skip_long = pytest.mark.skip(reason="long test, opt-in: set RAYDOCK_LONG_TESTS=1")
    for item in items:
        if RAY_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.serial)
        if item.get_closest_marker("long"):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.serial)
            if not long_too:
                item.add_marker(skip_long)


def pytest_unconfigure(config) -> None:
    if _AUTH_DIR:
        shutil.rmtree(_AUTH_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory) -> LocalHead:
    head = start_head(
        tmp_path_factory.mktemp("ray"),
        num_cpus=CLUSTER_CPUS,
        auth_token_path=session_token_path(),
        extra_args=[f"--resources={json.dumps(SESSION_RESOURCES)}"],
        env=NODE_ENV,  # credentials of the suite's S3 endpoint, as every node of a cluster on S3 holds its own
    )
    yield head
    head.stop()


@pytest.fixture(scope="session")
def server(ray_head, tmp_path_factory) -> ServerProcess:
    proc = ServerProcess(tmp_path_factory.mktemp("server"), ray_head.dashboard_url).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def tenancy_world(tmp_path_factory):
    """One server of two projects and every kind of caller (no Ray), for the isolation and schedules tests."""
    from bench.harness.tenancy_world import start_world  # only the runs that use it import the server's parts

    world = start_world(tmp_path_factory.mktemp("tenancy"))
    yield world
    world.stop()


@pytest.fixture()
def client(server) -> Client:
    with Client(server.url) as c:
        yield c
