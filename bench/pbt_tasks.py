"""The tasks ``bench.pbt_vs_random`` searches: each a search spec (base, space, metric,
budget, PBT's options) and the trial that trains it in its Tune trainable's process.

- ``nqm``: the noisy quadratic model of Zhang et al. 2019 ("Which algorithmic choices
  matter at which batch sizes?"), the model under which the optimal learning-rate
  schedule decays. The loss is ``0.5 * sum(h_i * theta_i**2)`` over 1000 directions whose
  curvatures ``h_i`` run geometrically from 1 down to 0.01; each step's gradient is
  ``h * theta`` plus noise of variance ``h / B`` (a batch of ``B = 1``). SGD with momentum
  0.9 (``trainers.skeleton.build_optimizer``) at rate ``lr``, 200 steps an epoch, from
  ``theta = 1``. A constant rate trades two things: the flat directions need
  ``lr * h_min * steps`` large to converge, while the noise holds the loss at a floor
  proportional to ``lr``; a rate that decays gets both. The target is a loss no constant
  rate in the search range reaches within the budget, found by a sweep of constant rates
  (``bench.pbt_vs_random --sweep``).
- ``triangle``: Ray's toy for schedules (``ray/tune/examples/pbt_function.py``): the best
  rate rises then falls with the accuracy itself (0.001 up to 0.01 and back).
- ``digits``: the built-in CNN on the digits data with SGD; too easy and too short for
  a schedule to matter.

Every trial checkpoints its whole state (weights and optimizer state) at every epoch
and restores it on start, as ``trainers.skeleton.resume`` does: a PBT clone continues
its donor's run with its own perturbed values put back into the optimizer.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from ray import tune

from api.schemas import OptimizerSpec, TrainSpec, TuneSpec
from trainers.data.tabular import batches, load_arrays
from trainers.models import build_model
from trainers.skeleton import build_optimizer, set_hyperparameters
from tuning.population import Alignment

TRIALS = 8


@dataclass(frozen=True)
class Task:
    name: str
    epochs: int
    metric: str
    mode: str  # "min" or "max"
    target: float | None  # None: found by the task's sweep of constant rates
    base: Callable[[int], dict[str, Any]]  # seed -> the base training spec
    search_space: dict[str, Any]
    train: Callable[..., None]
    pbt: dict[str, Any] = field(default_factory=dict)

    def reached(self, value: float, target: float) -> bool:
        return value <= target if self.mode == "min" else value >= target

    def best(self, values: list[float]) -> float:
        return min(values) if self.mode == "min" else max(values)

    def spec_for(self, algorithm: str, seed: int) -> TuneSpec:
        options: dict[str, Any] = {}
        if algorithm == "asha":
            options = {"asha": {"grace_period": 1, "reduction_factor": 2}}
        elif algorithm == "pbt":
            options = {"pbt": self.pbt}
        return TuneSpec.model_validate(
            {
                "kind": "tune",
                "algorithm": algorithm,
                "mode": self.mode,
                "metric": self.metric,
                "num_trials": TRIALS,
                "max_concurrent_trials": TRIALS,
                "budget": {"epochs": self.epochs},
                "seed": seed,
                "base": self.base(seed),
                "search_space": self.search_space,
                **options,
            }
        )


def stable_seed(*parts: Any) -> int:
    """A seed from values, the same in every process (``hash`` of a str is not)."""
    return zlib.crc32(repr(parts).encode())


def aligner(search: TuneSpec, population, epochs: int) -> Alignment | None:
    if population is None:
        return None
    return Alignment(population, tune.get_context().get_trial_id(), search.pbt.perturbation_interval, epochs)


# ----------------------------------------------------------------------------- state


def restore(model: torch.nn.Module, opt: torch.optim.Optimizer, values: OptimizerSpec) -> int:
    """Weights and optimizer state from Tune's checkpoint (a PBT clone: its donor's), then
    this trial's own values back into the optimizer; the epochs already done."""
    if (checkpoint := tune.get_checkpoint()) is None:
        return 0
    with checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "state.pt"))
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    set_hyperparameters(opt, values)
    return int(state["epoch"])


def report(model: torch.nn.Module, opt: torch.optim.Optimizer, epoch: int, metrics: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as d:
        torch.save(
            {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}, os.path.join(d, "state.pt")
        )
        metrics = {"epoch": epoch, **metrics, "lr": opt.param_groups[0]["lr"]}
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))


# ----------------------------------------------------------------------------- nqm

