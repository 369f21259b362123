"""Borrowing and preemption on the session's real cluster (4 CPUs): a guest project with
no guarantee fills the cluster by borrowing; a project guaranteed 2 CPUs submits a job,
which takes the room back: the guest's job is preempted, checkpoints, requeues, and later
resumes from that checkpoint and SUCCEEDS with its steps continuing, its retries unused.
The accounting of both jobs equals their running time x the CPUs they held.

Three job starts in a row (the borrower, the owner's job, the borrower again): over 90 s,
so it is opt-in (``long``: RAYDOCK_LONG_TESTS=1)."""

from __future__ import annotations

import uuid

import pytest

from api.schemas import QuotaSpec
from bench.harness.specs import digits_spec
from bench.harness.waiting import wait_for
from tests.support.session import CLUSTER_CPUS


def running_seconds(job) -> float:
    """Seconds the job ran, all attempts: from each move to RUNNING to the move out of
    its running statuses, read from its status history."""
    total, since = 0.0, None
    for e in job.events(type="status_changed"):
        if e.data["to"] == "RUNNING":
            since = e.at
        elif since is not None and e.data["to"] not in ("CANCELLING", "PREEMPTED"):
            total, since = total + (e.at - since).total_seconds(), None
    return total


@pytest.mark.long
def test_a_project_under_its_guarantee_takes_borrowed_room_back(client):
    tag = uuid.uuid4().hex[:6]
    guest, owner = f"guest-{tag}", f"owner-{tag}"
    for project in (guest, owner):
        client.create_project(project)  # an admin submits only to projects that exist
    client.set_quota(owner, QuotaSpec(guaranteed_cpus=2))
    assert client.quota(guest).source == "default" and client.quota(owner).guaranteed_cpus == 2
    # The whole cluster, borrowed (guest's guarantee is 0); checkpoints only when asked or at its end.
    long = digits_spec(
        name="borrower",
        project=guest,
        epochs=8,
        batch_size=16,  # many short steps: the preemption lands mid-run
        scaling={"num_workers": 2, "cpus_per_worker": CLUSTER_CPUS // 2},
        checkpoint={"every_n_epochs": 1000, "keep": 2},
    )
    borrower = client.submit(long)
    wait_for(lambda: borrower.refresh().info.latest_metrics, 300, "the borrower's first report")
    assert borrower.info.borrowed and borrower.info.project == guest

    owned_spec = digits_spec(name="owned", project=owner, epochs=2, scaling={"num_workers": 1, "cpus_per_worker": 2})
    owned = client.submit(owned_spec)
    wait_for(lambda: borrower.refresh().status.value == "QUEUED", 120, "the borrower preempted and requeued")
    owned.wait(timeout=300)
    borrower.wait(timeout=300)

    assert owned.status.value == "SUCCEEDED" and not owned.info.borrowed
    assert borrower.status.value == "SUCCEEDED", borrower.info.error
    moves = [(e.data["from"], e.data["to"]) for e in borrower.events(type="status_changed")]
    assert ("RUNNING", "PREEMPTED") in moves and ("PREEMPTED", "QUEUED") in moves
    assert borrower.info.attempt == 2 and borrower.info.restarts_total == 0  # a preemption is no retry
    # The preemption checkpoint (attempt 1, mid-run) is where attempt 2 picked up.
    checkpoints = sorted(borrower.checkpoints(), key=lambda c: c.id)
    assert len(checkpoints) >= 2 and 0 < checkpoints[0].step < checkpoints[-1].step
    points = borrower.metrics()
    second = [p.step for p in points if p.attempt == 2]
    assert second and min(second) > checkpoints[0].step
    assert max(p.epoch for p in points) == 8

    # Accounting: CPUs held x running time, within a second per job, and /v1/usage agrees.
    for job, cpus in ((borrower, CLUSTER_CPUS), (owned, 2)):  # what each held
        ran = running_seconds(job)
        assert abs(job.info.usage.cpu_seconds / cpus - ran) < 1.0, (job.info.usage, ran)
        row = client.usage(project=job.info.project).rows[0]
        assert row.cpu_seconds == pytest.approx(job.info.usage.cpu_seconds) and row.jobs == 1
