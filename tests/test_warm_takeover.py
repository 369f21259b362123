"""A job that takes over the node's warm socket path gets nothing, and the warm process
whose path was taken leaves (tests/warm_attacks.py: no Ray cluster; this test stands
where the warm process's supervisor actor would).
"""

from __future__ import annotations

import os
import signal
import socket

import pytest

from tests.warm_attacks import plant, planted_saw, run_client, start_warm
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

        code, said = run_client(session)
        got = planted_saw(record, connections=2)
        assert got["bytes"] == 0 and got["fds"] == 0, got  # no environment, no stdio
        assert "is not this node's warm process" in said and "starting cold" in said, said
        assert code != 0  # the cold driver ran (and found no launch, as no server sent one)

        # The warm process saw its path taken, said so, and left the planted socket where it is.
        assert proc.wait(60) == PATH_TAKEN
        assert "no longer names its socket" in log.read_text()
        assert os.path.exists(path)
    finally:
        os.kill(planted, signal.SIGKILL)
