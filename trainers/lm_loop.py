"""The per-worker training loop for the built-in GPT, under any parallelism strategy.

Runs inside each Ray Train worker (``trainers.trainer`` picks it for ``model.type: gpt``).
Build the mesh and this worker's share of the model (``trainers.parallel.parallelize``:
ddp, fsdp, tensor, pipeline or hybrid, with the spec's precision, gradient accumulation
and compression), resume, then ``trainers.skeleton.train`` runs the steps on the
generated text corpus, reporting at every epoch end, every ``checkpoint.every_n_steps``,
as ``report`` says and at the end, and checkpointing in ``trainers.checkpoint``'s format.

Batches are chosen by step number (``trainers.data.text.batch_at``) and sharded by
the worker's *data* rank: the workers of one tensor group or one pipeline get the same
batch. So a resumed run sees exactly the batches the interrupted one would have.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from api.schemas import GPTModel, TextData, TrainSpec, parse_job_spec
from trainers import efficiency
from trainers.data.sources import node_cache
from trainers.data.text import VOCAB_SIZE, CharBlocks, batch_at, corpus_tokens, grammar_dataset
from trainers.models.gpt import GPTConfig, build_gpt
from trainers.parallel import ParallelModel, build_mesh, parallelize
from trainers.skeleton import (
    Start,
    Step,
    optimizer_factory,
    resume,
    setup_worker,
    train,
)


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
        tokens = corpus_tokens(data.n_chars, spec.seed, node_cache(data.cache))
        self.train = grammar_dataset(seq_len=seq_len, n_chars=data.n_chars, seed=spec.seed, tokens=tokens)
        self.val = grammar_dataset(seq_len=seq_len, n_chars=data.n_chars, seed=spec.seed, split="val", tokens=tokens)
        self.batch_size, self.seed = spec.batch_size, spec.seed
        self.rank, self.world = pm.data_rank, pm.data_world_size
        global_batch = self.batch_size * self.world
        self.steps_per_epoch = len(self.train) // global_batch
        self.val_batches = min(data.val_batches, len(self.val) // global_batch)

    def batch(self, ds: CharBlocks, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return batch_at(
            ds,
            step,
            self.batch_size,
            rank=self.rank,
            world_size=self.world,
            seed=self.seed,
        )


def total_steps(spec: TrainSpec, steps_per_epoch: int) -> int:
    limits = [spec.max_steps] if spec.max_steps else []
    if spec.epochs:
        limits.append(spec.epochs * steps_per_epoch)
    return min(limits)


def train_loop(config: dict) -> None:
    spec = parse_job_spec(config["spec"])
    setup_worker(spec)
    pm = parallelize(
        build_gpt(gpt_config(spec.model), seed=spec.seed),
        build_mesh(spec.parallelism),
        spec.parallelism,
        optimizer_factory=optimizer_factory(spec),
    )
    data = TextBatches(spec, pm)
    start = resume(spec, pm)
    train(
        spec,
        pm,
        steps(data, start, total_steps(spec, data.steps_per_epoch)),
        lambda: {"val_loss": evaluate(pm, data)},
        throughput=("tokens_per_s", spec.model.seq_len),
        flops_per_unit=efficiency.gpt_flops_per_token(
            n_layer=spec.model.n_layer,
            d_model=spec.model.d_model,
            seq_len=spec.model.seq_len,
            vocab_size=VOCAB_SIZE,
        ),
    )


def steps(data: TextBatches, start: Start, last: int) -> Iterator[Step]:
    """Steps ``start.step + 1 .. last``; step n trains on batch n - 1 of the corpus."""
    per_epoch = data.steps_per_epoch
    for number in range(start.step + 1, last + 1):
        x, y = data.batch(data.train, number - 1)
        yield Step(
            number,
            number // per_epoch,
            x,
            y,
            epoch_end=number % per_epoch == 0,
            last=number == last,
        )


def evaluate(pm: ParallelModel, data: TextBatches) -> float:
    # Same batch size as training: a pipeline builds a stage per batch shape.
    losses = [pm.evaluate(*data.batch(data.val, i)) for i in range(data.val_batches)]
    return sum(losses) / len(losses)
