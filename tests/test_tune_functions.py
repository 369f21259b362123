"""Ray Tune function trainables as they are (``trainable: function``): a search over a
function that calls ``tune.report`` and ``tune.get_checkpoint``, one process per running
trial (kept between trials and restarts), with PBT's clones and lineage, and a failing
function that reads as its own error."""

from __future__ import annotations

import re

import psutil
import pytest
from pydantic import ValidationError

from api.client import Client
from api.schemas import TuneSpec
from bench.harness.waiting import wait_for
from service.scheduling import admission
from tests.support.session import CLUSTER_CPUS
from tests.support.specs import FIXTURES, function_pbt_search, search, user_spec
from tests.support.warm import ensure_warm
from trainers import ray_compat
from tuning.trial_ranks import warm_reason

FUNCTION = "userpkg.tune_fn:trainable"
FORKED = re.compile(r"raydock: trial \S+ runs its function in forked process (\d+)")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def function_search(entrypoint: str = FUNCTION, **overrides) -> dict:
    spec = function_pbt_search(entrypoint, {"lr": 0.01}, cpus=0.5, lr=(0.001, 0.4), interval=2, num_trials=4, reports=8)
    spec.update(overrides)
    return spec


def test_a_function_trial_holds_one_processs_resources_and_no_driver():
    spec = TuneSpec.model_validate(function_search())
    assert admission.trial_demand(spec) == (0.5, 0.0)
    assert admission.search_demand(spec) == (2.0, 0.0)


def test_a_function_search_that_asks_for_ray_workers_or_no_warm_starts_runs_its_functions_in_their_trainables(
    monkeypatch,
):
    # A function that calls Ray's core API needs a Ray worker: a forked process is none.
    spec = TuneSpec.model_validate(function_search())
    assert warm_reason(spec, node_cpus=2.0) is None
    ray_workers = function_search()
    ray_workers["base"]["scaling"]["local_ranks"] = False  # the search says so
    assert "base.scaling.local_ranks false" in warm_reason(TuneSpec.model_validate(ray_workers), node_cpus=2.0)
    monkeypatch.setenv("RAYDOCK_WARM_START", "false")  # the server's setting, in the job's environment
    assert "warm starts are off" in warm_reason(spec, node_cpus=2.0)


def test_a_forked_function_has_a_tune_session_of_its_own():
    # What tune.report, tune.get_checkpoint and tune.get_context read in a local rank that
    # runs a function trainable (trainers.ray_compat.serve_tune_session); a Ray upgrade
    # that moves Tune's session fails here.
    from ray import tune
    from ray.train._internal import session

    reports, latest = [], [tune.Checkpoint("/tmp/start")]
    fields = {"experiment_name": "job", "trial_name": "fn_3efb4_00001", "trial_id": "3efb4_00001"}
    fields.update(run_id="r", trial_resources=None, trial_dir="/storage/job/fn_3efb4_00001")

    def report(metrics, checkpoint):
        reports.append((metrics, checkpoint))
        latest[0] = checkpoint or latest[0]

    assert session.get_session() is None
    ray_compat.serve_tune_session(fields, report, lambda: latest[0])
    try:
        assert tune.get_checkpoint().path == "/tmp/start"
        tune.report({"loss": 1.0})
        tune.report({"loss": 0.5}, checkpoint=tune.Checkpoint("/tmp/two"))
        assert [(m, c and c.path) for m, c in reports] == [({"loss": 1.0}, None), ({"loss": 0.5}, "/tmp/two")]
        assert tune.get_checkpoint().path == "/tmp/two"
        ctx = tune.get_context()
        assert (ctx.get_trial_id(), ctx.get_trial_name(), ctx.get_trial_dir()) == (
            "3efb4_00001",
            "fn_3efb4_00001",
            "/storage/job/fn_3efb4_00001",
        )
        assert ctx.get_experiment_name() == "job"
    finally:
        session.shutdown_session()


@pytest.mark.parametrize(
    "change, words",
    [
        ({"base": {"name": "b", "model": {"type": "mlp"}}}, "give base.entrypoint"),
    ],
)
def test_what_a_function_trainable_cannot_take_is_refused(change, words):
    with pytest.raises(ValidationError, match=words):
        TuneSpec.model_validate(function_search(**change))
    spec = function_search()
    spec["base"]["scaling"]["num_workers"] = {"min": 1, "max": 2}
    with pytest.raises(ValidationError, match="one process"):
        TuneSpec.model_validate(spec)


