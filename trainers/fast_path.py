"""The training step's fast path: what makes a built-in loop as fast as a hand-written one.

Each piece removes a cost a plain eager loop pays on a GPU:

- :func:`resolve` turns ``parallelism.compile`` (auto | on | off) and the device into a
  :class:`FastPath`: which of the pieces below apply;
- :func:`compile_model` / :func:`compile_loss`: ``torch.compile`` (fused kernels, fewer
  launches). The model is compiled *in place*, block by block where it has blocks, so
  parameter names, state dicts and checkpoints are those of the plain model, and
  DDP/FSDP still see one module per block (their bucket and shard boundaries);
- :func:`optimizer_options`: the fused (single-kernel) Adam/AdamW/SGD step on CUDA, as
  ``trainers.skeleton.build_optimizer`` builds it (the step's loss stays on the device until a report: ``ParallelModel.local_step``
  and the skeleton's window, never a per-step ``.item()``);
- :func:`prefetch`: batches prepared ahead by a background thread in pinned memory and
  copied with ``non_blocking=True``. A copy from pageable memory blocks the host until
  the GPU has caught up, which would be a sync per step;
- :func:`allow_tf32`: TF32 tensor cores for fp32 matrix products (about 10 bits of
  mantissa in the products, fp32 accumulation), the PyTorch Lightning / timm default.

Nothing here is on by default on CPU: compile is ``auto`` -> off there (compile time
dwarfs the gain on small CPU jobs), and the rest are CUDA mechanisms. The report
cadence (by time and steps) is ``trainers.skeleton``'s.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

# Strategies ``compile: auto`` compiles on CUDA. ``compile: on`` also compiles tensor,
# pipeline and hybrid placements (blocks compiled inside their shards or stages); the
# parameter server's workers stay eager (their step is remote calls, not kernels).
AUTO_COMPILE_STRATEGIES = frozenset({"ddp", "fsdp"})
NEVER_COMPILE_STRATEGIES = frozenset({"parameter_server"})

T = TypeVar("T")


@dataclass(frozen=True)
class FastPath:
    """Which fast-path pieces a worker uses; see :func:`resolve`."""

    compile: bool
    tf32: bool
    prefetch: bool


def resolve(
    setting: str,
    device: torch.device,
    *,
    strategy: str = "ddp",
    precision: str = "fp32",
) -> FastPath:
    """The fast path for ``parallelism.compile`` = ``setting`` on ``device``.

    ``auto``: compile on CUDA for ddp and fsdp, eager elsewhere. ``on``: compile on any
    device for any strategy but the parameter server. ``off``: eager, and fp32 stays
    full fp32 (no TF32): the reference path to compare the fast one against.
    """
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"parallelism.compile must be auto, on or off, not {setting!r}")
    cuda = device.type == "cuda"
    if strategy in NEVER_COMPILE_STRATEGIES or setting == "off":
        compile_ = False
    elif setting == "on":
        compile_ = True
    else:
        compile_ = cuda and strategy in AUTO_COMPILE_STRATEGIES
    return FastPath(
        compile=compile_,
        tf32=cuda and precision == "fp32" and setting != "off",
        prefetch=cuda,
    )


def allow_tf32(enabled: bool) -> None:
    """TF32 for fp32 matrix products and convolutions (process-wide; CUDA only)."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def optimizer_options(params: Iterable) -> dict[str, bool]:
    """Keyword arguments for ``torch.optim.{SGD,Adam,AdamW}`` over ``params``.

    Fused when every parameter is on a GPU: one kernel updates them all (no launch per
    tensor), and the step counters stay on the device (no host reads; GradScaler's
    check fuses in too). Decided by where the parameters are, not by the worker's
    device: a parameter server's optimizers run on CPU actors.
    """
    params = list(params)
    on_gpu = bool(params) and all(isinstance(p, torch.Tensor) and p.is_cuda for p in params)
    return {"fused": True} if on_gpu else {}


def compile_model(model: nn.Module) -> nn.Module:
    """Compile ``model`` in place and return it.

    A model with a ``blocks`` container (the built-in GPT) has each block compiled:
    one graph per block keeps compile time flat in depth, matches the units FSDP shards
    and DDP buckets by, and leaves the pipeline free to drop blocks. Anything else is
    compiled whole. In place (``nn.Module.compile``) keeps the parameter names: no
    ``_orig_mod.`` prefix ever reaches a checkpoint.
    """
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, (nn.ModuleDict, nn.ModuleList, nn.Sequential)) and len(blocks):
        for block in blocks.children():
            block.compile()
    else:
        model.compile()
    return model


def compile_loss(loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """``loss_fn`` compiled (the fp32 upcast, log-softmax and reduction fuse into one kernel)."""
    return torch.compile(loss_fn)


def accelerate(pm, fast: FastPath):
    """Compile a placed model (a ``trainers.parallel.ParallelModel``) and its loss, in place.

    Under ddp the DDP wrapper itself is compiled: dynamo then cuts the graph at DDP's
    bucket boundaries, so gradient all-reduces still overlap the backward pass. Other
    strategies compile the model's blocks inside their shards or stages.
    """
    if not fast.compile:
        return pm
    if pm.strategy == "ddp":
        pm.module.compile()
    else:
        compile_model(pm.module)
    pm.loss_fn = compile_loss(pm.loss_fn)
    return pm


def _map_tensors(item, fn):
    """``item`` (a tensor, a tuple of them, or a dataclass such as a skeleton ``Step``)
    with ``fn`` applied to each of its tensors."""
    if isinstance(item, torch.Tensor):
        return fn(item)
    if isinstance(item, tuple):
        return tuple(_map_tensors(t, fn) for t in item)
    if dataclasses.is_dataclass(item):
        changes = {
            f.name: fn(v) for f in dataclasses.fields(item) if isinstance(v := getattr(item, f.name), torch.Tensor)
        }
        return dataclasses.replace(item, **changes)
    return item


def _pin(t: torch.Tensor) -> torch.Tensor:
    return t.pin_memory() if t.device.type == "cpu" else t


def prefetch(batches: Iterable[T], device: torch.device, depth: int = 2) -> Iterator[T]:
    """Yield ``batches`` (tensors, tuples of them, or dataclasses holding them) on
    ``device``, prepared ``depth`` ahead.

    On CUDA a daemon thread builds and pins the next batches while the GPU trains on
    the current one; each is copied with ``non_blocking=True`` on the current stream,
    so it lands before the step that uses it and the host never waits. Elsewhere the
    batches are moved as they come (a CPU worker has no spare core to prepare on).
    """
    if device.type != "cuda":
        for batch in batches:
            yield _map_tensors(batch, lambda t: t.to(device))
        return
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for batch in batches:
                item = _map_tensors(batch, _pin)
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            q.put(exc)

    thread = threading.Thread(target=produce, daemon=True, name="raydock-prefetch")
    thread.start()
    try:
        while (item := q.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield _map_tensors(item, lambda t: t.to(device, non_blocking=True))
    finally:
        stop.set()
