"""The per-worker training loop for built-in models (data parallel with DDP).

Runs inside each Ray Train worker. Read it top to bottom: resume from the last
checkpoint if there is one, then for each epoch train, evaluate, maybe checkpoint,
report. ``ray.train.report`` is a barrier that every rank reaches; rank 0 alone writes
checkpoint files.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Iterator

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch import nn

from api.schemas import OptimizerSpec, TabularData, TrainSpec, parse_job_spec
from trainers import data as datalib
from trainers.models import build_model

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Progress:
    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps completed
    history: list[float] = field(default_factory=list)


def build_optimizer(spec: OptimizerSpec, params) -> torch.optim.Optimizer:
    if spec.name == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    if spec.name == "adam":
        return torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay)
    return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)


def set_hyperparameters(opt: torch.optim.Optimizer, spec: OptimizerSpec) -> None:
    """Put the spec's hyperparameters back after loading optimizer state, which carries
    the saving run's: a PBT clone resumes its donor's state with its own perturbed lr."""
    for group in opt.param_groups:
        group["lr"], group["weight_decay"] = spec.lr, spec.weight_decay
        if "momentum" in group:
            group["momentum"] = spec.momentum


class InMemoryData:
    """A built-in dataset: each rank holds its own shard of the training split."""

    def __init__(self, spec: TrainSpec, rank: int, world: int):
        arrays = datalib.load_arrays(spec.data, spec.seed)
        self.n_features, self.n_classes = arrays.n_features, arrays.n_classes
        self.x, self.y = datalib.shard(arrays.x_train, rank, world), datalib.shard(arrays.y_train, rank, world)
        # Validation needs no equal shards (one all-reduce at the end), so no row is dropped.
        self.x_val, self.y_val = arrays.x_val[rank::world], arrays.y_val[rank::world]
        self.batch_size, self.seed, self.rank = spec.batch_size, spec.seed, rank

    def train_batches(self, epoch: int) -> Iterator[Batch]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch * 101 + self.rank)
        return datalib.batches(self.x, self.y, min(self.batch_size, len(self.x)), g)

    def val_batches(self) -> Iterator[Batch]:
        for i in range(0, len(self.x_val), 1024):
            yield self.x_val[i : i + 1024], self.y_val[i : i + 1024]


class RayDataShards:
    """A user table, sharded across workers by Ray Train (equal-sized splits)."""

    def __init__(self, spec: TrainSpec, meta: dict):
        self.features, self.label = meta["feature_columns"], spec.data.label_column
        self.n_features, self.n_classes = len(self.features), meta["num_classes"]
        self.batch_size = spec.batch_size
        self.train = ray.train.get_dataset_shard("train")
        self.val = ray.train.get_dataset_shard("val")

    def _iter(self, shard, batch_size: int) -> Iterator[Batch]:
        for b in shard.iter_torch_batches(batch_size=batch_size, drop_last=False):
            x = torch.stack([b[c].to(torch.float32) for c in self.features], dim=1)
            yield x, b[self.label].to(torch.long)

    def train_batches(self, epoch: int) -> Iterator[Batch]:
        return self._iter(self.train, self.batch_size)

    def val_batches(self) -> Iterator[Batch]:
        return self._iter(self.val, 1024)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()  # DDP all-reduces gradients during backward
    opt.step()
    return loss.item()


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterator[Batch], device: torch.device) -> tuple[float, float]:
    """Loss and accuracy over every rank's validation shard, summed across ranks."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        totals[0] += nn.functional.cross_entropy(logits, y, reduction="sum").item()
        totals[1] += (logits.argmax(1) == y).sum().item()
        totals[2] += len(y)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals)
    model.train()
    count = max(totals[2].item(), 1.0)
    return totals[0].item() / count, totals[1].item() / count


