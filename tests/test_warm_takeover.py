"""A job that takes over the node's warm socket path gets nothing, and the warm process
whose path was taken leaves: first with no Ray cluster (bench/harness/warm_attacks.py; the test
stands where the warm process's supervisor actor would), then on the session's cluster
through the whole path (REST submit, Ray job, the entrypoint asking the GCS).
"""

from __future__ import annotations

import os
import signal
import socket

import pytest

from api.client import Client
from bench.harness.waiting import wait_for
from bench.harness.warm_attacks import plant, planted_saw, run_client, start_warm
from service.cluster.local_cluster import LocalHead
from tests.support.warm import ensure_warm, is_alive, pool_dir, tiny, warm_pid
from trainers.zygote import peer
from trainers.zygote.server import PATH_TAKEN

pytestmark = pytest.mark.slow  # the warm process imports torch and ray.train


@pytest.fixture()
def warm(tmp_path):
    session = tmp_path / "session"
    path, proc, log = start_warm(session)
    yield session, path, proc, log
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    return sock


def test_a_planted_listener_gets_nothing_and_the_warm_process_leaves(warm, tmp_path):
    session, path, proc, log = warm
    with connect(path) as sock:  # the real warm process, child of its supervisor (here: this test)
        assert peer.distrust(sock, path, {os.getpid()}) is None

    record = tmp_path / "planted.json"
    planted = plant(path, record)
    try:
        with connect(path) as sock:
            reason = peer.distrust(sock, path, {os.getpid()})
        assert reason is not None and "not the child" in reason

        # A job's entrypoint with no cluster to vouch for the listener (no GCS here) sends nothing.
        code, said = run_client(session)
        got = planted_saw(record)
        assert got["bytes"] == 0 and got["fds"] == 0, got  # no environment, no stdio
        assert "starting cold" in said and "warm start, driver" not in said, said
        assert code != 0  # the cold driver ran (and found no launch, as no server sent one)

        # The warm process saw its path taken, said so, and left the planted socket where it is.
        assert proc.wait(60) == PATH_TAKEN
        assert "no longer names its socket" in log.read_text()
        assert os.path.exists(path)
    finally:
        os.kill(planted, signal.SIGKILL)


def test_on_a_cluster_a_job_sends_a_planted_listener_nothing_and_the_pool_leaves(
    client: Client, ray_head: LocalHead, tmp_path
):
    zygote = ensure_warm(client, ray_head)
    path = pool_dir(ray_head) / "zygote.sock"
    record = tmp_path / "planted.json"
    planted = plant(str(path), record)
    try:
        job = client.submit(tiny())
        job.wait(timeout=180)
        assert job.status.value == "SUCCEEDED", job.info.error
        logs = job.logs()
        assert "is not this node's warm process" in logs and "warm start, driver" not in logs, logs[-2000:]
        got = planted_saw(record)
        assert got["connections"] >= 1 and got["bytes"] == 0 and got["fds"] == 0, got
        wait_for(lambda: not is_alive(zygote), 60, "the warm process whose path was taken gone")
        wait_for(lambda: client.cluster().warm_pool == [], 60, "the pool gone from GET /v1/cluster")
    finally:
        os.kill(planted, signal.SIGKILL)
        path.unlink(missing_ok=True)
    # Leave the cluster as found: the next job starts the node's pool again.
    job = client.submit(tiny())
    job.wait(timeout=180)
    wait_for(lambda: warm_pid(ray_head), 180, "the node's warm process started again")
