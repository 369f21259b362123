"""The training skeleton every built-in loop runs inside a Ray Train worker.

A loop (``trainers.classifier_loop``, ``trainers.lm_loop``) builds its model through
``trainers.parallel.parallelize``, resumes, and hands this module a stream of steps and
an evaluation function:

    setup_worker(spec)
    pm = parallelize(model, build_mesh(spec.parallelism), spec.parallelism,
                     optimizer_factory=optimizer_factory(spec))
    start = resume(spec, pm)             # ray.train.get_checkpoint(), if there is one
    train(spec, pm, steps_from(start), evaluate, throughput=("samples_per_s", 1), meta={...})

and ``train`` is the step you read top to bottom:

    for step in steps:
        train_step()                     # pm.local_step: one optimizer step
        maybe_evaluate()                 # at epoch ends, checkpoints, report.every_n_steps/every_s
        maybe_checkpoint()               # checkpoint.every_n_epochs / every_n_steps, the last step
        report()                         # every worker; a barrier (trainers.reporter)

Checkpoints are ``trainers.checkpoint``'s one format, written by ``trainers.reporter``
(``checkpoint.upload``: sync, or a CPU snapshot uploaded in the background). Resuming re-applies the spec's
optimizer hyperparameters after loading the optimizer state (which carries the saving
run's): a PBT clone continues from its donor's state with its own perturbed lr.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import ray.train
import torch
import torch.distributed as dist

from api.schemas import OptimizerSpec, TrainSpec
from api.schemas.schedule import HyperparameterSchedule
from trainers import checkpoint, efficiency, fast_path, phases, preemption
from trainers.parallel import ParallelModel
from trainers.parallel.base import OptimizerFactory
from trainers.reporter import Reporter


def setup_worker(spec: TrainSpec) -> None:
    # One seed on every worker: replicas build identical models, and tensor-parallel
    # workers draw the same dropout masks.
    torch.manual_seed(spec.seed)
    torch.set_num_threads(max(1, int(spec.scaling.cpus_per_worker)))
    # TF32 matrix products where fp32 is asked for on a GPU (not under compile: off,
    # the exact reference path).
    device = torch.device("cuda" if spec.scaling.use_gpu and torch.cuda.is_available() else "cpu")
    fast_path.allow_tf32(fast_path.resolve(spec.parallelism.compile, device, precision=spec.parallelism.precision).tf32)


def build_optimizer(spec: OptimizerSpec, params) -> torch.optim.Optimizer:
    params = list(params)
    fused = fast_path.optimizer_options(params)
    if spec.name == "sgd":
        return torch.optim.SGD(
            params,
            lr=spec.lr,
            momentum=spec.momentum,
            weight_decay=spec.weight_decay,
            **fused,
        )
    if spec.name == "adam":
        return torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay, **fused)
    return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay, **fused)


def optimizer_factory(spec: TrainSpec) -> OptimizerFactory:
    return partial(build_optimizer, spec.optimizer)


def set_hyperparameters(opt: torch.optim.Optimizer, spec: OptimizerSpec) -> None:
    """Put the spec's hyperparameters back after loading optimizer state, which carries
    the saving run's: a PBT clone resumes its donor's state with its own perturbed lr."""
    for group in opt.param_groups:
        group["lr"], group["weight_decay"] = spec.lr, spec.weight_decay
        if "momentum" in group:
            group["momentum"] = spec.momentum


class Scheduler:
    """Applies ``spec.schedule`` (optimizer values by completed epochs or steps) before
    each step; only a change touches the optimizer."""

    def __init__(self, schedule: HyperparameterSchedule | None) -> None:
        self.schedule, self.applied = schedule, None

    def before(self, opt: torch.optim.Optimizer, step: "Step") -> None:
        if self.schedule is None:
            return
        done = step.number - 1 if self.schedule.unit == "step" else step.epoch - (1 if step.epoch_end else 0)
        values = self.schedule.values_at(done)
        if values == self.applied:
            return
        for group in opt.param_groups:
            for path, value in values.items():
                name = path.removeprefix("optimizer.")
                if name in group:
                    group[name] = value
        self.applied = values


@dataclass(frozen=True)
class Start:
    """Where a run starts: 0/0, or the epoch and optimizer step of its checkpoint."""

    epoch: int = 0
    step: int = 0


def resume(spec: TrainSpec, pm: ParallelModel) -> Start:
    """Restore ``pm`` from ``ray.train.get_checkpoint()`` (a retry, an elastic resize, a
    resumed job, a PBT clone), then re-apply the spec's hyperparameters."""
    ckpt = ray.train.get_checkpoint()
    if ckpt is None:
        return Start()
    with ckpt.as_directory() as d:
        meta = checkpoint.restore(d, pm)
    set_hyperparameters(pm.optimizer, spec.optimizer)
    return Start(epoch=int(meta["epoch"]), step=pm.step)