def save_checkpoint(directory: str, model: nn.Module, opt: torch.optim.Optimizer, progress: Progress, spec: TrainSpec, meta: dict) -> None:
    inner = model.module if hasattr(model, "module") else model
    torch.save(inner.state_dict(), os.path.join(directory, "model.pt"))
    torch.save(opt.state_dict(), os.path.join(directory, "optimizer.pt"))
    with open(os.path.join(directory, "state.json"), "w") as f:
        json.dump({"epoch": progress.epoch, "step": progress.step, "spec": spec.model_dump(mode="json"), **meta}, f)


def load_checkpoint(checkpoint: ray.train.Checkpoint, model: nn.Module, opt: torch.optim.Optimizer) -> Progress:
    with checkpoint.as_directory() as d:
        inner = model.module if hasattr(model, "module") else model
        inner.load_state_dict(torch.load(os.path.join(d, "model.pt"), map_location="cpu"))
        opt.load_state_dict(torch.load(os.path.join(d, "optimizer.pt"), map_location="cpu"))
        with open(os.path.join(d, "state.json")) as f:
            state = json.load(f)
    return Progress(epoch=state["epoch"], step=state["step"])


def train_loop(config: dict) -> None:
    spec = parse_job_spec(config["spec"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(spec.seed)
    torch.set_num_threads(max(1, int(spec.scaling.cpus_per_worker)))

    if isinstance(spec.data, TabularData):
        data = RayDataShards(spec, config["data_meta"])
    else:
        data = InMemoryData(spec, rank, world)
    meta = {"n_features": data.n_features, "n_classes": data.n_classes}

    model = build_model(spec.model, data.n_features, data.n_classes)
    model = ray.train.torch.prepare_model(model)  # DDP; moves to the worker's device
    device = ray.train.torch.get_device()
    opt = build_optimizer(spec.optimizer, model.parameters())

    progress = Progress()
    if (checkpoint := ray.train.get_checkpoint()) is not None:
        progress = load_checkpoint(checkpoint, model, opt)
        set_hyperparameters(opt, spec.optimizer)

    max_steps = spec.max_steps or float("inf")
    max_epochs = spec.epochs or 10**9
    every_steps = spec.checkpoint.every_n_steps
    while progress.epoch < max_epochs and progress.step < max_steps:
        t0, losses, samples = time.perf_counter(), [], 0
        for x, y in data.train_batches(progress.epoch):
            losses.append(train_step(model, opt, x.to(device), y.to(device)))
            samples += len(y)
            progress.step += 1
            if progress.step >= max_steps:
                break
            if every_steps and progress.step % every_steps == 0:
                _report(spec, model, opt, progress, data, device, losses, samples, t0, meta, checkpoint=True)
                t0, losses, samples = time.perf_counter(), [], 0
        else:
            progress.epoch += 1
        finished = progress.epoch >= max_epochs or progress.step >= max_steps
        due = finished or progress.epoch % spec.checkpoint.every_n_epochs == 0
        if losses or finished:
            _report(spec, model, opt, progress, data, device, losses, samples, t0, meta, checkpoint=due)


def _report(spec, model, opt, progress, data, device, losses, samples, t0, meta, *, checkpoint: bool) -> None:
    val_loss, val_acc = evaluate(model, data.val_batches(), device)
    elapsed = time.perf_counter() - t0
    metrics = {
        "epoch": progress.epoch,
        "step": progress.step,
        "train_loss": sum(losses) / max(len(losses), 1),
        "val_loss": val_loss,
        "val_acc": val_acc,
        "samples_per_s": samples * ray.train.get_context().get_world_size() / max(elapsed, 1e-9),
        "lr": opt.param_groups[0]["lr"],  # the rate in effect: what a search's schedule really did
        "world_size": ray.train.get_context().get_world_size(),  # changes when an elastic job resizes
    }
    if not checkpoint:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as d:
        if ray.train.get_context().get_world_rank() == 0:
            save_checkpoint(d, model, opt, progress, spec, meta)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
        else:
            ray.train.report(metrics)
