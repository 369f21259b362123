"""Run a function on N fresh processes joined by a gloo process group, and a reference.

``run_workers(fn, world_size, *args)`` starts ``world_size`` processes (one CPU thread
each, so 2 workers fit 2 cores), initialises ``torch.distributed`` with gloo on a free
port, calls ``fn(rank, world_size, *args)`` and returns every rank's return value.
``fn`` must be a module-level function so the new processes can import it.

Processes come from a fork server that has already imported torch and the trainers:
a fresh interpreter per process would spend ~2 s per test importing torch, and
forking a process that has never run torch code is safe.

``reference_run`` trains the same tiny GPT on the same global batches in this process
with no parallelism at all: the ground truth the strategies are compared with.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainers.data.text import VOCAB_SIZE, batch_at, grammar_dataset
from trainers.models.gpt import GPTConfig, build_gpt, lm_loss
from trainers.parallel import build_mesh, parallelize

multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "trainers.parallel", __name__])

CFG = GPTConfig(vocab_size=VOCAB_SIZE, n_layer=2, n_head=2, d_model=32, seq_len=16)
GLOBAL_BATCH = 16
SEED = 0
LR = 3e-3


def make_optimizer(params):
    return torch.optim.AdamW(params, lr=LR)


def dataset():
    return grammar_dataset(seq_len=CFG.seq_len, n_chars=16 * 1024, seed=SEED)


def val_batch():
    ds = grammar_dataset(seq_len=CFG.seq_len, n_chars=16 * 1024, seed=SEED, split="val")
    return batch_at(ds, 0, GLOBAL_BATCH, seed=SEED)


def reference_run(steps: int) -> dict:
    """Losses, final weights and validation loss of plain single-process training."""
    ds = dataset()
    model = build_gpt(CFG, seed=SEED)
    opt = make_optimizer(list(model.parameters()))
    losses = []
    for step in range(steps):
        x, y = batch_at(ds, step, GLOBAL_BATCH, seed=SEED)
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    with torch.no_grad():
        x, y = val_batch()
        val = lm_loss(model(x), y).item()
    return {"losses": losses, "state": model.state_dict(), "val": val}


def train_specs_worker(rank, world_size, specs, steps):
    """For each spec in turn: per-step losses and per-step gradient-sync bytes."""
    runs = []
    for spec in specs:
        pm = parallelize(build_gpt(CFG, seed=SEED), build_mesh(spec), spec, optimizer_factory=make_optimizer)
        ds = dataset()
        per_rank = GLOBAL_BATCH // pm.data_world_size
        losses, step_bytes = [], []
        for step in range(steps):
            x, y = batch_at(ds, step, per_rank, rank=pm.data_rank, world_size=pm.data_world_size, seed=SEED)
            before = pm.bytes_communicated
            losses.append(pm.train_step(x, y))
            step_bytes.append(pm.bytes_communicated - before)
        runs.append({"losses": losses, "bytes": step_bytes})
    return runs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, out_dir, backend, fn, args):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_workers(fn, world_size: int, *args, backend: str = "gloo", timeout_s: float = 120) -> list:
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _entry,
            args=(world_size, _free_port(), out_dir, backend, fn, args),
            nprocs=world_size,
            join=False,
            start_method="forkserver",
        )
        deadline = time.monotonic() + timeout_s
        # join() raises as soon as one worker fails (and stops the others).
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise TimeoutError(f"{fn.__name__} did not finish within {timeout_s}s")
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]
