"""Hyperparameter search end to end on a real cluster: PBT cloning and perturbing,
ASHA stopping, a grid over user code, cancel, and the 422s of bad searches.

Trials are tiny (digits MLP, one worker of a quarter CPU) so a population of 4 runs
at once on the 4-CPU test cluster: what costs time is starting Ray Train runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from api.client import Client
from api.errors import CapacityExceeded
from api.schemas import TrainSpec
from bench.harness.waiting import wait_for
from service.cluster.ray_backend import ray_auth_token
from tests.support.phases_check import assert_phases
from tests.support.session import CLUSTER_CPUS
from tests.support.specs import BASE, search, steps_search, user_spec


@pytest.mark.long  # about 2 minutes on 2 cores (a PBT search to its clones): RAYDOCK_LONG_TESTS=1
def test_pbt_clone_continues_from_donor_checkpoint_with_perturbed_lr(client: Client, server, tmp_path):
    job = client.submit(search(algorithm="pbt", pbt={"perturbation_interval": 2}))
    job.wait(timeout=480)
    assert job.status.value == "SUCCEEDED", job.info.error

    trials = job.trials()
    assert len(trials) == 4 and {t.status for t in trials} == {"TERMINATED"}
    # The search's own start-up, and each trial's seconds from its start to its first report.
    assert_phases(job.info.start_phases, "driver_started", "first_metric")
    assert all(t.first_metric_s is not None and t.first_metric_s > 0 for t in trials), trials
    lineage = job.lineage()
    assert lineage, "PBT recorded no exploit"

    for exploit in lineage:
        assert exploit.trial_id != exploit.donor_trial_id
        assert exploit.new_config["optimizer.lr"] != exploit.old_config["optimizer.lr"]
        series = job.trial_metrics(exploit.trial_id)
        after = [p for p in series if p.seq > exploit.seq]
        if not after:
            continue  # the clone ended with the search before its next report
        first = after[0]
        donor = [
            p
            for p in job.trial_metrics(exploit.donor_trial_id)
            if p.seq < exploit.seq and p.epoch == exploit.donor_time
        ]
        # Not from scratch: the epoch and step counters go on from the donor's checkpoint,
        # and so does the accuracy (one epoch from scratch scores far lower here).
        assert first.epoch == exploit.donor_time + 1
        assert first.metrics["step"] > donor[-1].metrics["step"]
        assert first.metrics["val_acc"] >= donor[-1].metrics["val_acc"] - 0.1
        # The perturbed learning rate is the one the optimizer trained with.
        assert first.config == exploit.new_config
        assert first.metrics["lr"] == pytest.approx(exploit.new_config["optimizer.lr"])
    assert any(p.seq > lineage[0].seq for p in job.trial_metrics(lineage[0].trial_id))

    best = job.best()
    reports = [p for t in trials for p in job.trial_metrics(t.trial_id)]
    assert best.final and best.value == max(p.metrics["val_acc"] for p in reports)
    assert best.checkpoint is not None and best.checkpoint.id is not None
    restored = job.download_checkpoint(best.checkpoint.id, dest=tmp_path)
    assert json.loads((restored / "state.json").read_text())["epoch"] == best.metrics["epoch"]
    assert job.info.latest_metrics["trial_id"] == best.trial_id

    env = {**os.environ, "RAYDOCK_URL": server.url, "COLUMNS": "250"}  # wide enough that rich wraps nothing
    cli = subprocess.run(
        [sys.executable, "-m", "service.cli", "trials", job.id],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert all(t.trial_id in cli.stdout for t in trials)
    assert f"cloned {lineage[0].donor_trial_id}" in cli.stdout and f"best: {best.trial_id}" in cli.stdout

    # Replay: the best trial as one training job, with the values of its lineage by epoch.
    replay = subprocess.run(
        [sys.executable, "-m", "service.cli", "trials", job.id, "--replay"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert replay.returncode == 0, replay.stderr
    spec = yaml.safe_load(replay.stdout)
    assert spec == client.request("GET", f"/v1/jobs/{job.id}/best/replay").json()
    assert client.replay(job.id) == TrainSpec.model_validate(spec)  # the SDK's form of the same spec
    assert spec["kind"] == "train" and spec["epochs"] == 6
    schedule = spec["schedule"]
    assert schedule["unit"] == "epoch" and schedule["intervals"][0]["at"] == 0
    # The last interval is the best trial's own latest values.
    assert schedule["intervals"][-1]["values"]["optimizer.lr"] == pytest.approx(best.config["optimizer.lr"])
    # Every change of value is an exploit of the lineage, at the donor's epoch.
    moves = {(e.donor_time, e.new_config["optimizer.lr"]) for e in lineage}
    assert all((i["at"], i["values"]["optimizer.lr"]) in moves for i in schedule["intervals"][1:])
    run = client.submit(spec)
    run.wait(timeout=180)
    assert run.status.value == "SUCCEEDED", run.info.error
    firsts = {}
    for p in run.metrics():
        firsts.setdefault(p.metrics["epoch"], p.metrics)  # the first report of an epoch count is its end
    lrs = {at: v for at, v in ((i["at"], i["values"]["optimizer.lr"]) for i in schedule["intervals"])}
    for epoch, metrics in firsts.items():
        expected = lrs[max(a for a in lrs if a <= epoch - 1)]
        assert metrics["lr"] == pytest.approx(expected), (epoch, metrics["lr"], schedule)


# ASHA and grid searches start many Train runs (90-110 s each on 2 busy cores); they run
# when RAYDOCK_LONG_TESTS=1 so the default suite stays under its 20-minute budget.


@pytest.mark.long
def test_asha_stops_poor_trials_early(client: Client):
    # ASHA compares a trial at a rung with the trials that reached the rung before it.
    # Two at a time, good rates first (trials start in grid order): the poor ones meet
    # the good ones' records at their first rung.
    lrs = [0.4, 0.2, 0.001, 0.0005]
    spec = search(
        algorithm="asha",
        search_space={"optimizer.lr": {"type": "grid", "values": lrs}},
        max_concurrent_trials=2,
        budget={"epochs": 8},
        asha={"grace_period": 1, "reduction_factor": 2},
    )
    job = client.submit(spec)
    job.wait(timeout=300)
    assert job.status.value == "SUCCEEDED", job.info.error
    trials = job.trials()
    assert sorted(t.config["optimizer.lr"] for t in trials) == sorted(lrs)
    stopped = [t for t in trials if t.stopped_early]
    full = [t for t in trials if not t.stopped_early]
    assert stopped, [(t.config, t.last_metrics) for t in trials]
    assert all(t.last_metrics["epoch"] < 8 for t in stopped)
    assert max(t.best_metric for t in stopped) < max(t.best_metric for t in full)
    assert job.best().trial_id in {t.trial_id for t in full}


@pytest.mark.long
def test_grid_search_over_user_code_runs_exactly_the_grid(client: Client):
    base = user_spec("userpkg.steps:train", config={"steps": 5}, scaling={"num_workers": 2, "cpus_per_worker": 0.5})
    spec = search(
        base=base,
        search_space={"config.lr": {"type": "grid", "values": [0.02, 0.3]}},
        algorithm="grid",
        metric="loss",
        mode="min",
        num_trials=None,
        max_concurrent_trials=None,
        budget={"steps": 5},
    )
    job = client.submit(spec)
    job.wait(timeout=240)
    assert job.status.value == "SUCCEEDED", job.info.error
    trials = job.trials()
    assert sorted(t.config["config.lr"] for t in trials) == [0.02, 0.3]
    for t in trials:
        series = job.trial_metrics(t.trial_id)
        assert [p.metrics["step"] for p in series] == [1, 2, 3, 4, 5]
    by_lr = {t.config["config.lr"]: t for t in trials}
    # Each trial trained with its own value: the larger rate fits y = 3x faster.
    assert by_lr[0.3].last_metrics["loss"] < by_lr[0.02].last_metrics["loss"]
    assert job.best().trial_id == by_lr[0.3].trial_id


def test_cancel_stops_every_trial_and_frees_the_cluster(client: Client, ray_head):
    job = client.submit(steps_search({"num_workers": 1, "cpus_per_worker": 0.5}))
    wait_for(lambda: sum(t.reports > 0 for t in job.trials()) == 2, 240, "both trials to report")
    # Ray's usage report lags the trials' start by a few seconds: wait for it to show them.
    wait_for(lambda: client.cluster().cpus_free <= CLUSTER_CPUS - 2, 60, "the trials' CPUs to show as held")
    job.cancel()
    wait_for(lambda: job.refresh().status.is_terminal(), 90, "cancel to finish")
    assert job.status.value == "CANCELLED"
    assert {t.status for t in job.trials()} == {"CANCELLED"}
    wait_for(lambda: client.cluster().cpus_free == CLUSTER_CPUS, 90, "every CPU to be released")
    dashboard = httpx.Client(
        base_url=ray_head.dashboard_url, headers={"Authorization": f"Bearer {ray_auth_token()}"}, timeout=30
    )

    def leftovers() -> list:
        pgs = dashboard.get("/api/v0/placement_groups", params={"limit": 10_000}).json()["data"]["result"]["result"]
        actors = dashboard.get("/api/v0/actors", params={"limit": 10_000}).json()["data"]["result"]["result"]
        live_pgs = [p for p in pgs if p["state"] != "REMOVED"]
        trial_actors = [
            a
            for a in actors
            if a["state"] == "ALIVE"
            and a["class_name"] in ("RayTrainWorker", "TrainController", "ImplicitFunc", "run_trial")
        ]
        return live_pgs + trial_actors

    wait_for(lambda: not leftovers(), 60, "placement groups and trial actors to go")
    count = sum(t.reports for t in job.trials())
    time.sleep(2)
    assert sum(t.reports for t in job.trials()) == count  # nothing trains any more


def bad_search(**changes) -> dict:
    return search(**changes)


BAD = [
    (
        "path not in the spec",
        bad_search(search_space={"optimizer.learning_rate": {"type": "uniform", "low": 0.01, "high": 0.1}}),
        "invalid_spec",
        "optimizer.learning_rate: not a field of the base spec; optimizer has: lr, momentum",
    ),
    ("empty space", bad_search(search_space={}), "invalid_spec", "search space is empty"),
    (
        "population too small for PBT",
        bad_search(algorithm="pbt", num_trials=3),
        "invalid_spec",
        "population of 3 is too small for PBT",
    ),
    ("mode not min/max", bad_search(mode="maximize"), "invalid_spec", "mode: Input should be 'min' or 'max'"),
    (
        "value out of the field's range",
        bad_search(search_space={"optimizer.lr": {"type": "uniform", "low": 0.1, "high": 20}}),
        "invalid_spec",
        "value 20.0 gives an invalid trial spec",
    ),
    (
        "resources are not searchable",
        bad_search(search_space={"scaling.num_workers": {"type": "choice", "values": [1, 2]}}),
        "invalid_spec",
        "set base.scaling",
    ),
    ("unknown kind", {**bad_search(), "kind": "sweep"}, "invalid_spec", "kind must be train (the default) or tune"),
    ("bad base field", bad_search(base={**BASE, "batch_size": "large"}), "invalid_spec", "base.batch_size"),
    (
        "budget the cluster cannot hold",
        bad_search(
            max_concurrent_trials=4,
            driver_cpus_per_trial=1,
            base={**BASE, "scaling": {"num_workers": 1, "cpus_per_worker": 1}},
        ),
        "exceeds_cluster_capacity",
        "Lower max_concurrent_trials to 2",
    ),
]


@pytest.mark.parametrize("what,body,code,hint", BAD, ids=[b[0] for b in BAD])
def test_bad_search_is_refused_and_not_stored(server, what, body, code, hint):
    http = httpx.Client(base_url=server.url, timeout=30)
    before = http.get("/v1/jobs").json()["total"]
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == code
    assert hint in err["message"]
    assert http.get("/v1/jobs").json()["total"] == before


def test_sdk_raises_capacity_error_for_a_search(client: Client):
    with pytest.raises(CapacityExceeded) as excinfo:
        client.submit(
            search(max_concurrent_trials=4, base={**BASE, "scaling": {"num_workers": 2, "cpus_per_worker": 1}})
        )
    assert "max_concurrent_trials" in excinfo.value.message


def test_bayesian_search_suggests_values_inside_the_space():
    from api.schemas import parse_job_spec
    from tuning.search import param_space, searcher

    spec = parse_job_spec(
        search(
            algorithm="bayesian",
            search_space={
                "optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.5},
                "batch_size": {"type": "choice", "values": [32, 64]},
            },
        )
    )
    optuna = searcher(spec)
    optuna.set_search_properties(spec.metric, spec.mode, param_space(spec))
    for i in range(3):
        values = optuna.suggest(f"t{i}")
        assert 0.001 <= values["optimizer.lr"] <= 0.5 and values["batch_size"] in (32, 64)
        assert spec.trial_spec(values).optimizer.lr == values["optimizer.lr"]
        optuna.on_trial_complete(f"t{i}", {"val_acc": 0.5 + i / 10, **values})