NQM_DIM, NQM_BATCH, NQM_STEPS_PER_EPOCH, NQM_MOMENTUM = 1000, 1.0, 200, 0.9
NQM_CURVATURE = torch.logspace(0.0, -2.0, NQM_DIM)  # h_i: 1 down to 0.01
NQM_NOISE = (NQM_CURVATURE / NQM_BATCH).sqrt()  # gradient noise covariance H / B
NQM_RATES = (1e-4, 1e-1)  # the searched range of lr


class Quadratic(torch.nn.Module):
    """The model's parameters: one point ``theta`` in the quadratic's 1000 directions."""

    def __init__(self) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(torch.ones(NQM_DIM))

    def loss(self) -> float:
        """The expected loss at ``theta`` (the risk; no sampling in it)."""
        return 0.5 * float((NQM_CURVATURE * self.theta.detach() ** 2).sum())


def nqm_optimizer(lr: float) -> OptimizerSpec:
    return OptimizerSpec(name="sgd", lr=lr, momentum=NQM_MOMENTUM)


def nqm_epoch(model: Quadratic, opt: torch.optim.Optimizer, generator: torch.Generator) -> None:
    for _ in range(NQM_STEPS_PER_EPOCH):
        noise = torch.randn(NQM_DIM, generator=generator) * NQM_NOISE
        model.theta.grad = NQM_CURVATURE * model.theta.detach() + noise
        opt.step()


def momentum_norm(opt: torch.optim.Optimizer) -> float:
    """The optimizer state a restore carries (0 for a run that starts fresh)."""
    buffers = [s.get("momentum_buffer") for s in opt.state.values()]
    return float(sum(b.norm() for b in buffers if b is not None))


def train_nqm(config: dict, *, spec: dict, population=None) -> None:
    search = TuneSpec.model_validate(spec)
    trial = search.trial_spec(config)
    run_nqm(float(trial.config["lr"]), search.seed, aligner(search, population, NQM.epochs))


def nqm_function(config: dict) -> None:
    """The same trial as a plain Ray Tune function trainable (``config``: ``lr``, ``seed``),
    the function ``bench.pbt_warm`` searches through raydock and with Tune by hand."""
    run_nqm(float(config["lr"]), int(config.get("seed", 0)))


def run_nqm(lr: float, seed: int | None, align: Alignment | None = None) -> None:
    values = nqm_optimizer(lr)
    torch.set_num_threads(1)
    model = Quadratic()
    opt = build_optimizer(values, model.parameters())
    epoch = restore(model, opt, values)
    # The first report says what the restore carried: a clone's momentum is its donor's.
    carried = {"restored_momentum": momentum_norm(opt), "restored_loss": model.loss()} if epoch else {}
    trial_id = tune.get_context().get_trial_id()
    while epoch < NQM.epochs:
        nqm_epoch(model, opt, torch.Generator().manual_seed(stable_seed(seed, trial_id, epoch)))
        epoch += 1
        report(model, opt, epoch, {"loss": model.loss(), **carried})
        carried = {}
        if align is not None:
            align.after_report(epoch)


def sweep_nqm(rates: list[float], seeds: int) -> list[list[list[float]]]:
    """Constant rates, each run ``seeds`` times for the whole budget in this process:
    ``[rate][seed][epoch]`` losses, from the same model, optimizer and noise as a trial."""
    torch.set_num_threads(1)
    out = []
    for lr in rates:
        runs = []
        for seed in range(seeds):
            model = Quadratic()
            opt = build_optimizer(nqm_optimizer(lr), model.parameters())
            losses = []
            for epoch in range(NQM.epochs):
                nqm_epoch(model, opt, torch.Generator().manual_seed(stable_seed("sweep", seed, lr, epoch)))
                losses.append(model.loss())
            runs.append(losses)
        out.append(runs)
    return out


NQM = Task(
    name="nqm",
    epochs=40,
    metric="loss",
    mode="min",
    target=None,
    base=lambda seed: {
        "entrypoint": "bench.pbt_tasks:train_nqm",
        "config": {"lr": 1e-3},
        "scaling": {"num_workers": 1},
    },
    search_space={"config.lr": {"type": "loguniform", "low": NQM_RATES[0], "high": NQM_RATES[1]}},
    train=train_nqm,
    # Tune's defaults (bottom quarter clones the top quarter, steps of 1.2 / 0.8, a resample
    # a quarter of the time), deciding every epoch: 200 steps, about twice the time the
    # noise floor takes to follow a new rate at the best rates (1 / (lr / (1 - momentum) * h_max)
    # = 100 steps at lr 0.001), so each decision sees the rate it judges.
    pbt={
        "perturbation_interval": 1,
        "quantile_fraction": 0.25,
        "resample_probability": 0.25,
        "perturbation_factors": [1.2, 0.8],
    },
)


