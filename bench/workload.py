"""The fixed DDP workload every variant of bench/overhead.py runs: an MLP on random
data, a fixed number of steps, per-step compute time measured around the step alone."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch import nn

STEPS = int(os.environ.get("BENCH_STEPS", "400"))
REPORT_EVERY = 50
WARMUP = 20


def build(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    x = torch.randn(128, 256)
    y = torch.randint(0, 10, (128,))
    return model, x, y


def run_steps(model: nn.Module, x: torch.Tensor, y: torch.Tensor, report=None) -> list[float]:
    """Train STEPS steps; returns each step's seconds. ``report(step, mean_s)`` every REPORT_EVERY."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times: list[float] = []
    for step in range(1, STEPS + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if report is not None and step % REPORT_EVERY == 0:
            report(step, sum(times[-REPORT_EVERY:]) / REPORT_EVERY)
    return times


def steady(times: list[float]) -> float:
    """Median step time after warm-up."""
    rest = sorted(times[WARMUP:])
    return rest[len(rest) // 2]


def ray_train_loop(config: dict) -> None:
    """The loop as a Ray Train per-worker function (used by the raw TorchTrainer and the raydock job)."""
    import ray.train
    import ray.train.torch

    import tempfile

    if config.get("renice"):
        _renice()
    model, x, y = build()
    model = ray.train.torch.prepare_model(model)
    times = run_steps(model, x, y, report=lambda step, mean_s: ray.train.report({"step": step, "step_s": mean_s}))
    final = {"step": STEPS, "steady_step_s": steady(times), "nice": os.nice(0), "threads": torch.get_num_threads()}
    # A checkpoint on the last report makes these the Result.metrics of a raw fit().
    with tempfile.TemporaryDirectory() as d:
        ckpt = ray.train.Checkpoint.from_directory(d) if ray.train.get_context().get_world_rank() == 0 else None
        ray.train.report(final, checkpoint=ckpt)


def _renice() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except PermissionError:
        pass


def vanilla_worker(rank: int, world: int, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # One thread per process on a machine of `world` cores: the fair baseline (torch's
    # default, all cores per process, oversubscribes and is slower).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, x, y = build()
    model = nn.parallel.DistributedDataParallel(model)
    times = run_steps(model, x, y)
    if rank == 0:
        out.put({"steady_step_s": steady(times), "nice": os.nice(0), "threads": torch.get_num_threads()})
    dist.destroy_process_group()