@dataclass(frozen=True)
class Step:
    """One optimizer step's batch (this worker's rows) and where it falls in the run."""

    number: int  # pm.step once this step is done (1-based)
    epoch: int  # epochs completed once this step is done
    inputs: torch.Tensor
    targets: torch.Tensor
    epoch_end: bool = False
    last: bool = False


class ReportClock:
    """Decides, identically on every worker, when ``report.every_s`` has passed.

    A report is a barrier, so workers cannot each look at their own clock. They agree
    with one tiny all-reduce (the slowest worker's elapsed time) at a few steps per
    report window: the first step, then the step the measured pace predicts.
    """

    def __init__(self, every_s: float, device: torch.device):
        self.every_s, self.device = every_s, device
        self.restart(0)

    def restart(self, step: int) -> None:
        self.t0, self.first_step, self.next_check = time.perf_counter(), step, step + 1

    def due(self, step: int) -> bool:
        if step < self.next_check:
            return False
        elapsed = torch.tensor([time.perf_counter() - self.t0], dtype=torch.float64, device=self.device)
        if dist.is_initialized():
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        seconds = elapsed.item()  # the same number on every worker, so the same decision
        if seconds >= self.every_s:
            return True
        per_step = seconds / max(step - self.first_step, 1)
        self.next_check = step + max(1, math.ceil((self.every_s - seconds) / max(per_step, 1e-9)))
        return False


class Cadence:
    """When to report and when a report carries a checkpoint (``checkpoint``, ``report``)."""

    def __init__(self, spec: TrainSpec, device: torch.device):
        self.checkpoint, self.report = spec.checkpoint, spec.report
        self.clock = ReportClock(spec.report.every_s, device)

    def checkpoint_due(self, step: Step) -> bool:
        every_steps = self.checkpoint.every_n_steps
        return (
            step.last
            or (step.epoch_end and step.epoch % self.checkpoint.every_n_epochs == 0)
            or (every_steps is not None and step.number % every_steps == 0)
        )

    def report_due(self, step: Step) -> bool:
        every_steps = self.report.every_n_steps
        return (
            step.epoch_end
            or self.checkpoint_due(step)
            or (every_steps is not None and step.number % every_steps == 0)
            or self.clock.due(step.number)
        )


class Window:
    """Training loss, rows and wall time since the last report.

    The loss is summed where it was computed and averaged across workers once, at the
    report: a per-step ``.item()`` or all-reduce would make every step wait (about 10%
    of a small model's step on CPU, a CPU-GPU sync per step on GPU).
    """

    def __init__(self) -> None:
        self.loss_sum: torch.Tensor | None = None
        self.steps = 0
        self.rows = 0
        self.t0 = time.perf_counter()

    def add(self, loss: torch.Tensor, rows: int) -> None:
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        self.steps += 1
        self.rows += rows

    def mean_loss(self, pm: ParallelModel) -> float:
        """The window's global-batch mean training loss (a collective)."""
        return pm.mean_loss(self.loss_sum / self.steps)


