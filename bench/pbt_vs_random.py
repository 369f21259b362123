"""PBT vs ASHA vs random search at the same budget: trial-epochs to reach a target, and
the best final metric, over several seeds.

    .venv/bin/python -m bench.pbt_vs_random                          # triangle task, 3 seeds
    .venv/bin/python -m bench.pbt_vs_random --task digits --target 0.9

Two tasks:

- ``triangle`` (default): Ray's toy for schedules (``ray/tune/examples/pbt_function.py``).
  Accuracy grows fastest at an optimal learning rate that rises and then falls with the
  accuracy itself (a triangle wave from 0.001 up to 0.01 and back); a rate more than 3x
  off gains nothing, one too high loses accuracy. No fixed rate gets far: only a rate
  that follows the schedule does. 8 trials x 40 epochs of 10 toy steps, searching
  ``config.lr`` log-uniform in 0.0001..0.02; metric ``mean_accuracy``.
- ``digits``: the built-in CNN on the digits data with SGD, searching the learning rate
  (log-uniform 0.01..1) and momentum (0.5..0.99), 8 trials x 12 epochs. Too easy and too
  short for a schedule to matter: every algorithm needs about the same trial-epochs.

Each algorithm gets the same budget (trials x epochs, all trials at once) and raydock's
own search pieces for it (``tuning.search``: the parameter space, ASHA, the recording
PBT with its aligned population). Every report is one trial-epoch; the count is how many
trial-epochs the whole search had consumed, in the order Tune received them, when one
report first reached the target. A search stops there.

It runs on Ray Tune directly, without the REST server, and each trial trains in its
Tune trainable's process instead of a TorchTrainer: starting a Ray Train run per trial
(and per PBT restart) costs 10-20 s here and would dominate a 2-core machine without
changing which epochs each algorithm spends. The schedulers and the search space are
the ones a ``kind: tune`` job uses.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from service.local_cluster import SINGLE_MACHINE_ENV, start_head
from service.ray_backend import ray_auth_token

if ray_auth_token():
    # Ray reads its auth mode when it is imported: a head with a token needs it on.
    os.environ.setdefault("RAY_AUTH_MODE", "token")
# Read when Ray is imported too: the private head listens on 127.0.0.1 only.
os.environ.update(SINGLE_MACHINE_ENV)

import ray  # noqa: E402
import torch  # noqa: E402
from ray import tune  # noqa: E402

from api.schemas import TuneSpec
from trainers.data import batches, load_arrays
from trainers.skeleton import build_optimizer, set_hyperparameters
from trainers.models import build_model
from tuning.population import Alignment, Population
from tuning.search import aligned, param_space, scheduler, searcher
from tuning.search_events import SearchEvents

TRIALS = 8
ALGORITHMS = ("random", "asha", "pbt")
EPOCHS = {"digits": 12, "triangle": 40}
METRIC = {"digits": "val_acc", "triangle": "mean_accuracy"}
TARGET = {"digits": 0.9, "triangle": 120.0}
TRIANGLE_STEPS_PER_EPOCH = 10


def algorithm_options(algorithm: str, task: str) -> dict[str, Any]:
    if algorithm == "asha":
        return {"asha": {"grace_period": 1, "reduction_factor": 2}}
    if algorithm == "pbt" and task == "triangle":
        # The rate must rise 10x and fall back within 40 epochs: a decision every epoch,
        # and steps large enough to follow it (Tune's default 1.2/0.8 needs 13 to rise 10x).
        return {"pbt": {
            "perturbation_interval": 1, "quantile_fraction": 0.25, "resample_probability": 0.25,
            "perturbation_factors": [1.5, 0.6],
        }}  # fmt: skip
    if algorithm == "pbt":
        return {"pbt": {"perturbation_interval": 2, "quantile_fraction": 0.25, "resample_probability": 0.25}}
    return {}


def spec_for(algorithm: str, seed: int, task: str = "digits") -> TuneSpec:
    common = {
        "kind": "tune", "algorithm": algorithm, "mode": "max", "metric": METRIC[task], "num_trials": TRIALS,
        "max_concurrent_trials": TRIALS, "budget": {"epochs": EPOCHS[task]}, "seed": seed, **algorithm_options(algorithm, task),
    }  # fmt: skip
    if task == "triangle":
        return TuneSpec.model_validate({
            **common,
            "base": {"entrypoint": "bench.pbt_vs_random:triangle", "config": {"lr": 0.001}, "scaling": {"num_workers": 1}},
            "search_space": {"config.lr": {"type": "loguniform", "low": 0.0001, "high": 0.02}},
        })  # fmt: skip
    return TuneSpec.model_validate({
        **common,
        "base": {
            "model": {"type": "cnn", "channels": [16, 32]},
            "data": {"source": "digits"},
            "optimizer": {"name": "sgd", "lr": 0.01},
            "batch_size": 64,
            "seed": seed,
            "scaling": {"num_workers": 1},
        },
        "search_space": {
            "optimizer.lr": {"type": "loguniform", "low": 0.01, "high": 1.0},
            "optimizer.momentum": {"type": "uniform", "low": 0.5, "high": 0.99},
        },
    })  # fmt: skip


def triangle_step(accuracy: float, lr: float, rng: random.Random) -> float:
    """One step of Ray's toy: the accuracy gain at ``lr`` given the current accuracy."""
    midpoint, q_tolerance, noise = 100.0, 3.0, 2.0
    optimal = 0.01 * accuracy / midpoint if accuracy < midpoint else 0.01 - 0.01 * (accuracy - midpoint) / midpoint
    optimal = min(0.01, max(0.001, optimal))
    q_err = max(lr, optimal) / min(lr, optimal)
    if q_err < q_tolerance:
        accuracy += rng.random() / q_err
    elif lr > optimal:
        accuracy -= (q_err - q_tolerance) * rng.random()
    return max(0.0, accuracy + rng.gauss(0.0, noise))