def test_a_tune_function_run_as_a_train_loop_fails_at_its_first_tune_call_naming_trainable_function(monkeypatch):
    from trainers.user_loop import TuneFunctionInTrainLoop, run_user_loop

    monkeypatch.syspath_prepend(str(FIXTURES / "usercode"))
    for _ in range(2):  # Ray warns once per process; every run of the loop fails all the same
        with pytest.raises(TuneFunctionInTrainLoop) as refused:
            run_user_loop("userpkg.tune_fn:reports_only", {"lr": 0.1})
        assert "ray.tune.report()" in str(refused.value) and "`trainable: function`" in str(refused.value)
    with pytest.raises(TuneFunctionInTrainLoop) as refused:
        run_user_loop(FUNCTION, {"lr": 0.1})  # Ray Tune's own style: restores first, then loops for ever
    assert "ray.tune.get_checkpoint()" in str(refused.value)
    # A Train loop that never touches Tune's session runs as before.
    assert run_user_loop("userpkg.tune_fn:boom_free", {"lr": 0.1}) == 0.1


@pytest.mark.long  # a search on the cluster: its trial fails in seconds, not after first_report_timeout_s
def test_a_tune_function_searched_as_a_train_loop_fails_in_seconds_saying_trainable_function(client: Client):
    base = user_spec(FUNCTION, config={"lr": 0.01}, scaling={"num_workers": 1, "cpus_per_worker": 0.25})
    spec = search(
        base=base,
        search_space={"config.lr": {"type": "loguniform", "low": 0.001, "high": 0.4}},
        metric="loss",
        mode="min",
        num_trials=1,
        budget={"reports": 8},
        driver_cpus_per_trial=0.25,
    )
    job = client.submit(spec)
    job.wait(timeout=300)
    assert job.status.value == "FAILED"
    (trial,) = job.trials()
    assert trial.status == "ERROR" and "`trainable: function`" in (trial.error or "")
    assert "`trainable: function`" in (job.info.error or "") and trial.reports == 0


@pytest.mark.slow
@pytest.mark.long  # PBT's clones are read by default in tests/test_tune_any_loop.py and the dashboard's search test
def test_pbt_over_a_tune_function_trainable_clones_the_best_beats_the_worst_and_every_cpu_is_freed(client: Client):
    job = client.submit(function_search())
    job.wait(timeout=600)
    assert job.status.value == "SUCCEEDED", job.info.error
    trials = job.trials()
    assert len(trials) == 4 and {t.status for t in trials} == {"TERMINATED"}
    assert all(t.reports >= 8 for t in trials)
    assert job.lineage(), "PBT recorded no exploit"
    losses = sorted(t.best_metric for t in trials)
    assert losses[0] < losses[-1]
    assert job.best().trial_id in {t.trial_id for t in trials}
    # What the search held is free once it ended: a quarter CPU left held in the raylet
    # (a placement group removed while Ray prepared it) queues the next search for ever.
    wait_for(lambda: client.cluster().cpus_free == CLUSTER_CPUS, 60, "every CPU to be free after the search")


def test_the_wait_for_a_kept_function_is_the_jobs_own_when_its_env_vars_set_it():
    from tuning.search_driver import trainables_runtime_env

    assert trainables_runtime_env({}) == {"env_vars": {"TUNE_FUNCTION_THREAD_TIMEOUT_S": "30"}}
    # Ray refuses a key the job's runtime_env and ray.init's both set: the job's own stands.
    assert trainables_runtime_env({"TUNE_FUNCTION_THREAD_TIMEOUT_S": "5"}) is None


@pytest.mark.slow
@pytest.mark.long  # two trials one after the other, 30-65 s on a loaded 2-core machine
def test_a_function_trainables_process_is_kept_for_the_next_trial_and_waits_30_s_for_the_function(client: Client):
    # Tune reads TUNE_FUNCTION_THREAD_TIMEOUT_S in the trainable's process when it resets it
    # for another trial; the search's driver puts it in the job's environment.
    spec = function_search("userpkg.tune_fn:environment", algorithm="random", pbt=None, num_trials=2)
    job = client.submit({**spec, "max_concurrent_trials": 1, "budget": {"reports": 1}})
    job.wait(timeout=300)
    assert job.status.value == "SUCCEEDED", job.info.error
    trials = job.trials()
    assert [t.status for t in trials] == ["TERMINATED"] * 2
    assert [t.last_metrics["thread_timeout_s"] for t in trials] == [30.0, 30.0]
    # reuse_actors: one trainable (the rank host that forks each trial's function is its own)
    assert trials[0].last_metrics["parent_id"] == trials[1].last_metrics["parent_id"]


