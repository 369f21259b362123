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
LR = 0.01


def build(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    x = torch.randn(128, 256)
    y = torch.randint(0, 10, (128,))
    return model, x, y


def run_steps(step, report=None) -> list[float]:
    """Call ``step()`` STEPS times; returns each step's seconds. ``report(step, mean_s)`` every REPORT_EVERY."""
    times: list[float] = []
    for i in range(1, STEPS + 1):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        if report is not None and i % REPORT_EVERY == 0:
            report(i, sum(times[-REPORT_EVERY:]) / REPORT_EVERY)
    return times


def plain_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """One SGD step of ``model`` (plain, or wrapped in DDP) on the fixed batch."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def parallelized_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """The same step as the built-in loops take it: ``parallelize`` with the default
    parallelism (DDP over the data axis) and ``ParallelModel.local_step``."""
    from api.schemas import ParallelismSpec
    from trainers.parallel import build_mesh, parallelize

    spec = ParallelismSpec()
    pm = parallelize(
        model,
        build_mesh(spec),
        spec,
        optimizer_factory=lambda params: torch.optim.SGD(params, lr=LR),
        loss_fn=nn.functional.cross_entropy,
    )
    return lambda: pm.local_step(x, y)


def steady(times: list[float]) -> float:
    """Median step time after warm-up."""
    rest = sorted(times[WARMUP:])
    return rest[len(rest) // 2]


def ray_train_loop(config: dict) -> None:
    """The loop as a Ray Train per-worker function (used by the raw TorchTrainer and the raydock job).

    ``config["placement"]``: ``prepare_model`` (Ray's DDP wrapper, the default) or
    ``parallelize`` (raydock's, as the built-in loops use it)."""
    import tempfile

    import ray.train
    import ray.train.torch

    if config.get("renice"):
        _renice()
    model, x, y = build()
    if config.get("placement", "prepare_model") == "parallelize":
        step = parallelized_step(model, x, y)
    else:
        step = plain_step(ray.train.torch.prepare_model(model), x, y)
    times = run_steps(step, report=lambda i, mean_s: ray.train.report({"step": i, "step_s": mean_s}))
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
    times = run_steps(plain_step(nn.parallel.DistributedDataParallel(model), x, y))
    if rank == 0:
        out.put({"steady_step_s": steady(times), "nice": os.nice(0), "threads": torch.get_num_threads()})
    dist.destroy_process_group()