# ----------------------------------------------------------------------------- triangle

TRIANGLE_STEPS_PER_EPOCH = 10


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
    lr = float(config["config.lr"])
    accuracy, epoch = 0.0, 0
    if (checkpoint := tune.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d:
            state = json.loads(Path(d, "state.json").read_text())
        accuracy, epoch = state["accuracy"], state["epoch"]
    rng = random.Random(stable_seed(search.seed, tune.get_context().get_trial_id(), epoch))
    align = aligner(search, population, TRIANGLE.epochs)
    while epoch < TRIANGLE.epochs:
        for _ in range(TRIANGLE_STEPS_PER_EPOCH):
            accuracy = triangle_step(accuracy, lr, rng)
        epoch += 1
        with tempfile.TemporaryDirectory() as d:
            Path(d, "state.json").write_text(json.dumps({"accuracy": accuracy, "epoch": epoch}))
            tune.report(
                {"epoch": epoch, "mean_accuracy": accuracy, "lr": lr}, checkpoint=tune.Checkpoint.from_directory(d)
            )
        if align is not None:
            align.after_report(epoch)


TRIANGLE = Task(
    name="triangle",
    epochs=40,
    metric="mean_accuracy",
    mode="max",
    target=120.0,
    base=lambda seed: {
        "entrypoint": "bench.pbt_tasks:train_triangle",
        "config": {"lr": 0.001},
        "scaling": {"num_workers": 1},
    },
    search_space={"config.lr": {"type": "loguniform", "low": 0.0001, "high": 0.02}},
    train=train_triangle,
    # The rate must rise 10x and fall back within 40 epochs: a decision every epoch,
    # and steps large enough to follow it (Tune's default 1.2/0.8 needs 13 to rise 10x).
    pbt={
        "perturbation_interval": 1,
        "quantile_fraction": 0.25,
        "resample_probability": 0.25,
        "perturbation_factors": [1.5, 0.6],
    },
)


# ----------------------------------------------------------------------------- digits


def train_digits(config: dict, *, spec: dict, population=None) -> None:
    """One trial: the built-in model and optimizer of trainers.skeleton, trained in this process."""
    search = TuneSpec.model_validate(spec)
    run_digits(search.trial_spec(config), DIGITS.epochs, aligner(search, population, DIGITS.epochs))


def digits_function(config: dict) -> None:
    """The same trial as a plain Ray Tune function trainable: ``config`` holds a built-in
    training spec (``base``), the searched ``lr`` put into its optimizer, and ``epochs``."""
    base = dict(config["base"])
    base["optimizer"] = {**base.get("optimizer", {}), "lr": float(config["lr"])}
    run_digits(TrainSpec.model_validate(base), int(config["epochs"]))


def run_digits(trial: TrainSpec, epochs: int, align: Alignment | None = None) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(trial.seed)
    data = load_arrays(trial.data, trial.seed)
    model = build_model(trial.model, data.n_features, data.n_classes)
    opt = build_optimizer(trial.optimizer, model.parameters())
    epoch = restore(model, opt, trial.optimizer)
    while epoch < epochs:
        g = torch.Generator().manual_seed(trial.seed * 100_003 + epoch)
        for x, y in batches(data.x_train, data.y_train, trial.batch_size, g):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        epoch += 1
        with torch.no_grad():
            acc = (model(data.x_val).argmax(1) == data.y_val).float().mean().item()
        report(model, opt, epoch, {"val_acc": acc})
        if align is not None:
            align.after_report(epoch)


DIGITS = Task(
    name="digits",
    epochs=12,
    metric="val_acc",
    mode="max",
    target=0.9,
    base=lambda seed: {
        "model": {"type": "cnn", "channels": [16, 32]},
        "data": {"source": "digits"},
        "optimizer": {"name": "sgd", "lr": 0.01},
        "batch_size": 64,
        "seed": seed,
        "scaling": {"num_workers": 1},
    },
    search_space={
        "optimizer.lr": {"type": "loguniform", "low": 0.01, "high": 1.0},
        "optimizer.momentum": {"type": "uniform", "low": 0.5, "high": 0.99},
    },
    train=train_digits,
    pbt={"perturbation_interval": 2, "quantile_fraction": 0.25, "resample_probability": 0.25},
)

TASKS = {t.name: t for t in (NQM, TRIANGLE, DIGITS)}