def train_triangle(config: dict, *, spec: dict, population=None) -> None:
    """One trial of the triangle task; its state is the accuracy, checkpointed each epoch."""
    search = TuneSpec.model_validate(spec)
    lr, epochs = float(config["config.lr"]), EPOCHS["triangle"]
    accuracy, epoch = 0.0, 0
    if (checkpoint := tune.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d:
            state = json.loads(Path(d, "state.json").read_text())
        accuracy, epoch = state["accuracy"], state["epoch"]
    rng = random.Random(hash((search.seed, tune.get_context().get_trial_id(), epoch)))
    align = None
    if population is not None:
        align = Alignment(population, tune.get_context().get_trial_id(), search.pbt.perturbation_interval, epochs)
    while epoch < epochs:
        for _ in range(TRIANGLE_STEPS_PER_EPOCH):
            accuracy = triangle_step(accuracy, lr, rng)
        epoch += 1
        with tempfile.TemporaryDirectory() as d:
            Path(d, "state.json").write_text(json.dumps({"accuracy": accuracy, "epoch": epoch}))
            tune.report({"epoch": epoch, "mean_accuracy": accuracy, "lr": lr}, checkpoint=tune.Checkpoint.from_directory(d))
        if align is not None:
            align.after_report(epoch)


def train_in_process(config: dict, *, spec: dict, population=None) -> None:
    """One trial: the built-in model and optimizer of trainers.skeleton, trained in this process."""
    search = TuneSpec.model_validate(spec)
    trial = search.trial_spec(config)
    torch.set_num_threads(1)
    torch.manual_seed(trial.seed)
    data = load_arrays(trial.data, trial.seed)
    model = build_model(trial.model, data.n_features, data.n_classes)
    opt = build_optimizer(trial.optimizer, model.parameters())
    epoch = 0
    if (checkpoint := tune.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        set_hyperparameters(opt, trial.optimizer)
        epoch = state["epoch"]
    align = None
    if population is not None:
        align = Alignment(population, tune.get_context().get_trial_id(), search.pbt.perturbation_interval, EPOCHS["digits"])
    while epoch < EPOCHS["digits"]:
        g = torch.Generator().manual_seed(trial.seed * 100_003 + epoch)
        for x, y in batches(data.x_train, data.y_train, trial.batch_size, g):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        epoch += 1
        with torch.no_grad():
            acc = (model(data.x_val).argmax(1) == data.y_val).float().mean().item()
        with tempfile.TemporaryDirectory() as d:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}, os.path.join(d, "state.pt"))
            tune.report({"epoch": epoch, "val_acc": acc, "lr": opt.param_groups[0]["lr"]}, checkpoint=tune.Checkpoint.from_directory(d))
        if align is not None:
            align.after_report(epoch)