@pytest.mark.slow
def test_synchronous_pbt_over_a_function_forks_each_start_from_a_kept_trainable_and_clones_go_on_from_their_donors(
    client: Client, ray_head, tmp_path
):
    # Tune's synchronous PBT pauses every trial at each perturbation point; Tune kept one of
    # their processes for the restarts (a new one for each other, most of a clone's wait for
    # its report). Each start of a trial runs its function in a process forked, with torch
    # imported, by its trainable's rank host (its parent), a fresh one each start.
    # The node's warm process is up first: a trainable that started before it forks its first
    # start from a forkserver of its own and the later ones from its rank host (two parents).
    ensure_warm(client, ray_head)
    spec = function_search("userpkg.tune_fn:naming_its_process")
    spec["base"]["config"].update(dir=str(tmp_path), trials=spec["num_trials"])
    job = client.submit(spec)
    job.wait(timeout=600)
    assert job.status.value == "SUCCEEDED", job.info.error
    trials = job.trials()
    assert {t.status for t in trials} == {"TERMINATED"} and all(t.reports >= 8 for t in trials)
    reports = {t.trial_id: job.trial_metrics(t.trial_id) for t in trials}
    points = [p.metrics for trial_points in reports.values() for p in trial_points]
    assert all(p["torch_before"] for p in points), "a function ran in a process without torch imported"
    assert not any(p["process_group"] for p in points), "a function ran in a torch process group it did not make"
    trainables = {p["parent"] for p in points}
    first_starts = {trial_points[0].metrics["parent"] for trial_points in reports.values()}
    # Every restart (each clone's and each paused trial's) ran from a trainable of a first start.
    assert trainables == first_starts, f"{len(trainables)} trainables ran {len(trials)} trials"
    for t in trials:  # tune.get_context() in the forked function is the trial's
        assert {
            (p.metrics["trial_name"].endswith(t.trial_id), t.trial_id in p.metrics["trial_dir"])
            for p in reports[t.trial_id]
        } == {(True, True)}
    starts: dict[tuple, list] = {}
    for p in sorted(points, key=lambda p: p["step"]):
        starts.setdefault((p["trial_name"], p["process"]), []).append(p)
    # One process per start of a trial, none beside it (each marked its start).
    assert len(list(tmp_path.glob("start-*"))) == len(starts), sorted(p.name for p in tmp_path.glob("start-*"))
    # After a report, tune.get_checkpoint() is that report's, where Tune persisted it.
    assert all(p["resumes_in_trial"] for later in starts.values() for p in later[1:])
    lineage = job.lineage()
    assert lineage, "PBT recorded no exploit"
    for exploit in lineage:  # the clone's next report goes on from its donor's checkpoint, in a new process
        before = {p.metrics["process"] for p in reports[exploit.trial_id] if p.ts < exploit.ts}
        after = [p for p in reports[exploit.trial_id] if p.ts >= exploit.ts]
        assert after and after[0].metrics["step"] == exploit.donor_time + 1, (exploit, after[:1])
        assert after[0].metrics["process"] not in before
    wait_for(lambda: client.cluster().cpus_free == CLUSTER_CPUS, 60, "every CPU to be free after the search")
    processes = {p["process"] for p in points}
    wait_for(lambda: not any(map(alive, processes)), 60, "the functions' processes to end")


@pytest.mark.slow
def test_a_cancel_ends_every_forked_function(client: Client):
    spec = function_search("userpkg.tune_fn:environment", algorithm="random", pbt=None, num_trials=2)
    job = client.submit({**spec, "budget": {"reports": 10**6}})
    try:
        wait_for(lambda: sum(t.reports > 0 for t in job.trials()) == 2, 180, "both trials to report")
        wait_for(lambda: len(FORKED.findall(job.logs())) == 2, 30, "both trials' processes in the log")
        pids = {t.last_metrics["process_id"] for t in job.trials()}
        assert pids == {int(pid) for pid in FORKED.findall(job.logs())} and all(map(alive, pids))
    finally:
        job.cancel()
    job.wait(timeout=120)
    assert job.status.value == "CANCELLED"
    wait_for(lambda: not any(map(alive, pids)), 60, "the forked functions to end with the search")


