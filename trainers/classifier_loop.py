"""The per-worker loop for the built-in classifiers (mlp, cnn), under any parallelism.

``trainers.trainer`` runs it for every job with ``model.type`` mlp or cnn: the default
(ddp, fp32), bf16, fsdp, the parameter server, gradient accumulation and compression
all take this loop and its one checkpoint format. The model goes through
``trainers.parallel.parallelize`` like the GPT does; steps, reports and checkpoints are
``trainers.skeleton``'s.

Epochs: each worker walks its shard of the training split in an order fixed by the seed
and the epoch (``trainers.data.tabular``). A resumed run restarts the epoch its checkpoint was
taken in (use ``checkpoint.every_n_steps`` for finer resume) and keeps counting steps.
Its checkpoints carry ``n_features`` and ``n_classes`` in ``state.json``: with the model
spec that rebuilds the network (``trainers.models.build_model``) to load ``model.pt`` into.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from api.schemas import TrainSpec, parse_job_spec
from trainers import efficiency
from trainers.data.tabular import Batch, InMemoryData, RayDataShards, classifier_data
from trainers.models import build_model
from trainers.parallel import ParallelModel, build_mesh, parallelize
from trainers.skeleton import (
    Start,
    Step,
    optimizer_factory,
    resume,
    setup_worker,
    train,
)

Data = InMemoryData | RayDataShards


def classification_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # fp32 loss whatever the autocast precision of the logits.
    return nn.functional.cross_entropy(logits.float(), targets)


def build_classifier(spec: TrainSpec, n_features: int, n_classes: int) -> ParallelModel:
    """The spec's classifier on this worker, placed by its parallelism (collective)."""
    return parallelize(
        build_model(spec.model, n_features, n_classes),
        build_mesh(spec.parallelism),
        spec.parallelism,
        optimizer_factory=optimizer_factory(spec),
        loss_fn=classification_loss,
    )


def train_loop(config: dict) -> None:
    spec = parse_job_spec(config["spec"])
    setup_worker(spec)
    data = classifier_data(spec, config.get("data_meta", {}), dist.get_rank(), dist.get_world_size())
    pm = build_classifier(spec, data.n_features, data.n_classes)
    start = resume(spec, pm)
    train(
        spec,
        pm,
        steps(spec, data, start),
        lambda: evaluate(pm, data.val_batches()),
        throughput=("samples_per_s", 1),
        meta={"n_features": data.n_features, "n_classes": data.n_classes},
        # Counted on a plain copy of the model: one forward of two zero rows, x 3.
        flops_per_unit=efficiency.flops_per_sample(
            build_model(spec.model, data.n_features, data.n_classes),
            torch.zeros(2, data.n_features),
        ),
    )


def steps(spec: TrainSpec, data: Data, start: Start) -> Iterator[Step]:
    """The run's remaining steps: whole epochs of batches from ``start``, up to
    ``spec.epochs`` or ``spec.max_steps``."""
    k = spec.parallelism.grad_accumulation_steps
    max_epochs = spec.epochs or 10**9
    max_steps = spec.max_steps or float("inf")
    number = start.step
    for epoch in range(start.epoch, max_epochs):
        if number >= max_steps:
            return
        batches = (whole_slices(x, y, k) for x, y in data.train_batches(epoch))
        empty = True
        for (x, y), epoch_end in with_last(b for b in batches if len(b[1])):
            number, empty = number + 1, False
            done = epoch + 1 if epoch_end else epoch
            yield Step(
                number,
                done,
                x,
                y,
                epoch_end=epoch_end,
                last=number >= max_steps or done >= max_epochs,
            )
            if number >= max_steps:
                return
        if empty:
            raise ValueError(
                f"worker {dist.get_rank()} has no training batch in epoch {epoch}: its shard is smaller than "
                f"parallelism.grad_accumulation_steps ({k}) rows. Use more data or fewer workers."
            )


def with_last(items: Iterator[Batch]) -> Iterator[tuple[Batch, bool]]:
    """Each item with whether it is the last one (one item of lookahead, nothing more held)."""
    it = iter(items)
    try:
        held = next(it)
    except StopIteration:
        return
    for item in it:
        yield held, False
        held = item
    yield held, True


def whole_slices(x: torch.Tensor, y: torch.Tensor, k: int) -> Batch:
    """Drop the rows that would leave accumulation slices unequal (a last partial batch)."""
    n = len(x) - len(x) % k
    return x[:n], y[:n]


@torch.no_grad()
def evaluate(pm: ParallelModel, batches: Iterator[Batch]) -> dict[str, Any]:
    """Loss and accuracy over every worker's validation shard (a collective; the
    skeleton calls ``pm.before_evaluate()`` first)."""
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
        with pm.autocast():
            logits = pm.module(x).float()
        totals[0] += nn.functional.cross_entropy(logits, y, reduction="sum").double()
        totals[1] += (logits.argmax(1) == y).sum()
        totals[2] += len(y)
    dist.all_reduce(totals)
    pm.module.train()
    rows = max(totals[2].item(), 1.0)
    return {"val_loss": totals[0].item() / rows, "val_acc": totals[1].item() / rows}
