"""A search that stops making progress: Tune's synchronous PBT once left a population
waiting at a perturbation point for ever when one trial ended short of it (the noisy
quadratic's stalled search), and the stall guard ends any search in which nothing runs
while something could (``tuning.stall``)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from api.client import Client
from bench.harness.waiting import wait_for
from tests.support.specs import function_pbt_search
from tuning.stall import StallWatch, fits, stall_limit_s, stall_reason

ROOT = Path(__file__).resolve().parent.parent


def _watch(states, room=True, limit=10.0):
    watch = StallWatch(limit)
    return [watch.check(states, lambda: room, now) for now in (0.0, 5.0, 10.0)]


def test_the_guard_names_every_trial_and_its_state_once_nothing_ran_for_its_time():
    waiting = [("t1", "PAUSED"), ("t2", "PAUSED"), ("t3", "PAUSED"), ("t4", "TERMINATED")]
    assert _watch(waiting) == [
        None,
        None,
        "search made no progress for 10 s: trials t1, t2, t3 PAUSED, t4 TERMINATED; no trial running",
    ]
    assert _watch([("a", "PENDING"), ("b", "PAUSED")])[-1].startswith("search made no progress for 10 s")


@pytest.mark.parametrize(
    "states, room",
    [
        ([("t1", "PAUSED"), ("t2", "RUNNING")], True),  # a trial in a long epoch is progress
        ([("t1", "PENDING"), ("t2", "PAUSED")], False),  # the cluster is busy with others: waiting, not stalled
        ([("t1", "TERMINATED"), ("t2", "ERROR")], True),  # the search is over
    ],
)
def test_the_guard_leaves_a_search_that_runs_waits_for_the_cluster_or_ended(states, room):
    assert _watch(states, room) == [None, None, None]


def test_the_guard_counts_from_the_last_time_nothing_ran():
    watch = StallWatch(10.0)
    paused = [("t1", "PAUSED")]
    assert watch.check(paused, lambda: True, 0.0) is None
    assert watch.check([("t1", "RUNNING")], lambda: True, 8.0) is None
    assert watch.check(paused, lambda: True, 12.0) is None  # 4 s of waiting, not 12
    assert watch.check(paused, lambda: True, 22.0) is not None
    assert stall_reason(paused, 3.4) == "search made no progress for 3 s: trials t1 PAUSED; no trial running"


def test_the_guard_time_is_the_searchs_own_else_the_servers(monkeypatch):
    monkeypatch.setenv("RAYDOCK_SEARCH_STALL_S", "30")
    assert stall_limit_s(5.0) == 5.0 and stall_limit_s(None) == 30.0
    monkeypatch.delenv("RAYDOCK_SEARCH_STALL_S")
    assert stall_limit_s(None) == 120.0
    assert fits({"CPU": 0.5, "GPU": 0}, {"CPU": 0.5}) and not fits({"CPU": 1, "X": 1}, {"CPU": 2})


def early_end_search(marks: Path) -> dict:
    config = {"lr": 0.1, "dir": str(marks), "interval": 3, "trials": 3}
    return function_pbt_search(
        "userpkg.tune_sync:early_end",
        config,
        cpus=0.25,
        lr=(0.01, 0.4),
        interval=3,
        num_trials=3,
        reports=6,
        stall_timeout_s=60,
    )


def test_a_trial_that_ends_short_of_the_synchronous_perturbation_point_leaves_no_one_waiting(client: Client, tmp_path):
    # One trial returns after 2 reports, once the other two wait at the perturbation point
    # (3): Tune's synchronous PBT perturbs only on a report there, so they waited for ever.
    job = client.submit(early_end_search(tmp_path))
    job.wait(timeout=240)
    assert job.status.value == "SUCCEEDED", job.info.error
    trials = job.trials()
    assert {t.status for t in trials} == {"TERMINATED"}
    assert sorted(t.reports for t in trials)[0] == 2  # the one that ended early
    assert all(t.reports >= 6 for t in sorted(trials, key=lambda t: t.reports)[1:]), [t.reports for t in trials]
    assert job.lineage(), "the two that waited were not perturbed at the point they met"


@pytest.mark.long  # a save held up for seconds; the stall it led to is the test above's, by default
def test_a_clone_made_while_its_pause_still_saves_runs_its_whole_budget(client: Client, tmp_path):
    # The trial behind reaches the perturbation point first and is still saving on its way to a
    # pause (its save held up) when the other reaches it: PBT clones into it then. Tune left it a
    # STOP that ended the clone one report after its restart (the noisy quadratic's trial that
    # ended TERMINATED at epoch 9 while the others waited for it at 16).
    spec = early_end_search(tmp_path)
    spec["base"]["entrypoint"] = "userpkg.tune_sync:stale_stop"
    spec.update(num_trials=2, pbt={"perturbation_interval": 2, "quantile_fraction": 0.5}, budget={"reports": 4})
    job = client.submit(spec)
    job.wait(timeout=240)
    assert job.status.value == "SUCCEEDED", job.info.error
    assert len(job.lineage()) == 1, "the trial behind was not cloned at the point"
    assert sorted(t.reports for t in job.trials()) == [4, 4]


@pytest.mark.long  # two Tune searches in a Ray job; the guard's decisions are tested above by default
def test_the_guard_ends_a_search_that_waits_with_room_to_run_and_leaves_one_whose_steps_outlast_it(ray_head):
    from ray.job_submission import JobStatus, JobSubmissionClient

    jobs = JobSubmissionClient(ray_head.dashboard_url, headers=ray_head.headers)
    entrypoint = shlex.join([sys.executable, "-m", "tests.support.stall_search", "2"])
    job = jobs.submit_job(entrypoint=entrypoint, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    ended = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)
    wait_for(lambda: jobs.get_job_status(job) in ended, 240, "the guarded searches to end")
    logs = jobs.get_job_logs(job)
    lines = [line for line in logs.splitlines() if line.startswith("STALL_SEARCH ")]
    assert lines, logs[-3000:]
    out = json.loads(lines[-1].removeprefix("STALL_SEARCH "))
    healthy, stalls = out["healthy"], out["stalls"]
    assert healthy["outcome"] == "finished" and healthy["steps"] == [2, 2], healthy  # 4 s steps, a 2 s guard
    assert stalls["outcome"] == "stalled", stalls
    assert stalls["reason"].startswith("search made no progress for 2 s: trials ")
    assert stalls["reason"].endswith(" PAUSED; no trial running") and stalls["reason"].count("_0000") == 2
    assert stalls["after_last_report_s"] >= 2  # the guard waited its time from the last report
