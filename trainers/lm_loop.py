"""The per-worker training loop for the built-in GPT, under any parallelism strategy.

Runs inside each Ray Train worker (``trainers.driver`` picks it for ``model.type: gpt``).
Read it top to bottom: build the mesh and this worker's share of the model
(``trainers.parallel.parallelize``: ddp, fsdp, tensor, pipeline or hybrid, with the
spec's precision, gradient accumulation and compression), resume from the last
checkpoint if there is one, then train step by step on the generated text corpus,
reporting at the end of every epoch, every ``checkpoint.every_n_steps`` and at the end.

Batches are chosen by step number (``trainers.text_data.batch_at``) and sharded by
the worker's *data* rank: the workers of one tensor group or one pipeline get the same
batch. So a resumed run sees exactly the batches the interrupted one would have.

A checkpoint holds, from every worker, its shard of model and optimizer state under
``shards/`` (``torch.distributed.checkpoint``; Ray merges the workers' directories),
and from worker 0 the plain weights ``model.pt`` and ``state.json`` (step, epoch, spec)
for use outside raydock.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from functools import partial

import ray.train
import torch

from api.schemas import GPTModel, TextData, TrainSpec, parse_job_spec
from trainers.gpt import GPTConfig, build_gpt
from trainers.loop import build_optimizer
from trainers.parallel import ParallelModel, build_mesh, load_checkpoint, parallelize, save_checkpoint
from trainers.text_data import VOCAB_SIZE, CharBlocks, batch_at, grammar_dataset

SHARDS_DIR = "shards"


def gpt_config(model: GPTModel) -> GPTConfig:
    return GPTConfig(
        vocab_size=VOCAB_SIZE,
        n_layer=model.n_layer,
        n_head=model.n_head,
        d_model=model.d_model,
        seq_len=model.seq_len,
        dropout=model.dropout,
    )


class TextBatches:
    """The grammar corpus, cut into this worker's batches by step number."""

    def __init__(self, spec: TrainSpec, pm: ParallelModel):
        data: TextData = spec.data
        seq_len = spec.model.seq_len
        self.train = grammar_dataset(seq_len=seq_len, n_chars=data.n_chars, seed=spec.seed)
        self.val = grammar_dataset(seq_len=seq_len, n_chars=data.n_chars, seed=spec.seed, split="val")
        self.batch_size, self.seed = spec.batch_size, spec.seed
        self.rank, self.world = pm.data_rank, pm.data_world_size
        global_batch = self.batch_size * self.world
        self.steps_per_epoch = len(self.train) // global_batch
        self.val_batches = min(data.val_batches, len(self.val) // global_batch)
        self.tokens_per_step = global_batch * seq_len

    def batch(self, ds: CharBlocks, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return batch_at(ds, step, self.batch_size, rank=self.rank, world_size=self.world, seed=self.seed)


def total_steps(spec: TrainSpec, steps_per_epoch: int) -> int:
    limits = [spec.max_steps] if spec.max_steps else []
    if spec.epochs:
        limits.append(spec.epochs * steps_per_epoch)
    return min(limits)


class Window:
    """Training losses and seconds since the last report."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.seconds = 0.0


def evaluate(pm: ParallelModel, data: TextBatches) -> float:
    # Same batch size as training: a pipeline builds a stage per batch shape.
    losses = [pm.evaluate(*data.batch(data.val, i)) for i in range(data.val_batches)]
    return sum(losses) / len(losses)


def train_loop(config: dict) -> None:
    spec = parse_job_spec(config["spec"])
    # One seed on every worker: tensor-parallel workers must draw the same dropout masks.
    torch.manual_seed(spec.seed)
    torch.set_num_threads(max(1, int(spec.scaling.cpus_per_worker)))

    mesh = build_mesh(spec.parallelism)
    pm = parallelize(
        build_gpt(gpt_config(spec.model), seed=spec.seed),
        mesh,
        spec.parallelism,
        optimizer_factory=partial(build_optimizer, spec.optimizer),
    )
    data = TextBatches(spec, pm)
    if (checkpoint := ray.train.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d:
            load_checkpoint(pm, os.path.join(d, SHARDS_DIR))

    last = total_steps(spec, data.steps_per_epoch)
    every_steps = spec.checkpoint.every_n_steps
    window = Window()
    while pm.step < last:
        t0 = time.perf_counter()
        window.losses.append(pm.train_step(*data.batch(data.train, pm.step)))
        window.seconds += time.perf_counter() - t0
        step = pm.step
        epoch_end = step % data.steps_per_epoch == 0
        checkpoint_due = (
            step == last
            or (epoch_end and (step // data.steps_per_epoch) % spec.checkpoint.every_n_epochs == 0)
            or (every_steps is not None and step % every_steps == 0)
        )
        if epoch_end or checkpoint_due:
            report(spec, pm, data, window, checkpoint=checkpoint_due)
            window = Window()


def report(spec: TrainSpec, pm: ParallelModel, data: TextBatches, window: Window, *, checkpoint: bool) -> None:
    metrics = {
        "epoch": pm.step // data.steps_per_epoch,
        "step": pm.step,
        "train_loss": sum(window.losses) / len(window.losses),
        "val_loss": evaluate(pm, data),
        "tokens_per_s": len(window.losses) * data.tokens_per_step / max(window.seconds, 1e-9),
        # Worker 0's figures (only rank 0's metrics are kept): the gradient-sync bytes it
        # sent since this attempt started, and the parameter + optimizer bytes it holds.
        "bytes_communicated": pm.bytes_communicated,
        "local_state_bytes": pm.local_state_bytes(),
        "world_size": ray.train.get_context().get_world_size(),
    }
    if not checkpoint:
        ray.train.report(metrics)
        return
    # Every worker writes what it holds; Ray merges the workers' directories into one.
    with tempfile.TemporaryDirectory() as d:
        save_checkpoint(pm, os.path.join(d, SHARDS_DIR))
        weights = pm.full_model_state_dict()  # a collective; the weights land on rank 0
        if ray.train.get_context().get_world_rank() == 0:
            torch.save(weights, os.path.join(d, "model.pt"))
            with open(os.path.join(d, "state.json"), "w") as f:
                state = {"epoch": metrics["epoch"], "step": pm.step, "spec": spec.model_dump(mode="json")}
                json.dump(state, f)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
