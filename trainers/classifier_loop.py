"""The per-worker loop for the built-in classifiers (mlp, cnn) under a chosen parallelism.

``trainers.driver`` runs it when a job with ``model.type`` mlp or cnn sets anything in
``parallelism`` beyond the defaults: strategy fsdp or parameter_server, bf16
precision, gradient accumulation or compression. (The default keeps ``trainers.loop``,
Ray's own DDP.)
The model goes through ``trainers.parallel.parallelize`` like the GPT does, so the
strategy, precision, accumulation (``no_sync`` on all but the last slice) and the DDP
communication hooks are the same code. Data, optimizer and epoch bookkeeping come
from ``trainers.loop``.

A checkpoint holds every worker's shard of model and optimizer state under
``shards/`` (``torch.distributed.checkpoint``), and from worker 0 the plain weights
``model.pt`` plus ``state.json`` (epoch, step, spec, data shape) to rebuild the model
with ``trainers.models.build_model``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from functools import partial
from typing import Iterator

import ray.train
import torch
import torch.distributed as dist
from torch import nn

from api.schemas import TabularData, TrainSpec, parse_job_spec
from trainers.loop import Batch, InMemoryData, Progress, RayDataShards, build_optimizer
from trainers.models import build_model
from trainers.parallel import ParallelModel, build_mesh, load_checkpoint, parallelize, save_checkpoint
from trainers.parallel.parameter_server import ParameterServerModel, parallelize_parameter_server

SHARDS_DIR = "shards"


def classification_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # fp32 loss whatever the autocast precision of the logits.
    return nn.functional.cross_entropy(logits.float(), targets)


def whole_slices(x: torch.Tensor, y: torch.Tensor, k: int) -> Batch:
    """Drop the rows that would leave accumulation slices unequal (a last partial batch)."""
    n = len(x) - len(x) % k
    return x[:n], y[:n]


def autocast(precision: str, device: torch.device):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


@torch.no_grad()
def evaluate(spec: TrainSpec, pm: ParallelModel, batches: Iterator[Batch]) -> tuple[float, float]:
    """Loss and accuracy over every worker's validation shard."""
    pm.module.eval()
    batches = list(batches)
    # FSDP gathers parameters in every forward, a collective: all workers must run as
    # many forwards as the one with the most batches (empty ones are fine).
    count = torch.tensor([len(batches)], device=pm.device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    empty = (batches[0][0][:0], batches[0][1][:0]) if batches else None
    totals = torch.zeros(3, dtype=torch.float64, device=pm.device)  # loss sum, correct, rows
    for i in range(int(count.item())):
        x, y = batches[i] if i < len(batches) else empty
        x, y = x.to(pm.device), y.to(pm.device)
        with autocast(spec.parallelism.precision, pm.device):
            logits = pm.module(x).float()
        totals[0] += nn.functional.cross_entropy(logits, y, reduction="sum").double()
        totals[1] += (logits.argmax(1) == y).sum()
        totals[2] += len(y)
    dist.all_reduce(totals)
    pm.module.train()
    rows = max(totals[2].item(), 1.0)
    return totals[0].item() / rows, totals[1].item() / rows


def train_loop(config: dict) -> None:
    spec = parse_job_spec(config["spec"])
    torch.manual_seed(spec.seed)
    torch.set_num_threads(max(1, int(spec.scaling.cpus_per_worker)))

    mesh = build_mesh(spec.parallelism)
    rank, world = mesh["data"].get_local_rank(), mesh["data"].size()
    if isinstance(spec.data, TabularData):
        data = RayDataShards(spec, config["data_meta"])
    else:
        data = InMemoryData(spec, rank, world)
    meta = {"n_features": data.n_features, "n_classes": data.n_classes}
    place = parallelize
    if spec.parallelism.strategy == "parameter_server":
        # parallelize() still refuses this strategy (api.schemas.parallelism lists it as
        # unavailable); the job spec has already checked it applies to this model.
        place = parallelize_parameter_server
    pm = place(
        build_model(spec.model, data.n_features, data.n_classes),
        mesh,
        spec.parallelism,
        optimizer_factory=partial(build_optimizer, spec.optimizer),
        loss_fn=classification_loss,
    )

    progress = Progress()
    if (checkpoint := ray.train.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d:
            load_checkpoint(pm, os.path.join(d, SHARDS_DIR))
            with open(os.path.join(d, "state.json")) as f:
                progress.epoch = json.load(f)["epoch"]

    k = spec.parallelism.grad_accumulation_steps
    max_steps = spec.max_steps or float("inf")
    max_epochs = spec.epochs or 10**9
    every_steps = spec.checkpoint.every_n_steps
    while progress.epoch < max_epochs and pm.step < max_steps:
        t0, losses, samples = time.perf_counter(), [], 0
        for x, y in data.train_batches(progress.epoch):
            x, y = whole_slices(x, y, k)
            if len(y) == 0:
                continue
            losses.append(pm.train_step(x, y))
            samples += len(y)
            if pm.step >= max_steps:
                break
            if every_steps and pm.step % every_steps == 0:
                report(spec, pm, progress, data, losses, samples, t0, meta, checkpoint=True)
                t0, losses, samples = time.perf_counter(), [], 0
        else:
            progress.epoch += 1
        finished = progress.epoch >= max_epochs or pm.step >= max_steps
        due = finished or progress.epoch % spec.checkpoint.every_n_epochs == 0
        if losses or finished:
            report(spec, pm, progress, data, losses, samples, t0, meta, checkpoint=due)


def report(spec, pm, progress, data, losses, samples, t0, meta, *, checkpoint: bool) -> None:
    elapsed = time.perf_counter() - t0
    server_stats = {}
    if isinstance(pm, ParameterServerModel):
        pm.refresh()  # every worker evaluates and saves the servers' latest weights
        server_stats = pm.server_stats()
    val_loss, val_acc = evaluate(spec, pm, data.val_batches())
    metrics = {
        "epoch": progress.epoch,
        "step": pm.step,
        "train_loss": sum(losses) / max(len(losses), 1),
        "val_loss": val_loss,
        "val_acc": val_acc,
        "samples_per_s": samples * pm.data_world_size / max(elapsed, 1e-9),
        "bytes_communicated": pm.bytes_communicated,
        "local_state_bytes": pm.local_state_bytes(),
        "world_size": ray.train.get_context().get_world_size(),  # changes when an elastic job resizes
        **server_stats,
    }
    if not checkpoint:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as d:
        save_checkpoint(pm, os.path.join(d, SHARDS_DIR))
        weights = pm.full_model_state_dict()  # a collective; the weights land on rank 0
        if ray.train.get_context().get_world_rank() == 0:
            torch.save(weights, os.path.join(d, "model.pt"))
            with open(os.path.join(d, "state.json"), "w") as f:
                state = {"epoch": progress.epoch, "step": pm.step, "spec": spec.model_dump(mode="json"), **meta}
                json.dump(state, f)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
