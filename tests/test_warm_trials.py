"""Warm search trials (tuning.trial_ranks): a trial whose workers fit one node runs them
as local ranks forked by its Tune trainable, and those processes die with the trial.

Each trial's trainable says in the search's log which processes are its ranks (one line
per start: the first, and each restart after a PBT exploit); these tests hold the ranks
to it by pid: alive while the trial runs, gone once a cancel or an exploit ended that
start of the trial."""

from __future__ import annotations

import contextlib
import os
import re
import signal

import psutil
import pytest

from api.client import Client, Job
from api.errors import Conflict
from bench.harness.waiting import wait_for
from service.cluster.local_cluster import LocalHead
from tests.support.session import CLUSTER_CPUS
from tests.support.specs import BASE, search, steps_search
from tests.support.warm import ensure_warm

STARTS = re.compile(r"raydock: trial (\S+) runs (\d+) local rank\(s\), pids \[([\d, ]+)\]")
# The same line with the Ray prefix naming the trainable's process.
TRAINABLE_STARTS = re.compile(r"pid=(\d+)\)\S* raydock: trial \S+ runs \d+ local rank\(s\), pids \[([\d, ]+)\]")


def starts(job: Job) -> list[tuple[str, list[int]]]:
    """Each start of a trial's ranks, in the log's order: (trial id, pids)."""
    return [(m[1], [int(p) for p in m[3].split(",")]) for m in STARTS.finditer(job.logs())]


def _all_starts(job: Job) -> dict[str, list[list[int]]]:
    out: dict[str, list[list[int]]] = {}
    for trial, pids in starts(job):
        out.setdefault(trial, []).append(pids)
    return out


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_cancel_kills_every_warm_trials_ranks(client: Client):
    job = client.submit(steps_search({"num_workers": 2, "cpus_per_worker": 0.5}))
    try:
        wait_for(lambda: sum(t.reports > 0 for t in job.trials()) == 2, 180, "both trials to report")
        wait_for(lambda: len(starts(job)) == 2, 30, "both trials' ranks in the log")
        assert "trials start warm" in job.logs()
        pids = [pid for _, group in starts(job) for pid in group]
        assert len(pids) == 4 and all(alive(p) for p in pids)  # two trials of two local ranks each
        # Each trial holds its driver's CPU and its workers' in one request: 2 x (0.5 + 2 x 0.5).
        # (Ray's usage report lags the trials' start by a few seconds.)
        wait_for(lambda: client.cluster().cpus_free == CLUSTER_CPUS - 3, 60, "the trials' CPUs to show as held")
    finally:
        job.cancel()
    wait_for(lambda: job.refresh().status.is_terminal(), 90, "cancel to finish")
    assert job.status.value == "CANCELLED"
    wait_for(lambda: not any(alive(p) for p in pids), 60, "every trial's ranks to die")
    wait_for(lambda: client.cluster().cpus_free == CLUSTER_CPUS, 90, "every CPU to be released")


def test_hosted_ranks_die_with_a_killed_trainable_and_with_a_cancelled_search(client: Client, ray_head: LocalHead):
    """A warm trial's ranks are forked by the node's warm process (the trainable's rank
    host), not by the trainable: SIGKILL of one trainable, which runs no cleanup, still
    ends its ranks, and a cancel of the search ends the other trial's."""
    ensure_warm(client, ray_head)
    job = client.submit(steps_search({"num_workers": 2, "cpus_per_worker": 0.25}))
    try:
        wait_for(lambda: len(TRAINABLE_STARTS.findall(job.logs())) == 2, 180, "both trials' ranks in the log")
        (killed, doomed), (kept, others) = [
            (int(pid), [int(p) for p in pids.split(",")]) for pid, pids in TRAINABLE_STARTS.findall(job.logs())
        ]
        assert job.logs().count("forked by rank host") == 2
        assert all(alive(p) for p in doomed + others)
        assert all(
            psutil.Process(p).ppid() not in (killed, kept) for p in doomed + others
        )  # not the trainables' children
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: not any(alive(p) for p in doomed), 60, "the ranks to die with their trainable")
        assert all(alive(p) for p in others)  # the other trial's go on
    finally:
        with contextlib.suppress(Conflict):
            job.cancel()
    wait_for(lambda: job.refresh().status.is_terminal(), 90, "the search to end")
    wait_for(lambda: not any(alive(p) for p in others), 60, "the other trial's ranks to die with the search")
    wait_for(lambda: client.cluster().cpus_free == CLUSTER_CPUS, 90, "every CPU to be released")


