"""How warm a PBT search is: raydock's search beside the same search written by hand with
Ray Tune, on one cluster, in one run, each figure beside its target.

    .venv/bin/python -m bench.pbt_warm                    # about 10 min on 2 cores
    .venv/bin/python -m bench.pbt_warm --quick            # smaller searches, a few minutes
    .venv/bin/python -m bench.pbt_warm --ray-address http://127.0.0.1:8265   # a running cluster

Starts a Ray head (2 CPUs) and a raydock server on it (or puts the server on the cluster
whose dashboard ``--ray-address`` names), runs a warm-up search, then on two tasks:

- the digits PBT example (``examples/digits-pbt.yaml``: 4 trials, each a Train loop of
  the built-in MLP; ``--quick``: 4 epochs instead of 8);
- the noisy quadratic of ``bench.pbt_vs_random`` as a Ray Tune function trainable
  (``bench.pbt_tasks.nqm_function``, ``trainable: function``; 8 trials x 40 epochs, a
  perturbation every ``--nqm-interval`` epochs; ``--quick``: 4 trials x 20 epochs),

it prints, each beside its target:

- POST -> first trial metric (the client polling GET /v1/jobs/{id}/trials; target <= 5 s);
- exploit decision -> the exploited trial's next report, from the trial phases the server
  stores (GET /v1/jobs/{id}/trials: ``exploit_phases``; median and worst; target <= 1 s),
  with the pause, restore and first step after it;
- the search's wall time (POST -> terminal status) against the same PBT search written by
  hand (``bench.pbt_by_hand``), submitted as a Ray job to the same cluster with Ray's
  job submission client (submit -> terminal status; target <= 1.1x);

and, on the noisy quadratic, trial-epochs to its target of PBT against random search
(``bench.pbt_vs_random``'s sweep and searches, on Tune directly; target <= 0.5x).

What the hand-written script does differently from raydock's search: its trials train in
Tune's trainable process itself (raydock's in a process forked by the trainable's rank host,
a child of the node's warm process with torch imported: the digits trials' local rank under
Ray Train's local mode, the nqm trials' function in a Tune session of its own; the script
trains the same model, data, optimizer and batches without DDP); Tune's
synchronous PBT holds the population at each perturbation point (raydock's digits search
holds its Train loops there with its own population actor and Tune's asynchronous PBT;
its function trainables use Tune's synchronous PBT too); nothing streams events to a
server, no launch file, no first-report watchdog, checkpoints stay in a local directory
(raydock's in the job's storage prefix). It starts a fresh trainable per trial start and
restart (Tune's default ``reuse_actors=False``); raydock's searches keep their trainables
between trials and restarts (``reuse_actors``), its paused nqm trials' trainables waiting
for their restarts, and fork each start afresh. Both run Tune's
synchronous PBT with raydock's two fixes for its waits for ever (``tuning.schedulers``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from api.schemas import TuneSpec
from bench import pbt_vs_random
from bench.figures import ROWS, row
from bench.harness.servers import REPO, ServerProcess
from bench.pbt_tasks import NQM, NQM_RATES, TASKS
from service.cluster.local_cluster import start_head

FIRST_METRIC_S, EXPLOIT_S, WALL_RATIO, EPOCHS_RATIO = 5.0, 1.0, 1.1, 0.5
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
EXAMPLE = REPO / "examples" / "digits-pbt.yaml"
NQM_CODE = REPO / "bench" / "tune_functions"
NQM_CPUS_PER_TRIAL = 0.25
EXPLOIT_PHASES = ("paused", "restored", "first_step", "first_metric")


@dataclass
class SearchRun:
    job_id: str
    status: str
    first_metric_s: float | None  # POST -> the first trial report the client saw
    wall_s: float  # POST -> terminal status
    trials: list[dict[str, Any]] = field(default_factory=list)


# ----------------------------------------------------------------------------- the searches


def digits_spec(quick: bool) -> dict[str, Any]:
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["name"] = "pbt-warm-digits"
    if quick:
        spec["budget"] = {"epochs": 4}
    return spec


def nqm_spec(quick: bool, interval: int) -> dict[str, Any]:
    trials, epochs = (4, 20) if quick else (8, NQM.epochs)
    return {
        "kind": "tune",
        "name": "pbt-warm-nqm",
        "trainable": "function",
        "base": {
            "entrypoint": "nqm:train",
            "working_dir": str(NQM_CODE),
            "config": {"lr": 1e-3, "seed": 0},
            "scaling": {"cpus_per_worker": NQM_CPUS_PER_TRIAL},
        },
        "search_space": {"config.lr": {"type": "loguniform", "low": NQM_RATES[0], "high": NQM_RATES[1]}},
        "algorithm": "pbt",
        "metric": NQM.metric,
        "mode": NQM.mode,
        "num_trials": trials,
        "budget": {"epochs": epochs},
        "seed": 0,
        "pbt": {**NQM.pbt, "perturbation_interval": min(interval, epochs // 2)},
    }


def by_hand_args(task: str, spec: dict[str, Any], storage: str) -> list[str]:
    """The hand-written script's flags for the same search as ``spec``."""
    search = TuneSpec.model_validate(spec)
    (lr,) = search.search_space.values()
    cpus = (
        search.base.scaling.cpus_per_worker
        if search.trainable == "function"
        else search.driver_cpus_per_trial + search.base.scaling.cpus_per_worker * search.base.scaling.max_workers
    )
    args = [
        f"--task={task}",
        f"--trials={search.num_trials}",
        f"--epochs={search.budget.epochs}",
        f"--interval={search.pbt.perturbation_interval}",
        f"--quantile={search.pbt.quantile_fraction}",
        f"--resample={search.pbt.resample_probability}",
        "--factors",
        *(str(f) for f in search.pbt.perturbation_factors),
        f"--low={lr.low}",
        f"--high={lr.high}",
        f"--seed={search.seed or 0}",
        f"--cpus-per-trial={cpus}",
        f"--metric={search.metric}",
        f"--mode={search.mode}",
        f"--storage={storage}",
    ]
    if task == "digits":
        args.append("--base=" + json.dumps(spec["base"], separators=(",", ":")))
    return args


