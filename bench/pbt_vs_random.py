"""PBT vs ASHA vs random search at the same budget: trial-epochs to reach a target
validation accuracy, over several seeds.

    .venv/bin/python -m bench.pbt_vs_random                 # 3 seeds, target 0.9
    .venv/bin/python -m bench.pbt_vs_random --seeds 5 --target 0.92

The task is the built-in CNN on the digits data with SGD, searching the learning rate
(log-uniform 0.01..1) and momentum (0.5..0.99): too high diverges, too low crawls, so
when and how the rate changes matters. Each algorithm gets the same budget, 8 trials x
12 epochs, all 8 running at once, and raydock's own search pieces for it
(``tuning.search``: the parameter space, ASHA, the recording PBT with its aligned
population). Every report is one trial-epoch; the count is how many trial-epochs the
whole search had consumed, in the order Tune received them, when one report first
reached the target. A search stops there.

It runs on Ray Tune directly, without the REST server, and each trial trains in its
Tune trainable's process instead of a TorchTrainer: starting a Ray Train run per trial
(and per PBT restart) costs 10-20 s here and would dominate a 2-core machine without
changing which epochs each algorithm spends. The schedulers and the search space are
the ones a ``kind: tune`` job uses.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from service.ray_backend import ray_auth_token

if ray_auth_token():
    # Ray reads its auth mode when it is imported: a head with a token needs it on.
    os.environ.setdefault("RAY_AUTH_MODE", "token")

import ray  # noqa: E402
import torch  # noqa: E402
from ray import tune  # noqa: E402

from api.schemas import TuneSpec
from service.local_cluster import SINGLE_MACHINE_ENV, start_head
from trainers.data import batches, load_arrays
from trainers.skeleton import build_optimizer, set_hyperparameters
from trainers.models import build_model
from tuning.population import Alignment, Population
from tuning.search import aligned, param_space, scheduler, searcher
from tuning.search_events import SearchEvents

TRIALS, EPOCHS = 8, 12
ALGORITHMS = ("random", "asha", "pbt")


def spec_for(algorithm: str, seed: int) -> TuneSpec:
    extra: dict[str, Any] = {}
    if algorithm == "asha":
        extra["asha"] = {"grace_period": 1, "reduction_factor": 2}
    if algorithm == "pbt":
        extra["pbt"] = {"perturbation_interval": 2, "quantile_fraction": 0.25, "resample_probability": 0.25}
    return TuneSpec.model_validate({
        "kind": "tune",
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
        "algorithm": algorithm, "metric": "val_acc", "mode": "max",
        "num_trials": TRIALS, "max_concurrent_trials": TRIALS, "budget": {"epochs": EPOCHS}, "seed": seed,
        **extra,
    })  # fmt: skip


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
        align = Alignment(population, tune.get_context().get_trial_id(), search.pbt.perturbation_interval, EPOCHS)
    while epoch < EPOCHS:
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

    def __init__(self, target: float) -> None:
        self.target, self.seen, self.reached_at = target, set(), None

    def __call__(self, trial_id: str, result: dict) -> bool:
        # A function trainable's exit repeats its last result: count each report once.
        key = (trial_id, result.get("epoch"), result.get("time_total_s"))
        if key not in self.seen:
            self.seen.add(key)
            if self.reached_at is None and result["val_acc"] >= self.target:
                self.reached_at = len(self.seen)
        return result["epoch"] >= EPOCHS

    def stop_all(self) -> bool:
        return self.reached_at is not None


def run_one(algorithm: str, seed: int, target: float, storage: str) -> tuple[int | None, float, int]:
    spec = spec_for(algorithm, seed)
    out = SearchEvents(spec.metric, spec.mode, sink=lambda event: None)
    population = Population.remote() if aligned(spec) else None
    count = Count(target)
    trainable = tune.with_parameters(train_in_process, spec=spec.model_dump(mode="json"), population=population)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 0.25}),
        param_space=param_space(spec),
        tune_config=tune.TuneConfig(
            metric="val_acc", mode="max", num_samples=spec.num_trials,
            scheduler=scheduler(spec, out), search_alg=searcher(spec), reuse_actors=False,  # seeded: carries the limit
        ),  # fmt: skip
        run_config=tune.RunConfig(
            name=f"{algorithm}-{seed}", storage_path=storage, stop=count, verbose=0,
        ),  # fmt: skip
    )
    t0 = time.perf_counter()
    results = tuner.fit()
    best = max((r.metrics or {}).get("val_acc", 0.0) for r in results)
    return count.reached_at, time.perf_counter() - t0, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--cpus", type=int, default=4, help="logical CPUs of the private Ray head")
    args = parser.parse_args()
    budget = TRIALS * EPOCHS
    rows: dict[str, list] = {a: [] for a in ALGORITHMS}
    with tempfile.TemporaryDirectory() as tmp:
        # A private head on ports of its own: ray.init() alone would join whatever
        # cluster was started last on this machine.
        head = start_head(Path(tmp) / "ray", num_cpus=args.cpus)
        # Tune takes SIGINT for itself; a SIGTERM still stops the private head below.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            os.environ.update(SINGLE_MACHINE_ENV)  # the head listens on 127.0.0.1 only
            ray.init(address=head.gcs_address, log_to_driver=False, configure_logging=False)
            for seed in range(args.seeds):
                for algorithm in ALGORITHMS:
                    reached, wall, best = run_one(algorithm, seed, args.target, str(Path(tmp) / "storage"))
                    rows[algorithm].append((reached, wall, best))
                    shown = reached if reached is not None else f">{budget}"
                    print(f"seed {seed} {algorithm:6s} trial-epochs to {args.target}: {shown:>5}  best val_acc {best:.4f}  ({wall:.0f}s)", flush=True)
        finally:
            ray.shutdown()
            head.stop()

    def cost(r) -> int:
        return r[0] if r[0] is not None else budget + 1  # not reached: counted as past the budget

    print(f"\ntrial-epochs to val_acc >= {args.target} (budget {TRIALS} trials x {EPOCHS} epochs = {budget}; '>' = not reached)")
    header = f"{'algorithm':10s}" + "".join(f"{'seed ' + str(s):>9s}" for s in range(args.seeds))
    print(header + f"{'median':>9s}{'vs random':>11s}{'best acc (median)':>19s}")
    base = statistics.median(cost(r) for r in rows["random"])
    for algorithm in ALGORITHMS:
        cells = "".join(f"{(str(r[0]) if r[0] is not None else '>' + str(budget)):>9s}" for r in rows[algorithm])
        med = statistics.median(cost(r) for r in rows[algorithm])
        acc = statistics.median(r[2] for r in rows[algorithm])
        print(f"{algorithm:10s}{cells}{med:>9g}{med / base:>10.2f}x{acc:>19.4f}")
    print("best acc: the best val_acc when the search stopped (at the target, or at the end of the budget)")
    print(json.dumps({a: [r[0] for r in rows[a]] for a in ALGORITHMS}))


if __name__ == "__main__":
    main()