@pytest.mark.long  # a 4-trial PBT search to its exploits: about a minute on 2 cores
def test_exploit_replaces_the_trials_ranks_and_keeps_the_lineage(client: Client):
    spec = search(
        base={**BASE, "scaling": {"num_workers": 2, "cpus_per_worker": 0.25}},
        algorithm="pbt",
        num_trials=4,
        budget={"epochs": 6},
        driver_cpus_per_trial=0.25,
        pbt={"perturbation_interval": 2, "quantile_fraction": 0.25, "resample_probability": 0.25},
    )
    job = client.submit(spec)
    seen: dict[str, list[list[int]]] = {}
    try:

        def restarted() -> bool:
            for trial, pids in starts(job):
                if pids not in seen.setdefault(trial, []):
                    seen[trial].append(pids)
            return any(len(groups) > 1 for groups in seen.values()) or job.refresh().status.is_terminal()

        wait_for(restarted, 300, "a trial to restart after an exploit")
        for groups in seen.values():
            for old in groups[:-1]:  # every start before the trial's latest one ended with it
                assert not any(alive(p) for p in old), f"ranks {old} outlived their start"
        wait_for(lambda: job.refresh().status.is_terminal(), 300, "the search to finish")
    finally:
        with contextlib.suppress(Conflict):  # ended already, as it should have
            job.cancel()
    assert job.status.value == "SUCCEEDED"
    trials = job.trials()
    seen = {trial: [list(p) for p in groups] for trial, groups in _all_starts(job).items()}
    assert any(t.exploits for t in trials), "PBT exploited no trial"
    for t in trials:  # one start of its ranks at first, and one after each exploit
        assert len(seen[t.trial_id]) == 1 + t.exploits, (t.trial_id, t.exploits, seen[t.trial_id])
    wait_for(lambda: not any(alive(p) for g in seen.values() for pids in g for p in pids), 60, "every rank to end")


@pytest.mark.slow  # imports Ray Tune (no cluster)
def test_a_resumed_search_goes_on_the_way_its_trials_started_whichever_way_they_would_start_now(tmp_path, capsys):
    # Tune resumes a search only with the trainable it started with (run_warm_trial or
    # run_trial): a search that started warm and is resumed where its trials would now
    # start cold (its node gone, local ranks turned off) goes on warm, and the other way.
    from ray import tune

    from api.schemas import TuneSpec
    from tests.support.specs import user_spec
    from trainers.tune_compat import started_trainable
    from tuning.search import experiment_path, resumed_warm, trainable
    from tuning.search_events import SearchEvents

    base = user_spec(
        "userpkg.ckpt_steps:train", config={"steps": 4}, scaling={"num_workers": 1, "cpus_per_worker": 0.25}
    )
    space = {"config.lr": {"type": "uniform", "low": 0.01, "high": 0.1}}
    spec = TuneSpec.model_validate(search(base=base, search_space=space, metric="loss", mode="min", num_trials=2))
    out = SearchEvents(spec.metric, spec.mode, sink=lambda event: None)
    for started_warm in (True, False):
        job = f"search-{started_warm}"
        tune.Tuner(
            trainable(spec, job, str(tmp_path), out, warm=started_warm),
            run_config=tune.RunConfig(storage_path=str(tmp_path), name=job),
        )
        path = experiment_path(str(tmp_path), job)
        assert resumed_warm(spec, started_trainable(path), not started_warm) is started_warm
        assert f"started {'warm' if started_warm else 'cold'}" in capsys.readouterr().out
        resumed = trainable(
            spec, job, str(tmp_path), out, warm=resumed_warm(spec, started_trainable(path), started_warm)
        )
        tune.Tuner.restore(path, trainable=resumed)  # Tune takes it: the same trainable
        with pytest.raises(ValueError, match="same trainable"):  # what the other way meets
            tune.Tuner.restore(path, trainable=trainable(spec, job, str(tmp_path), out, warm=not started_warm))
    assert started_trainable(str(tmp_path / "none")) is None
