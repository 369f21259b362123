"""Searches over a user's own Ray Train loop, as a user with an existing loop would run
them: Ray's example loop that reports only a loss (no budget given, so the time axis is
Tune's count of reports), and a loop that fails, whose error must read as its own.

Tiny on purpose (2 trials of 1 worker, a 3-epoch loop): what costs time is starting
Ray Train runs."""

from __future__ import annotations

import time

import pytest

from api.client import Client
from bench.harness.waiting import wait_for
from tests.support.specs import search, user_spec

LINEAR_EXAMPLE = "ray.train.examples.pytorch.torch_linear_example:train_func"


def linear_search(**overrides) -> dict:
    base = {
        "entrypoint": LINEAR_EXAMPLE,
        "config": {"epochs": 3, "data_size": 200, "val_size": 80},
        "scaling": {"num_workers": 1, "cpus_per_worker": 0.25},
    }
    spec = search(
        base=base,
        search_space={"config.lr": {"type": "loguniform", "low": 0.0001, "high": 0.05}},
        metric="loss",
        mode="min",
        num_trials=2,
        budget=None,
    )
    spec.pop("budget")
    spec.update(overrides)
    return spec


def check_linear_search(job, reports: int) -> list:
    """Succeeded, every trial reported its loss with Tune's count of reports as the time
    axis, and says plainly that PBT cannot carry this loop's weights."""
    job.wait(timeout=300)
    assert job.status.value == "SUCCEEDED", job.info.error
    trials = job.trials()
    assert len(trials) == 2 and {t.status for t in trials} == {"TERMINATED"}
    for t in trials:
        series = job.trial_metrics(t.trial_id)
        assert series and all("loss" in p.metrics for p in series)
        assert series[-1].metrics["training_iteration"] >= reports
        # The loop never restores from a checkpoint: said plainly, not a failure.
        assert t.note and "cannot carry weights" in t.note and t.error is None
    # A trial never cloned ends where its loop ends (the loop's end is the budget).
    assert min(job.trial_metrics(t.trial_id)[-1].metrics["training_iteration"] for t in trials) == reports
    assert job.best().final
    return trials


@pytest.mark.long  # PBT over the built-in loops stays in the default suite (tests/test_dashboard.py, tests/test_warm_trials.py)
def test_pbt_over_rays_example_loop_without_a_budget(client: Client):
    # No perturbation point inside the 3-report loop: no clone restarts its Train run
    # (the opt-in test below clones).
    job = client.submit(linear_search(algorithm="pbt", pbt={"quantile_fraction": 0.5, "perturbation_interval": 100}))
    check_linear_search(job, reports=3)


def test_a_failing_trial_reads_as_the_users_exception(client: Client):
    base = user_spec("userpkg.boom:train", config={"lr": 0.5}, scaling={"num_workers": 1, "cpus_per_worker": 0.25})
    spec = search(
        base=base,
        search_space={"config.lr": {"type": "choice", "values": [7]}},
        metric="loss",
        mode="min",
        num_trials=1,
    )
    spec.pop("budget")
    job = client.submit(spec)
    job.wait(timeout=180)
    assert job.status.value == "FAILED"
    assert job.info.failure_cause.value == "USER_CODE"
    first = "ValueError: learning rate 7 is out of range for this model"
    [trial] = job.trials()
    for error in (job.info.error, trial.error):
        assert error.splitlines()[0] == first, error
        assert "\x1b" not in error
        # The user's frames before Ray's wrappers.
        assert "Your code" in error and error.index("userpkg/boom.py") < error.index("Ray and raydock")


# Searches that start, stop and restart several Train runs: RAYDOCK_LONG_TESTS=1.