class Count(tune.Stopper):
    """Trial-epochs consumed, in arrival order, until the first report at the target;
    then stops the search. Tune calls a stopper once per result it processes."""

    def __init__(self, target: float, metric: str, epochs: int) -> None:
        self.target, self.metric, self.epochs, self.seen, self.reached_at = target, metric, epochs, set(), None

    def __call__(self, trial_id: str, result: dict) -> bool:
        # A function trainable's exit repeats its last result: count each report once.
        key = (trial_id, result.get("epoch"), result.get("time_total_s"))
        if key not in self.seen:
            self.seen.add(key)
            if self.reached_at is None and result[self.metric] >= self.target:
                self.reached_at = len(self.seen)
        return result["epoch"] >= self.epochs

    def stop_all(self) -> bool:
        return self.reached_at is not None


def run_one(algorithm: str, seed: int, target: float, storage: str, task: str) -> tuple[int | None, float, float]:
    spec = spec_for(algorithm, seed, task)
    out = SearchEvents(spec.metric, spec.mode, sink=lambda event: None)
    population = Population.remote() if aligned(spec) else None
    count = Count(target, spec.metric, EPOCHS[task])
    train = train_triangle if task == "triangle" else train_in_process
    trainable = tune.with_parameters(train, spec=spec.model_dump(mode="json"), population=population)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 0.25}),
        param_space=param_space(spec),
        tune_config=tune.TuneConfig(
            metric=spec.metric, mode="max", num_samples=spec.num_trials,
            scheduler=scheduler(spec, out), search_alg=searcher(spec), reuse_actors=False,  # seeded: carries the limit
        ),  # fmt: skip
        run_config=tune.RunConfig(
            name=f"{algorithm}-{seed}", storage_path=storage, stop=count, verbose=0,
        ),  # fmt: skip
    )
    t0 = time.perf_counter()
    results = tuner.fit()
    best = max((r.metrics or {}).get(spec.metric, 0.0) for r in results)
    return count.reached_at, time.perf_counter() - t0, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(EPOCHS), default="triangle")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--target", type=float, default=None, help="default: 120 (triangle), 0.9 (digits)")
    parser.add_argument("--cpus", type=int, default=4, help="logical CPUs of the private Ray head")
    args = parser.parse_args()
    task, target = args.task, args.target if args.target is not None else TARGET[args.task]
    budget = TRIALS * EPOCHS[task]
    rows: dict[str, list] = {a: [] for a in ALGORITHMS}
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
                    reached, wall, best = run_one(algorithm, seed, target, str(Path(tmp) / "storage"), task)
                    rows[algorithm].append((reached, wall, best))
                    shown = reached if reached is not None else f">{budget}"
                    print(f"seed {seed} {algorithm:6s} trial-epochs to {target:g}: {shown:>5}  best {METRIC[task]} {best:.4f}  ({wall:.0f}s)", flush=True)
        finally:
            ray.shutdown()
            head.stop()

    def cost(r) -> int:
        return r[0] if r[0] is not None else budget + 1  # not reached: counted as past the budget

    print(f"\n{task}: trial-epochs to {METRIC[task]} >= {target:g} (budget {TRIALS} trials x {EPOCHS[task]} epochs = {budget}; '>' = not reached)")
    header = f"{'algorithm':10s}" + "".join(f"{'seed ' + str(s):>9s}" for s in range(args.seeds))
    print(header + f"{'median':>9s}{'vs random':>11s}{'best (median)':>15s}{'goal':>12s}")
    base = statistics.median(cost(r) for r in rows["random"])
    for algorithm in ALGORITHMS:
        cells = "".join(f"{(str(r[0]) if r[0] is not None else '>' + str(budget)):>9s}" for r in rows[algorithm])
        med = statistics.median(cost(r) for r in rows[algorithm])
        acc = statistics.median(r[2] for r in rows[algorithm])
        goal = "<= 0.50x" if algorithm == "pbt" else ""
        print(f"{algorithm:10s}{cells}{med:>9g}{med / base:>10.2f}x{acc:>15.4f}{goal:>12s}")
    print(f"best: the best {METRIC[task]} of a trial's last report when the search stopped (at the target, or at the end of the budget)")
    print(json.dumps({a: [r[0] for r in rows[a]] for a in ALGORITHMS}))


if __name__ == "__main__":
    main()
