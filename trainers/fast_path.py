"""The training step's fast path: what makes a built-in loop as fast as a hand-written one.

Each piece removes a cost a plain eager loop pays on a GPU:

- :func:`resolve` turns ``parallelism.compile`` (auto | on | off) and the device into a
  :class:`FastPath`: which of the pieces below apply;
- :func:`compile_model` / :func:`compile_loss`: ``torch.compile`` (fused kernels, fewer
  launches). The model is compiled *in place*, block by block where it has blocks, so
  parameter names, state dicts and checkpoints are those of the plain model, and
  DDP/FSDP still see one module per block (their bucket and shard boundaries);
- :func:`optimizer_options`: the fused (single-kernel) Adam/AdamW/SGD step on CUDA;
- :class:`LossMeter`: losses summed on the device and read once per report, so the
  step never waits for the GPU (``loss.item()`` each step is a CPU-GPU sync point that
  drains the launch queue);
- :func:`prefetch`: batches prepared ahead by a background thread in pinned memory and
  copied with ``non_blocking=True``. A copy from pageable memory blocks the host until
  the GPU has caught up, which would be a sync per step;
- :func:`allow_tf32`: TF32 tensor cores for fp32 matrix products (about 10 bits of
  mantissa in the products, fp32 accumulation), the PyTorch Lightning / timm default;
- :class:`ReportClock`: when a report is due, by time or by steps, so charts fill
  while a long epoch runs.

Nothing here is on by default on CPU except the report clock: compile is ``auto`` ->
off there (compile time dwarfs the gain on small CPU jobs), and the rest are CUDA
mechanisms.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

# Strategies ``compile: auto`` compiles on CUDA. ``compile: on`` also compiles tensor,
# pipeline and hybrid placements (blocks compiled inside their shards or stages); the
# parameter server's workers stay eager (their step is remote calls, not kernels).
AUTO_COMPILE_STRATEGIES = frozenset({"ddp", "fsdp"})
NEVER_COMPILE_STRATEGIES = frozenset({"parameter_server"})


@dataclass(frozen=True)
class FastPath:
    """Which fast-path pieces a worker uses; see :func:`resolve`."""

    compile: bool
    tf32: bool
    fused_optimizer: bool
    prefetch: bool


def resolve(setting: str, device: torch.device, *, strategy: str = "ddp", precision: str = "fp32") -> FastPath:
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
        fused_optimizer=cuda,
        prefetch=cuda,
    )


def allow_tf32(enabled: bool) -> None:
    """TF32 for fp32 matrix products and convolutions (process-wide; CUDA only)."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def optimizer_options(fast: FastPath) -> dict[str, bool]:
    """Keyword arguments for ``torch.optim.{SGD,Adam,AdamW}``: one fused kernel per step on CUDA."""
    return {"fused": True} if fast.fused_optimizer else {}


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


class LossMeter:
    """Training losses of one report window, summed where they were computed.

    ``add`` never leaves the device; ``mean`` is the window's one CPU-GPU sync point.
    """

    def __init__(self) -> None:
        self._sum: torch.Tensor | None = None
        self.count = 0

    def add(self, loss: torch.Tensor) -> None:
        loss = loss.detach().float()
        self._sum = loss if self._sum is None else self._sum + loss
        self.count += 1

    def mean(self, group: dist.ProcessGroup | None = None, world_size: int = 1) -> float | None:
        """The window's mean loss, averaged over ``group``'s ranks; ``None`` if empty.

        With a group, a collective: every rank of it must call ``mean`` with the same
        number of losses added.
        """
        if self._sum is None:
            return None
        value = self._sum / self.count
        if group is not None and world_size > 1:
            dist.all_reduce(value, group=group)
            value = value / world_size
        return value.item()  # a CPU-GPU sync point, once per report


class ReportClock:
    """Whether a report is due: every ``every_s`` seconds and/or every ``every_n_steps`` steps.

    A report is a barrier every rank must reach at the same step, and clocks differ
    between workers, so with a ``group`` rank 0's decision is broadcast to the others.
    Build the group with :func:`cpu_group`: a gloo broadcast of one CPU integer costs
    tens of microseconds and, unlike one over NCCL, never waits for the GPU.
    """

    def __init__(
        self,
        every_s: float | None,
        every_n_steps: int | None,
        *,
        group: dist.ProcessGroup | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.every_s, self.every_n_steps, self.clock = every_s, every_n_steps, clock
        self.group = group
        self.shared = group is not None and dist.get_world_size(group) > 1
        self.last_time = clock()

    def due(self, step: int) -> bool:
        if self.every_n_steps and step % self.every_n_steps == 0:
            return True  # every rank counts the same steps: no need to agree
        if not self.every_s:
            return False
        late = self.clock() - self.last_time >= self.every_s
        if not self.shared:
            return late
        flag = torch.tensor([int(late)])
        dist.broadcast(flag, group=self.group, group_src=0)
        return bool(flag[0])

    def reset(self) -> None:
        """Start a new window (after a report, whatever made it due)."""
        self.last_time = self.clock()


def cpu_group() -> dist.ProcessGroup | None:
    """A gloo group of all ranks for small host-side agreements; ``None`` when alone.

    A collective on first use (every rank must call it). On a gloo job the default
    group is already one.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    return dist.new_group(backend="gloo")


def _pinned(batch):
    return tuple(t.pin_memory() if t.device.type == "cpu" else t for t in batch)


def prefetch(batches: Iterable[tuple[torch.Tensor, ...]], device: torch.device, depth: int = 2) -> Iterator[tuple[torch.Tensor, ...]]:
    """Yield ``batches`` on ``device``, prepared ``depth`` ahead.

    On CUDA a daemon thread builds and pins the next batches while the GPU trains on
    the current one; each is copied with ``non_blocking=True`` on the current stream,
    so it lands before the step that uses it and the host never waits. Elsewhere the
    batches are moved as they come (a CPU worker has no spare core to prepare on).
    """
    if device.type != "cuda":
        for batch in batches:
            yield tuple(t.to(device) for t in batch)
        return
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for batch in batches:
                item = _pinned(batch)
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
            yield tuple(t.to(device, non_blocking=True) for t in item)
    finally:
        stop.set()