def run_search(http: httpx.Client, spec: dict[str, Any], timeout: float, poll_s: float = 0.1) -> SearchRun:
    t0 = time.perf_counter()
    job_id = http.post("/v1/jobs", json=spec).raise_for_status().json()["id"]
    first, status = None, "QUEUED"
    deadline = time.monotonic() + timeout
    try:
        while status not in TERMINAL:
            if first is None and any(t["reports"] for t in http.get(f"/v1/jobs/{job_id}/trials").json()):
                first = time.perf_counter() - t0
            status = http.get(f"/v1/jobs/{job_id}").json()["status"]
            if time.monotonic() > deadline:
                raise RuntimeError(f"search {job_id} still {status} after {timeout:g}s")
            if status not in TERMINAL:
                time.sleep(poll_s if first is None else 0.25)  # the end needs no finer grain
    finally:
        if status not in TERMINAL:  # a timeout or an interrupt: the cluster is left free
            http.post(f"/v1/jobs/{job_id}/cancel")
    wall = time.perf_counter() - t0
    return SearchRun(job_id, status, first, wall, http.get(f"/v1/jobs/{job_id}/trials").json())


def run_by_hand(dashboard_url: str, args: list[str], timeout: float) -> tuple[float, dict[str, Any]]:
    """Submit -> terminal status of the hand-written search, and the line it printed."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(dashboard_url)
    entrypoint = shlex.join([sys.executable, "-m", "bench.pbt_by_hand", *args])
    t0 = time.perf_counter()
    submitted = time.time()
    job = client.submit_job(entrypoint=entrypoint, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    deadline = time.monotonic() + timeout
    ended = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)
    status = None
    try:
        while (status := client.get_job_status(job)) not in ended:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the hand-written search still {status} after {timeout:g}s")
            time.sleep(0.1)
    finally:
        if status not in ended:
            client.stop_job(job)
    wall = time.perf_counter() - t0
    logs = client.get_job_logs(job)
    line = next((x for x in reversed(logs.splitlines()) if x.startswith("pbt_by_hand: ")), None)
    if status != JobStatus.SUCCEEDED or line is None:
        raise RuntimeError(f"the hand-written search ended {status}:\n{logs[-3000:]}")
    out = json.loads(line.removeprefix("pbt_by_hand: "))
    out["first_result_s"] = out["first_result_unix"] - submitted if out.get("first_result_unix") else None
    return wall, out


# ----------------------------------------------------------------------------- figures


def exploit_delays(trials: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each phase of every exploit the trials recorded, in seconds after its decision."""
    out: dict[str, list[float]] = {p: [] for p in EXPLOIT_PHASES}
    for trial in trials:
        for exploit in trial.get("exploit_phases") or []:
            for phase in EXPLOIT_PHASES:
                if exploit.get(phase) is not None:
                    out[phase].append(float(exploit[phase]))
    return out