@pytest.mark.slow
def test_a_forked_function_that_calls_ray_fails_saying_how_and_runs_in_its_trainable_when_its_job_says(
    client: Client,
):
    spec = function_search("userpkg.tune_fn:calls_ray", algorithm="random", pbt=None, num_trials=1)
    job = client.submit(spec)
    job.wait(timeout=300)
    assert job.status.value == "FAILED"
    (trial,) = job.trials()
    assert "base.scaling.local_ranks" in (trial.error or "") and "nobody tracks" in trial.error, trial.error
    spec["base"]["scaling"]["local_ranks"] = False
    job = client.submit(spec)
    job.wait(timeout=300)
    assert job.status.value == "SUCCEEDED", job.info.error
    (trial,) = job.trials()
    assert trial.last_metrics["ray_worker"] is True and trial.last_metrics["loss"] == trial.config["config.lr"]
    assert "base.scaling.local_ranks false" in job.logs() and not FORKED.search(job.logs())


@pytest.mark.long  # tests/test_tune_any_loop.py reads a failing Train trial by default
def test_a_failing_function_trial_reads_as_the_users_exception(client: Client):
    job = client.submit(function_search("userpkg.tune_fn:boom", algorithm="random", pbt=None, num_trials=1))
    job.wait(timeout=300)
    assert job.status.value == "FAILED"
    (trial,) = job.trials()
    assert trial.status == "ERROR" and "is not a rate this function takes" in (trial.error or "")
    assert job.info.failure_cause.value == "USER_CODE"
    assert "is not a rate this function takes" in job.info.error.splitlines()[0]


@pytest.mark.slow
def test_a_trial_that_never_reports_is_stopped_and_says_so(client: Client):
    spec = function_search("userpkg.tune_fn:silent", algorithm="random", pbt=None, num_trials=1)
    job = client.submit({**spec, "first_report_timeout_s": 5})
    job.wait(timeout=300)
    assert job.status.value == "FAILED"
    (trial,) = job.trials()
    assert trial.status == "ERROR" and "without reporting (first_report_timeout_s=5)" in (trial.error or "")
    assert "without reporting" in (job.info.error or "")


@pytest.mark.slow
def test_a_cancelled_function_search_resumes_its_trials_from_where_the_cancel_found_them(client: Client):
    spec = function_search("userpkg.tune_fn:slowly", algorithm="random", pbt=None, num_trials=2)
    spec["base"]["config"]["sleep_s"] = 0.2
    job = client.submit({**spec, "budget": {"reports": 30}})
    wait_for(lambda: len(job.trials()) == 2 and all(t.reports >= 5 for t in job.trials()), 240, "5 reports each")
    job.cancel()
    wait_for(lambda: job.refresh().status.is_terminal(), 90, "the cancel to finish")
    assert job.status.value == "CANCELLED"
    before = {t.trial_id: job.trial_metrics(t.trial_id) for t in job.trials()}
    job.resume()
    job.wait(timeout=300)
    assert job.status.value == "SUCCEEDED", job.info.error
    trials = job.trials()
    assert {t.trial_id for t in trials} == set(before) and {t.status for t in trials} == {"TERMINATED"}
    for t in trials:  # each went on from its checkpoint as of the cancel, forked as before
        resumed = job.trial_metrics(t.trial_id)[len(before[t.trial_id]) :]
        last = before[t.trial_id][-1].metrics["step"]
        # The stop had Tune save the search then (Tune's own saves come every few seconds
        # at best, and would have the trials go on from an earlier report or from scratch);
        # a report under way as the stop came may be the one lost.
        assert resumed and resumed[0].metrics["started_at"] >= last - 1, (t.trial_id, last, resumed[0].metrics)
        assert resumed[0].metrics["step"] == resumed[0].metrics["started_at"] + 1
    assert job.logs().count("runs its function in forked process") >= 4  # both trials, both attempts