@pytest.mark.long
def test_a_cancelled_search_resumes_the_same_trials_from_their_checkpoints(client: Client):
    base = user_spec(
        "userpkg.ckpt_steps:train",
        config={"steps": 40, "every": 2, "sleep_s": 0.3},
        scaling={"num_workers": 1, "cpus_per_worker": 0.25},
    )
    spec = search(
        base=base,
        search_space={"config.lr": {"type": "uniform", "low": 0.01, "high": 0.1}},
        metric="loss",
        mode="min",
        num_trials=2,
        budget={"steps": 40},
    )
    job = client.submit(spec)
    wait_for(
        lambda: all(t.reports >= 6 for t in job.trials()) and len(job.trials()) == 2, 240, "both trials to checkpoint"
    )
    job.cancel()
    wait_for(lambda: job.refresh().status.is_terminal(), 90, "cancel to finish")
    assert job.status.value == "CANCELLED"
    before = {t.trial_id: job.trial_metrics(t.trial_id) for t in job.trials()}
    time.sleep(2)  # the driver is gone: nothing reports any more

    job.resume()
    job.wait(timeout=300)
    assert job.status.value == "SUCCEEDED", job.info.error
    trials = job.trials()
    assert {t.trial_id for t in trials} == set(before)  # the same trials, no fresh search
    assert {t.status for t in trials} == {"TERMINATED"}
    for t in trials:
        series = job.trial_metrics(t.trial_id)
        first_run = before[t.trial_id]
        resumed = series[len(first_run) :]
        assert resumed, t.trial_id
        # Continued from a checkpoint of the first attempt, not from scratch.
        assert resumed[0].metrics["resumed_from"] >= 2
        assert resumed[0].metrics["step"] == resumed[0].metrics["resumed_from"] + 1
        assert resumed[0].metrics["step"] <= first_run[-1].metrics["step"] + 1
        assert resumed[0].config == first_run[-1].config  # with its own values
        assert series[-1].metrics["step"] == 40


@pytest.mark.long
def test_pb2_explores_with_its_model_and_records_exploits(client: Client):
    job = client.submit(search(algorithm="pb2", pbt={"perturbation_interval": 2}))
    job.wait(timeout=480)
    assert job.status.value == "SUCCEEDED", job.info.error
    assert {t.status for t in job.trials()} == {"TERMINATED"}
    lineage = job.lineage()
    assert lineage, "PB2 recorded no exploit"
    for exploit in lineage:
        assert exploit.trial_id != exploit.donor_trial_id and exploit.donor_time is not None
        lr = exploit.new_config["optimizer.lr"]
        # PB2 picks the new value inside the searched bounds (0.001..0.5), not by a factor.
        assert 0.001 <= lr <= 0.5 and lr != exploit.old_config["optimizer.lr"]
        after = [p for p in job.trial_metrics(exploit.trial_id) if p.seq > exploit.seq]
        if after:  # the clone trained on from the donor's epoch with the value PB2 chose
            assert after[0].epoch == exploit.donor_time + 1
            assert after[0].metrics["lr"] == pytest.approx(lr)


@pytest.mark.long
def test_each_trial_is_itself_a_two_worker_train_run(client: Client):
    from tests.support.specs import BASE

    base = {**BASE, "scaling": {"num_workers": 2, "cpus_per_worker": 0.25}}
    job = client.submit(search(base=base, num_trials=2, budget={"epochs": 2}))
    job.wait(timeout=300)
    assert job.status.value == "SUCCEEDED", job.info.error
    trials = job.trials()
    assert len(trials) == 2
    for t in trials:
        series = job.trial_metrics(t.trial_id)
        # Every report comes from a data-parallel run of two workers.
        assert series and {p.metrics["world_size"] for p in series} == {2}
        assert series[-1].epoch == 2


@pytest.mark.long
def test_pbt_clones_a_loop_that_cannot_restore_and_stops_it_at_the_loops_end(client: Client):
    job = client.submit(linear_search(algorithm="pbt", pbt={"quantile_fraction": 0.5, "perturbation_interval": 2}))
    check_linear_search(job, reports=3)
    # Whether the pair meets at epoch 2 with both scores in depends on start-up timing
    # (one run of two here cloned); when it cloned, the clone ran on from the donor's count.
    lineage = job.lineage()
    assert all(e.donor_time >= 2 and e.new_config != e.old_config for e in lineage)
    # The clone started the loop over (no weights to carry) yet stopped where the loop ends.
    for e in lineage:
        after = [p for p in job.trial_metrics(e.trial_id) if p.seq > e.seq]
        assert all(p.metrics["training_iteration"] > 2 for p in after)
