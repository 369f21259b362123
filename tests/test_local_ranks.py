"""The single-node rank runner: which jobs it serves, what their Ray job holds, and on
the session cluster a user loop on the Ray Train API run as local ranks, a rank killed
mid-job, a cancel, and an elastic job that keeps Ray Train's worker actors."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api.client import Client
from api.local_ranks import cold_reason
from api.schemas import ClusterInfo, NodeInfo, TrainSpec
from bench.harness.specs import digits_spec
from bench.harness.waiting import wait_for
from service.cluster.ray_backend import entrypoint_resources
from service.scheduling.node_fit import one_node_holds
from service.scheduling.rank_plan import entrypoint_resources as planned
from service.settings import Settings
from tests.support.specs import user_spec


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (from /proc)."""
    parents = {int(p.name): _ppid(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()}
    out, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - out
        out |= frontier
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _spec(**overrides) -> TrainSpec:
    return TrainSpec.model_validate(digits_spec(**overrides))


def _cluster(*nodes: dict[str, float]) -> ClusterInfo:
    return ClusterInfo(
        address="http://ray:8265",
        nodes=[
            NodeInfo(
                node_id=f"n{i}",
                ip="10.0.0.1",
                alive=True,
                is_head=i == 0,
                cpus=n.get("CPU", 0),
                gpus=n.get("GPU", 0),
                resources=n,
            )
            for i, n in enumerate(nodes)
        ],
        cpus_total=sum(n.get("CPU", 0) for n in nodes),
        cpus_free=0,
        gpus_total=0,
        gpus_free=0,
    )


class _Backend:
    """What rank_plan reads of the backend: the cluster admission saw last."""

    def __init__(self, info: ClusterInfo) -> None:
        self.last_cluster = (0.0, info)


# ----------------------------------------------------------------------------- which jobs


def test_a_fixed_ddp_job_runs_as_local_ranks_and_what_needs_ray_train_does_not():
    assert cold_reason(_spec()) is None
    assert cold_reason(_spec(parallelism={"strategy": "fsdp"})) is None
    data = {"source": "csv", "path": "/data/t.csv", "label_column": "y"}
    cold = {
        "elastic": _spec(scaling={"num_workers": {"min": 1, "max": 2}}),
        "Ray Data": _spec(data=data),
        "actors": _spec(parallelism={"strategy": "parameter_server"}),
        "spreads": _spec(scaling={"num_workers": 2, "placement_strategy": "SPREAD"}),
        "custom resources": _spec(scaling={"num_workers": 2, "resources_per_worker": {"slot": 1}}),
        "one GPU each": _spec(scaling={"num_workers": 2, "gpus_per_worker": 0.5}),
    }
    for what, spec in cold.items():
        assert cold_reason(spec) is not None, what
    # A job whose code calls Ray's core API says so.
    assert "scaling.local_ranks false" in cold_reason(_spec(scaling={"num_workers": 2, "local_ranks": False}))


RAY_CALLS = """
import sys
import ray
from trainers import ray_compat

ray_compat.refuse_ray_calls("why: not a Ray worker")
calls = {
    "put": lambda: ray.put(1),
    "get": lambda: ray.get([]),
    "task": lambda: ray.remote(lambda: 1).remote(),
    "actor": lambda: ray.remote(type("A", (), {})).remote(),
    "runtime_context": lambda: ray.get_runtime_context(),
    "data": lambda: __import__("ray.data").data.range(3),
    "placement_group": lambda: __import__("ray.util").util.placement_group([{"CPU": 1}]),
    "init": lambda: ray.init(),
}
for name, call in calls.items():
    try:
        call()
    except Exception as exc:
        print(name, type(exc).__name__, "why: not a Ray worker" in str(exc))
    else:
        print(name, "ran")
print("initialized", ray.is_initialized())
"""


@pytest.mark.slow  # a Python of its own importing Ray (no cluster)
def test_a_forked_processs_ray_calls_raise_rather_than_start_a_driver_of_their_own(tmp_path):
    # A process raydock forked is no Ray worker: without the refusal, ray.put would run
    # ray.init() and make it the driver of a Ray job of its own (here: a new local
    # cluster, as RAY_ADDRESS is unset; on a cluster, an untracked job on it).
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env["RAY_TMPDIR"] = str(tmp_path)  # were a cluster started, it would be here
    out = subprocess.run(
        [sys.executable, "-c", RAY_CALLS], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout.split("\n")
    results = dict(line.split(" ", 1) for line in out if line)
    assert results.pop("initialized") == "False"
    for name in ("put", "get", "task", "actor", "runtime_context", "data", "init"):
        assert results[name] == "RayNotHere True", (name, results)
    assert results["placement_group"].startswith("RaySystemError"), results  # Ray's own words: not started
    assert not list(tmp_path.iterdir()), "a Ray cluster was started"


def test_the_driver_holds_every_worker_when_one_node_fits_them_and_nothing_otherwise():
    two_cpus = _spec(scaling={"num_workers": 2, "cpus_per_worker": 1, "memory_per_worker": "1GiB"})
    on = Settings(startup={"local_ranks": True})
    fits = _Backend(_cluster({"CPU": 4, "memory": 8 * 2**30}))
    assert planned(two_cpus, on, fits) == {"CPU": 2.0, "memory": 2.0 * 2**30}
    # Two nodes of 1 CPU hold the workers between them but not on one: worker actors.
    assert planned(two_cpus, on, _Backend(_cluster({"CPU": 1}, {"CPU": 1}))) is None
    assert planned(two_cpus, Settings(startup={"local_ranks": False}), fits) is None
    assert planned(_spec(scaling={"num_workers": {"min": 1, "max": 2}}), on, fits) is None
    gpus = TrainSpec.model_validate(
        digits_spec(scaling={"num_workers": 2, "use_gpu": True, "accelerator_type": "H100"})
    )
    held = one_node_holds(gpus.scaling, _cluster({"CPU": 8, "GPU": 2, "accelerator_type:H100": 1}))
    assert held == {"CPU": 2.0, "GPU": 2.0, "accelerator_type:H100": 0.001}


def test_the_held_resources_become_the_ray_jobs_entrypoint_arguments():
    assert entrypoint_resources({}) == {}
    assert entrypoint_resources({"CPU": 2.0, "GPU": 2.0, "memory": 2.0 * 2**30, "accelerator_type:H100": 0.001}) == {
        "entrypoint_num_cpus": 2.0,
        "entrypoint_num_gpus": 2.0,
        "entrypoint_memory": 2 * 2**30,
        "entrypoint_resources": {"accelerator_type:H100": 0.001},
    }


# ----------------------------------------------------------------------------- on the cluster


def test_a_user_loop_on_the_ray_train_api_runs_as_local_ranks_and_a_killed_rank_resumes(client: Client):
    spec = user_spec("userpkg.ray_api:train", config={"epochs": 6, "sleep_s": 0.5}, failure={"max_retries": 1})
    job = client.submit(spec)
    first = wait_for(lambda: job.metrics(), 120, "first report")[0].metrics
    assert first["context"] == "LocalTrainContext", first  # not a Ray Train worker actor
    assert (first["world_size"], first["rows"]) == (2, 32)  # the sampler gave each rank half
    wait_for(lambda: any(p.metrics["epoch"] >= 2 for p in job.metrics()), 60, "a checkpoint to resume from")
    os.kill(int(first["pid"]), signal.SIGKILL)  # rank 0
    job.wait(timeout=180)
    assert job.status.value == "SUCCEEDED", job.info.error
    last = job.metrics()[-1].metrics
    assert last["epoch"] == 6 and last["resumed_from"] >= 2  # from its checkpoint, not from scratch
    assert last["pid"] != first["pid"]
    assert job.info.restarts_total == 1
    assert "SIGKILL" in job.info.restarts[0].reason


def test_a_loop_that_calls_ray_fails_as_local_ranks_saying_how_and_runs_on_ray_workers_when_its_job_says(
    client: Client,
):
    job = client.submit(user_spec("userpkg.ray_api:calls_ray"))
    job.wait(timeout=180)
    assert job.status.value == "FAILED"
    assert "scaling.local_ranks: false" in job.info.error and "nobody tracks" in job.info.error, job.info.error
    assert job.info.failure_cause.value == "USER_CODE"
    job = client.submit(user_spec("userpkg.ray_api:calls_ray", scaling={"num_workers": 1, "local_ranks": False}))
    job.wait(timeout=300)
    assert job.status.value == "SUCCEEDED", job.info.error
    (report,) = [p.metrics for p in job.metrics()]
    assert report["value"] == 42 and report["context"] != "LocalTrainContext", report  # a Ray Train worker


def test_a_cancelled_local_ranks_job_leaves_no_process_behind(client: Client):
    job = client.submit(user_spec("userpkg.ray_api:train", config={"epochs": 10_000, "sleep_s": 0.2}))
    pid = int(wait_for(lambda: job.metrics(), 120, "first report")[0].metrics["pid"])
    driver = _ppid(pid)
    family = {driver, *_descendants(driver)}
    assert len(family) >= 3, family  # the driver and its two ranks
    job.cancel()
    wait_for(lambda: job.refresh().status.is_terminal(), 60, "cancel to finish")
    assert job.status.value == "CANCELLED"
    deadline = time.monotonic() + 30
    while (alive := [p for p in family if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive, alive


@pytest.mark.long  # Ray Train's controller and worker actors: the cold path's start-up, tens of seconds
def test_an_elastic_job_keeps_ray_trains_worker_actors(client: Client):
    job = client.submit(
        user_spec("userpkg.ray_api:train", config={"epochs": 2}, scaling={"num_workers": {"min": 1, "max": 2}})
    )
    job.wait(timeout=240)
    assert job.status.value == "SUCCEEDED", job.info.error
    assert job.metrics()[-1].metrics["context"] == "DistributedTrainContext"


RUN_RANKS = """
import sys
from api.schemas import TrainSpec
from tests.support.specs import user_spec
from trainers.ranks import RankRunner
spec = TrainSpec.model_validate(user_spec("userpkg.ray_api:train", config={"epochs": 10000, "sleep_s": 0.2}))
RankRunner(spec, "orphans", sys.argv[1]).fit()
"""


@pytest.mark.slow  # imports torch and Ray Train in a driver of its own (no cluster)
def test_ranks_die_with_a_driver_killed_outright(tmp_path):
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests/fixtures/usercode")])}
    driver = subprocess.Popen(
        [sys.executable, "-c", RUN_RANKS, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True, cwd=root
    )
    ranks: set[int] = set()
    try:
        for line in driver.stdout:  # the ranks run once rank 0 has reported
            if '"type":"metric"' in line:
                break
        ranks = _descendants(driver.pid)
        assert len(ranks) >= 2, ranks
        driver.kill()  # no stop, no finally: only the ranks' parent-death signal is left
        driver.wait(timeout=30)
        deadline = time.monotonic() + 20
        while (alive := [p for p in ranks if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive, alive
    finally:
        driver.kill()
        for pid in ranks | _descendants(driver.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