def train(
    spec: TrainSpec,
    pm: ParallelModel,
    steps: Iterable[Step],
    evaluate: Callable[[], dict[str, Any]],
    *,
    throughput: tuple[str, int],
    meta: dict[str, Any] | None = None,
    flops_per_unit: int | None = None,
) -> None:
    """Run ``steps`` on ``pm``, reporting and checkpointing as the spec says.

    ``evaluate()`` returns the validation metrics (a collective: every worker runs it at
    the same steps), after ``pm.before_evaluate()``, whose metrics are reported too. ``throughput`` names the rate metric and the units per batch row
    (``("samples_per_s", 1)``, ``("tokens_per_s", seq_len)``). ``meta`` goes into every
    checkpoint's ``state.json`` next to ``trainers.checkpoint.describe``'s fields.
    ``flops_per_unit`` (model FLOPs per token or sample, ``trainers.efficiency``) adds
    MFU on GPUs.

    The fast path (``trainers.fast_path``, ``parallelism.compile``) applies here:
    the placed model and its loss compiled in place, batches prefetched to the GPU.
    """
    par = spec.parallelism
    fast = fast_path.resolve(par.compile, pm.device, strategy=par.strategy, precision=par.precision)
    fast_path.accelerate(pm, fast)
    if fast.prefetch:
        steps = fast_path.prefetch(steps, pm.device)
    cadence = Cadence(spec, pm.device)
    rate_name, units_per_row = throughput
    window = Window()
    scheduler = Scheduler(spec.schedule)
    # Asked to give its room back (trainers/preemption.py): a checkpoint at once.
    watch = preemption.Watch(ReportClock(preemption.CHECK_EVERY_S, pm.device), pm.device)
    reporter = Reporter(spec.checkpoint.upload)
    first = True
    for step in steps:
        scheduler.before(pm.optimizer, step)
        window.add(pm.local_step(step.inputs, step.targets), len(step.targets))
        if first:
            first = _first_step_done(pm.device)
        preempted = watch.check(step.number)
        if not (cadence.report_due(step) or preempted):
            continue
        train_loss = window.mean_loss(pm)  # waits for the window's last step
        elapsed = time.perf_counter() - window.t0
        rate = window.rows * units_per_row * pm.data_world_size / max(elapsed, 1e-9)
        metrics = {
            "epoch": step.epoch,
            "step": pm.step,
            "train_loss": train_loss,
            rate_name: rate,
            **efficiency.efficiency_metrics(
                unit=rate_name.removesuffix("s_per_s"),
                items_per_s=rate,
                flops_per_item=flops_per_unit,
                device=pm.device,
                precision=par.precision,
                n_devices=dist.get_world_size(),
            ),
            **pm.before_evaluate(),  # e.g. the parameter server's pull of the latest weights
            **evaluate(),
            # Worker 0's figures (only rank 0's metrics are kept): the gradient-sync bytes
            # it sent since this attempt started, and the parameter + optimizer bytes it holds.
            "bytes_communicated": pm.bytes_communicated,
            "local_state_bytes": pm.local_state_bytes(),
            "lr": pm.optimizer.param_groups[0]["lr"],  # the rate in effect: what a search's schedule really did
            "world_size": dist.get_world_size(),  # changes when an elastic job resizes
        }
        if cadence.checkpoint_due(step) or preempted:
            reporter.report(metrics, pm, checkpoint.describe(spec, pm, epoch=step.epoch, **(meta or {})))
            if step.last or preempted:
                reporter.wait()  # the run ends, or gives its room back, with its checkpoint sealed
        else:
            reporter.report(metrics)
        window = Window()
        cadence.clock.restart(step.number)


def _first_step_done(device: torch.device) -> bool:
    """Mark the ``first_step`` start-up phase (rank 0); False, so it is marked once."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # once: the step done, not only queued
    phases.mark("first_step")
    return False
