"""PBT vs ASHA vs random search at the same budget: trial-epochs to reach a target, and
the best final metric, over several seeds.

    .venv/bin/python -m bench.pbt_vs_random                    # nqm task: its sweep, then 3 seeds
    .venv/bin/python -m bench.pbt_vs_random --sweep            # the nqm sweep of constant rates alone
    .venv/bin/python -m bench.pbt_vs_random --task triangle
    .venv/bin/python -m bench.pbt_vs_random --task digits --target 0.9

The tasks are in ``bench.pbt_tasks``. The default, ``nqm``, is the noisy quadratic
model, under which the best learning-rate schedule decays. Its target comes from the
task's physics, not from the searches: a sweep of constant rates over the whole search
range (19 rates x 3 noise seeds, the same model, optimizer and noise as a trial, the
whole budget each) finds the lowest loss any constant rate reaches in any report of the
budget; the target is 0.9 of it (the margin is about twice the reports' own noise).
Random search and ASHA try constant rates, so they are not expected to reach it;
a search that follows a decaying rate can.

Each algorithm gets the same budget (8 trials x the task's epochs, all trials at once)
and raydock's own search pieces for it (``tuning.search``: the parameter space, ASHA,
the recording PBT with its aligned population, ``SearchCallback`` telling the
population which trials run). Every report is one trial-epoch; the count is how many
trial-epochs the whole search had consumed, in the order Tune received them, when one
report first reached the target. A search stops there. A search that never reaches it
counts as the budget + 1, so the ratio of a search that does to one that does not is
an upper bound of the true ratio.

For PBT it also checks, from the search's own events, that each clone continued its
donor's run: its first report is the donor's epoch + 1 and (nqm) the weights and
momentum it restored are the donor's at that epoch. PBT's count varies from run to run
with the same seed (seen 106 to 255 on nqm): Tune's asynchronous PBT ranks a trial when
its report arrives, against the others' scores from the point before, so the order in
which the aligned trials reach a point changes who clones whom.

It runs on Ray Tune directly, without the REST server, and each trial trains in its
Tune trainable's process instead of a TorchTrainer: starting a Ray Train run per trial
(and per PBT restart) costs 10-20 s here and would dominate a 2-core machine without
changing which epochs each algorithm spends.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from service.cluster.local_cluster import SINGLE_MACHINE_ENV, start_head
from service.cluster.ray_backend import ray_auth_token

if ray_auth_token():
    # Ray reads its auth mode when it is imported: a head with a token needs it on.
    os.environ.setdefault("RAY_AUTH_MODE", "token")
# Read when Ray is imported too: the private head listens on 127.0.0.1 only.
os.environ.update(SINGLE_MACHINE_ENV)

import ray  # noqa: E402
from ray import tune  # noqa: E402

from api.schemas import Event
from bench.pbt_tasks import NQM_RATES, TASKS, TRIALS, Task, sweep_nqm
from tuning.population import Population
from tuning.search import aligned, param_space, scheduler, searcher
from tuning.search_events import SearchCallback, SearchEvents

ALGORITHMS = ("random", "asha", "pbt")
SWEEP_RATES, SWEEP_SEEDS, TARGET_MARGIN = 19, 3, 0.9


class Count(tune.Stopper):
    """Trial-epochs consumed, in arrival order, until the first report at the target;
    then stops the search. Tune calls a stopper once per result it processes."""

    def __init__(self, task: Task, target: float) -> None:
        self.task, self.target, self.seen, self.reached_at = task, target, set(), None

    def __call__(self, trial_id: str, result: dict) -> bool:
        # A function trainable's exit repeats its last result: count each report once.
        key = (trial_id, result.get("epoch"), result.get("time_total_s"))
        if key not in self.seen:
            self.seen.add(key)
            if self.reached_at is None and self.task.reached(result[self.task.metric], self.target):
                self.reached_at = len(self.seen)
        return result["epoch"] >= self.task.epochs

    def stop_all(self) -> bool:
        return self.reached_at is not None


@dataclass
class Outcome:
    reached: int | None  # trial-epochs when the target was first reached
    wall_s: float
    best: float  # best metric of a trial's last report
    clones: str = ""  # PBT: how many clones were seen continuing their donor's run


def clone_check(events: list[Event], metric: str) -> str:
    reports = [e for e in events if e.type == "trial_metric"]
    exploits = [e for e in events if e.type == "exploit"]
    seen = carried = 0
    for x in exploits:
        donor = [
            r.metrics
            for r in reports
            if r.trial_id == x.donor_trial_id and r.seq < x.seq and r.metrics.get("epoch") == x.donor_time
        ]
        after = next((r.metrics for r in reports if r.trial_id == x.trial_id and r.seq > x.seq), None)
        if not donor or after is None:
            continue  # the search stopped before the clone reported
        seen += 1
        same = after["epoch"] == x.donor_time + 1
        if "restored_loss" in after:
            same = (
                same
                and math.isclose(after["restored_loss"], donor[-1][metric], rel_tol=1e-6)
                and after["restored_momentum"] > 0
            )
        carried += same
    return f"{len(exploits)} exploits; {carried}/{seen} clones that reported continued their donor's weights and state"


def run_one(task: Task, algorithm: str, seed: int, target: float, storage: str) -> Outcome:
    spec = task.spec_for(algorithm, seed)
    events: list[Event] = []
    out = SearchEvents(spec.metric, spec.mode, sink=events.append)
    out.population = Population.remote() if aligned(spec) else None
    count = Count(task, target)
    trainable = tune.with_parameters(task.train, spec=spec.model_dump(mode="json"), population=out.population)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 0.25}),
        param_space=param_space(spec),
        tune_config=tune.TuneConfig(
            metric=spec.metric,
            mode=spec.mode,
            num_samples=spec.num_trials,
            scheduler=scheduler(spec, out),
            search_alg=searcher(spec),
            reuse_actors=False,  # seeded: carries the limit
        ),
        run_config=tune.RunConfig(
            name=f"{task.name}-{algorithm}-{seed}",
            storage_path=storage,
            stop=count,
            verbose=0,
            callbacks=[SearchCallback(out)],
        ),
    )
    t0 = time.perf_counter()
    results = tuner.fit()
    best = task.best([(r.metrics or {}).get(spec.metric, math.nan) for r in results if r.metrics])
    clones = clone_check(events, spec.metric) if algorithm == "pbt" else ""
    return Outcome(count.reached_at, time.perf_counter() - t0, best, clones)


def nqm_target() -> float:
    """The sweep of constant rates, printed; the target it gives."""
    rates = [NQM_RATES[0] * (NQM_RATES[1] / NQM_RATES[0]) ** (i / (SWEEP_RATES - 1)) for i in range(SWEEP_RATES)]
    t0 = time.perf_counter()
    losses = sweep_nqm(rates, SWEEP_SEEDS)
    epochs = TASKS["nqm"].epochs
    print(
        f"nqm: constant rates over the search range, {SWEEP_SEEDS} noise seeds each, {epochs} epochs ({time.perf_counter() - t0:.0f}s)"
    )
    print(
        f"{'lr':>9s}{'epoch 5':>10s}{'epoch 10':>10s}{'epoch 20':>10s}{'epoch 40':>10s}{'lowest report':>15s}  (mean over seeds)"
    )
    for lr, runs in zip(rates, losses):
        mean = [statistics.fmean(run[e - 1] for run in runs) for e in (5, 10, 20, epochs)]
        print(f"{lr:9.5f}" + "".join(f"{m:10.3f}" for m in mean) + f"{min(min(run) for run in runs):15.3f}")
    lowest = min(min(min(run) for run in runs) for runs in losses)
    best_lr = min(zip(rates, losses), key=lambda p: min(min(run) for run in p[1]))
    ends = [run[-1] for run in best_lr[1]]
    target = round(TARGET_MARGIN * lowest, 3)
    print(
        f"lowest loss any constant rate reached: {lowest:.3f} (lr {best_lr[0]:.5f}; its last reports {', '.join(f'{e:.3f}' for e in ends)})"
    )
    print(
        f"target: {TARGET_MARGIN:g} x {lowest:.3f} = {target:g}, a loss no constant rate in the range reaches within the budget\n",
        flush=True,
    )
    return target


def print_table(task: Task, target: float, rows: dict[str, list[Outcome]], seeds: int) -> None:
    budget = TRIALS * task.epochs
    sign = "<=" if task.mode == "min" else ">="

    def cost(o: Outcome) -> int:
        return o.reached if o.reached is not None else budget + 1  # not reached: counted as past the budget

    print(
        f"\n{task.name}: trial-epochs to {task.metric} {sign} {target:g} (budget {TRIALS} trials x {task.epochs} epochs = {budget}; '>' = not reached)"
    )
    header = f"{'algorithm':10s}" + "".join(f"{'seed ' + str(s):>9s}" for s in range(seeds))
    print(header + f"{'median':>9s}{'vs random':>11s}{'best (median)':>15s}{'goal':>12s}")
    base = statistics.median(cost(o) for o in rows["random"])
    for algorithm in ALGORITHMS:
        cells = "".join(
            f"{(str(o.reached) if o.reached is not None else '>' + str(budget)):>9s}" for o in rows[algorithm]
        )
        med = statistics.median(cost(o) for o in rows[algorithm])
        best = statistics.median(o.best for o in rows[algorithm])
        goal = "<= 0.50x" if algorithm == "pbt" else ""
        print(f"{algorithm:10s}{cells}{med:>9g}{med / base:>10.2f}x{best:>15.4f}{goal:>12s}")
    print(
        f"best: the best {task.metric} of a trial's last report when the search stopped (at the target, or at the end of the budget)"
    )
    print("best final metric per seed: " + json.dumps({a: [round(o.best, 4) for o in rows[a]] for a in ALGORITHMS}))
    print(json.dumps({a: [o.reached for o in rows[a]] for a in ALGORITHMS}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="nqm")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--target", type=float, default=None, help="default: the task's (nqm: from its sweep)")
    parser.add_argument(
        "--sweep", action="store_true", help="nqm: print the sweep of constant rates and its target, then stop"
    )
    parser.add_argument("--cpus", type=int, default=4, help="logical CPUs of the private Ray head")
    args = parser.parse_args()
    task = TASKS[args.task]
    target = args.target
    if target is None or args.sweep:
        target = nqm_target() if task.name == "nqm" else task.target
        if args.sweep:
            return
    print(f"load average before the searches: {', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rows: dict[str, list[Outcome]] = {a: [] for a in ALGORITHMS}
    with tempfile.TemporaryDirectory() as tmp:
        # A private head on ports of its own: ray.init() alone would join whatever
        # cluster was started last on this machine.
        head = start_head(Path(tmp) / "ray", num_cpus=args.cpus)
        # Tune takes SIGINT for itself; a SIGTERM still stops the private head below.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            ray.init(address=head.gcs_address, log_to_driver=False, configure_logging=False)
            for seed in range(args.seeds):
                for algorithm in ALGORITHMS:
                    o = run_one(task, algorithm, seed, target, str(Path(tmp) / "storage"))
                    rows[algorithm].append(o)
                    shown = o.reached if o.reached is not None else f">{TRIALS * task.epochs}"
                    print(
                        f"seed {seed} {algorithm:6s} trial-epochs to {target:g}: {shown:>5}  best {task.metric} {o.best:.4f}  "
                        f"({o.wall_s:.0f}s) {o.clones}",
                        flush=True,
                    )
        finally:
            ray.shutdown()
            head.stop()
    print_table(task, target, rows, args.seeds)
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
