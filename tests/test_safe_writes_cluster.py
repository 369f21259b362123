"""A planted launch-file link against the real server on the session's Ray cluster: a job
that left a link to a stand-in for the database where its next attempt's launch file goes
is resumed; the stand-in keeps its bytes, and the new attempt's driver reads the file the
server wrote (checked against ``RAYDOCK_LAUNCH_SHA256``) and reports over its events token."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from tests.conftest import digits_spec
from tests.waiting import wait_for
from tests.write_attacks import DB_BYTES, plant, tree

pytestmark = pytest.mark.slow


def test_a_resumed_job_runs_from_its_own_launch_file_whatever_it_planted(client, server, tmp_path):
    job = client.submit(digits_spec(name="planter", epochs=3))
    try:
        job.cancel()
        wait_for(lambda: job.refresh().status.is_terminal(), 120, "the planter cancelled")
        attempt = job.info.attempt + 1
        prefix = Path(server.data_dir) / "storage" / job.id
        victim = plant(prefix, f"_raydock/launch-{attempt}.json", "file", tmp_path / "outside")
        before = tree(tmp_path / "outside")

        job.resume()
        wait_for(lambda: job.refresh().info.latest_metrics, 300, "the resumed attempt's first report")

        assert job.info.attempt == attempt, job.info
        assert victim.read_bytes() == DB_BYTES and tree(tmp_path / "outside") == before
        # The driver took the server's own file (it deletes it once read); the link is gone with it.
        assert not (prefix / "_raydock" / f"launch-{attempt}.json").is_symlink()
    finally:
        with contextlib.suppress(Exception):
            job.cancel()
        wait_for(lambda: job.refresh().status.is_terminal(), 120, "the planter cancelled at teardown")
