"""Pipelines on the session's Ray cluster, through REST: a pipeline whose first step fails
fast stops the step after it with a reason that names the failed one (in the default
suite); and three tiny steps run one after another, the second starting from the first
one's checkpoint (its ``init_from``, resolved by the server to a checkpoint it lists as
complete for the first job) and going on from there as a resumed job does (three jobs in a
row, about 90 s here: an opt-in long test, RAYDOCK_LONG_TESTS=1)."""

from __future__ import annotations

import pytest

from api.client import Client
from api.schemas import JobStatus
from bench.harness.specs import digits_spec
from tests.support.specs import user_spec

TINY = {"scaling": {"num_workers": 1, "cpus_per_worker": 0.5}, "checkpoint": {"every_n_epochs": 1, "keep": 2}}


def test_a_failed_step_stops_the_step_after_it_naming_it(client: Client):
    broken = client.submit_pipeline(
        {
            "name": "broken",
            "steps": [
                {"name": "boom", "job": user_spec("userpkg.boom:train", name="boom", scaling={"num_workers": 1})},
                {"name": "after-boom", "job": digits_spec(name="never", **TINY), "after": [{"step": "boom"}]},
            ],
        }
    )
    stopped = client.wait_pipeline(broken.id, timeout=300)
    boom, never = stopped.steps
    assert boom.status == JobStatus.FAILED and never.status == JobStatus.CANCELLED
    assert "step 'boom'" in never.status_reason and "ended FAILED" in never.status_reason
    assert client.job(never.job_id).info.started_at is None  # it never ran
    assert stopped.status == JobStatus.FAILED


@pytest.mark.long
def test_three_steps_run_in_order_the_second_from_the_firsts_checkpoint(client: Client):
    three = client.submit_pipeline(
        {
            "name": "pre-fine-eval",
            "steps": [
                {"name": "pretrain", "job": digits_spec(name="pretrain", epochs=1, **TINY)},
                {
                    "name": "finetune",
                    "job": digits_spec(name="finetune", epochs=2, **TINY),
                    "init_from": {"step": "pretrain", "checkpoint": "best"},
                },
                {
                    "name": "evaluate",
                    "job": digits_spec(name="evaluate", epochs=1, **TINY),
                    "after": [{"step": "finetune"}],
                },
            ],
        }
    )
    assert [s.status for s in three.steps] == [JobStatus.QUEUED, JobStatus.WAITING, JobStatus.WAITING]
    done = client.wait_pipeline(three.id, timeout=480)
    assert done.status == JobStatus.SUCCEEDED, [(s.name, s.status, s.status_reason) for s in done.steps]
    pre, fine, ev = done.steps
    assert pre.finished_at <= fine.started_at and fine.finished_at <= ev.started_at  # one after another
    assert client.job(pre.job_id).checkpoints()  # complete checkpoints: what init_from chose from
    assert client.job(fine.job_id).info.spec["init_from"]["job"] == pre.job_id
    # It went on from pretrain's epoch, as a resumed job does: its reports start after it.
    pre_epochs = {m.epoch for m in client.job(pre.job_id).metrics() if m.epoch is not None}
    fine_epochs = {m.epoch for m in client.job(fine.job_id).metrics() if m.epoch is not None}
    assert fine_epochs and min(fine_epochs) > min(pre_epochs), (pre_epochs, fine_epochs)