def median_max(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s median, {max(values):.2f} s worst (n={len(values)})" if values else "-"


def search_figures(task: str, run: SearchRun, hand_wall: float, hand: dict[str, Any]) -> dict[str, Any]:
    if run.status != "SUCCEEDED":
        row(f"{task}: raydock search", run.status, "SUCCEEDED", False)
    first = run.first_metric_s
    row(
        f"{task}: POST -> first trial metric",
        f"{first:.2f} s" if first is not None else "none",
        f"<= {FIRST_METRIC_S:g} s",
        first is not None and first <= FIRST_METRIC_S,
    )
    if hand.get("first_result_s") is not None:
        print(f"  (Tune by hand: submit -> first trial result {hand['first_result_s']:.2f} s)")
    delays = exploit_delays(run.trials)
    reports = delays["first_metric"]
    row(
        f"{task}: exploit decision -> the trial's next report",
        median_max(reports),
        f"<= {EXPLOIT_S:g} s",
        bool(reports) and statistics.median(reports) <= EXPLOIT_S,
    )
    for phase in EXPLOIT_PHASES[:-1]:
        print(f"  exploit decision -> {phase}: {median_max(delays[phase])}")
    ratio = run.wall_s / hand_wall
    row(
        f"{task}: search wall time, raydock / Tune by hand",
        f"{run.wall_s:.1f} s / {hand_wall:.1f} s = {ratio:.2f}x",
        f"<= {WALL_RATIO:g}x",
        ratio <= WALL_RATIO,
    )
    print(f"  (Tune by hand inside its job: Tuner.fit {hand['fit_s']:.1f} s, {hand['exploits']} exploits)")
    return {
        "job_id": run.job_id,
        "status": run.status,
        "first_metric_s": first,
        "exploit_phases_s": delays,
        "wall_s": run.wall_s,
        "by_hand_wall_s": hand_wall,
        "by_hand": hand,
        "wall_ratio": ratio,
    }


def trial_epochs(gcs_address: str | None, seeds: int, storage: Path) -> dict[str, Any]:
    """``bench.pbt_vs_random`` on the noisy quadratic: its sweep's target, then random
    search and PBT for ``seeds`` seeds, on Tune directly (a private head without one)."""
    import ray  # after bench.pbt_vs_random, which sets what Ray reads at its import

    task = TASKS["nqm"]
    target = pbt_vs_random.nqm_target()
    head = None
    if gcs_address is None:
        head = start_head(storage / "ray-epochs", num_cpus=4)
        gcs_address = head.gcs_address
    rows: dict[str, list[pbt_vs_random.Outcome]] = {"random": [], "pbt": []}
    try:
        ray.init(address=gcs_address, log_to_driver=False, configure_logging=False)
        for seed in range(seeds):
            for algorithm in rows:
                o = pbt_vs_random.run_one(task, algorithm, seed, target, str(storage / "epochs"))
                rows[algorithm].append(o)
                print(
                    f"  seed {seed} {algorithm:6s}: trial-epochs to {target:g} {o.reached} ({o.wall_s:.0f}s) {o.clones}"
                )
    finally:
        ray.shutdown()
        if head is not None:
            head.stop()
    budget = pbt_vs_random.TRIALS * task.epochs

    def cost(o: pbt_vs_random.Outcome) -> int:
        return o.reached if o.reached is not None else budget + 1  # not reached: past the budget

    medians = {a: statistics.median(cost(o) for o in runs) for a, runs in rows.items()}
    ratio = medians["pbt"] / medians["random"]
    shown = {a: (f"{m:g}" if m <= budget else f">{budget}") for a, m in medians.items()}
    row(
        "nqm: trial-epochs to target, PBT / random",
        f"{shown['pbt']} / {shown['random']} = {'<=' if medians['random'] > budget else ''}{ratio:.2f}x",
        f"<= {EPOCHS_RATIO:g}x",
        ratio <= EPOCHS_RATIO,
    )
    return {"target": target, "reached": {a: [o.reached for o in runs] for a, runs in rows.items()}, "ratio": ratio}


# ----------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller searches and no warm-up of its own size")
    parser.add_argument("--ray-address", help="a running cluster's dashboard URL (default: a head of its own)")
    parser.add_argument("--gcs-address", help="with --ray-address: its GCS, for the trial-epochs searches")
    parser.add_argument("--cpus", type=int, default=2, help="logical CPUs of the head it starts")
    parser.add_argument("--tasks", nargs="+", choices=("digits", "nqm"), default=["digits", "nqm"])
    parser.add_argument("--nqm-interval", type=int, default=8, help="the nqm search's perturbation interval")
    parser.add_argument("--seeds", type=int, default=1, help="trial-epochs: seeds of random search and PBT")
    parser.add_argument("--no-epochs", action="store_true", help="leave out trial-epochs to target")
    parser.add_argument("--no-warm-up", action="store_true", help="no warm-up search (first figures are cold)")
    parser.add_argument("--timeout", type=float, default=900, help="longest one search may take")
    args = parser.parse_args()
    # Every process of the cluster imports bench.pbt_tasks (the hand-written script, nqm's trials).
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(REPO), *paths]))
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    specs = {"digits": digits_spec(args.quick), "nqm": nqm_spec(args.quick, args.nqm_interval)}
    report: dict[str, Any] = {"quick": args.quick}
    print(__doc__.strip().split("\n\n")[-1] + "\n", flush=True)  # what the hand-written search does differently
    ROWS.clear()
    print("what | figure | bound | ok/FAIL")
    # A SIGTERM (a timeout) still stops the server and the head below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="raydock-pbt-warm-") as tmp_name:
        tmp = Path(tmp_name)
        head = None
        dashboard, gcs = args.ray_address, args.gcs_address
        try:
            if dashboard is None:
                head = start_head(tmp / "ray", num_cpus=args.cpus)
                dashboard, gcs = head.dashboard_url, head.gcs_address
            server = ServerProcess(tmp / "server", dashboard)
            try:
                http = httpx.Client(base_url=server.start().url, timeout=30)
                if not args.no_warm_up:
                    warm_up = specs["nqm"] if args.quick else specs["digits"]
                    done = run_search(http, {**warm_up, "name": "pbt-warm-warm-up"}, args.timeout)
                    print(f"  warm-up search ({warm_up['name']}): {done.status} in {done.wall_s:.0f} s", flush=True)
                    report["warm_up_s"] = done.wall_s
                for task in args.tasks:
                    run = run_search(http, specs[task], args.timeout)
                    hand_args = by_hand_args(task, specs[task], str(tmp / "by-hand"))
                    hand_wall, hand = run_by_hand(dashboard, hand_args, args.timeout)
                    report[task] = search_figures(task, run, hand_wall, hand)
            finally:
                server.stop()
            if not args.no_epochs:
                report["nqm_trial_epochs"] = trial_epochs(gcs, args.seeds, tmp)
        finally:
            if head is not None:
                head.stop()
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(json.dumps(report, default=str))
    return sum(1 for *_, ok in ROWS if not ok)


if __name__ == "__main__":
    sys.exit(main())
