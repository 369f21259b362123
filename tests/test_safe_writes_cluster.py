"""A planted launch-file link against the real server on the session's Ray cluster: a job
that left a link to a stand-in for the database where its next attempt's launch file goes
is resumed; the stand-in keeps its bytes, and the new attempt's driver reads the file the
server wrote (checked against ``RAYDOCK_LAUNCH_SHA256``) and reports over its events token.
And a borrowed job with such a link where its preemption marker goes is preempted (opt-in,
``long``: two job starts): the stand-in keeps its bytes, the marker is the server's."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import pytest

from api.schemas import QuotaSpec
from bench.harness.specs import digits_spec
from bench.harness.waiting import wait_for
from bench.harness.write_attacks import DB_BYTES, plant, tree, written_whole
from tests.support.session import CLUSTER_CPUS

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


@pytest.mark.long
def test_a_preempted_job_is_told_in_its_own_marker_whatever_it_planted(client, server, tmp_path):
    """The borrower of tests/test_preemption.py, with a link to the stand-in where its marker goes."""
    tag = uuid.uuid4().hex[:6]
    guest, owner = f"guest-{tag}", f"owner-{tag}"
    for project in (guest, owner):
        client.request("POST", "/v1/projects", json={"name": project})
    client.set_quota(owner, QuotaSpec(guaranteed_cpus=2))
    borrower = client.submit(
        digits_spec(
            name="planting-borrower",
            project=guest,
            epochs=8,
            batch_size=16,
            scaling={"num_workers": 2, "cpus_per_worker": CLUSTER_CPUS // 2},
            checkpoint={"every_n_epochs": 1000, "keep": 2},
        )
    )
    owned = None
    try:
        victim = plant(Path(server.data_dir) / "storage" / borrower.id, "_raydock/preempt-1", "file", tmp_path / "out")
        before = tree(tmp_path / "out")
        wait_for(lambda: borrower.refresh().info.latest_metrics, 300, "the borrower's first report")
        assert borrower.info.attempt == 1 and borrower.info.borrowed
        owned = client.submit(
            digits_spec(name="owned", project=owner, epochs=1, scaling={"num_workers": 1, "cpus_per_worker": 2})
        )
        moves = lambda: [e.data["to"] for e in borrower.events(type="status_changed")]  # noqa: E731
        wait_for(lambda: "PREEMPTED" in moves(), 120, "the borrower preempted")

        assert victim.read_bytes() == DB_BYTES and tree(tmp_path / "out") == before
        assert written_whole(Path(server.data_dir) / "storage" / borrower.id, "_raydock/preempt-1") == b"preempted\n"
    finally:
        for job in (borrower, owned):
            if job is not None:
                with contextlib.suppress(Exception):
                    job.cancel()
        for job in (borrower, owned):
            if job is not None:
                wait_for(lambda j=job: j.refresh().status.is_terminal(), 120, "cancelled at teardown")
