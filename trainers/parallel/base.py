"""The interface every strategy implements, and the training step most of them share.

A :class:`ParallelModel` is this worker's share of a model (whole, sharded, split by
columns, or one pipeline stage) together with its optimizer. The training loop only
talks to this interface:

    loss = pm.train_step(inputs, targets)  # one optimizer step; global-batch mean loss
    t = pm.local_step(inputs, targets)     # the same step, this worker's loss left on its device
    pm.mean_loss(t)                        # -> the global-batch mean (a collective)
    pm.before_evaluate()                   # -> extra metrics; a loop calls it before evaluating
    pm.evaluate(inputs, targets)           # forward only, same averaging
    pm.state_dict() / pm.load_state_dict() # this worker's shard, for DCP checkpoints
    pm.full_model_state_dict()             # plain weights gathered on rank 0, for export
    pm.bytes_communicated                  # gradient-sync bytes sent by this worker

``inputs``/``targets`` are this worker's batch: rows ``pm.data_rank`` of
``pm.data_world_size`` data-parallel slices. Workers that share a data rank (the ranks
of one tensor group or one pipeline) must be given the same batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from api.schemas import ParallelismSpec
from trainers.parallel.plan import ModelPlan

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def mean_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position of the batch (logits ``(..., classes)``),
    in fp32 whatever the forward's precision: ``parallelize``'s default loss."""
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


_FLAT_OPTIM = StateDictOptions(flatten_optimizer_state_dict=True)


class CommCounter:
    """Bytes this worker handed to gradient-synchronisation collectives."""

    def __init__(self) -> None:
        self.bytes = 0


def mesh_device(mesh: DeviceMesh) -> torch.device:
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


def split_batch(t: torch.Tensor, parts: int, knob: str) -> tuple[torch.Tensor, ...]:
    if t.shape[0] % parts:
        raise ValueError(
            f"a per-worker batch of {t.shape[0]} rows cannot be split into {parts} equal "
            f"parts; make the batch size a multiple of parallelism.{knob}"
        )
    return t.chunk(parts)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class ParallelModel:
    """This worker's part of a model, its optimizer, and one training step.

    Subclasses say how a model is placed (:meth:`_place`) and how gradients reach the
    weights (:meth:`_grad_sync`, :meth:`_reduce_grads`, :meth:`_apply_grads`); the
    constructor, the step and the checkpoint plumbing are written once, here.
    """

    strategy = "base"
    # True where backward already averages gradients across data replicas (DDP's
    # buckets, FSDP's reduce-scatter); otherwise _reduce_grads does it after backward.
    syncs_in_backward = False

    def __init__(
        self,
        model: nn.Module,
        mesh: DeviceMesh,
        spec: ParallelismSpec,
        optimizer_factory: OptimizerFactory,
        loss_fn: LossFn,
        plan: ModelPlan | None = None,
    ):
        self.mesh = mesh
        self.spec = spec
        self.loss_fn = loss_fn
        self.plan = plan if plan is not None else ModelPlan()
        self.device = mesh_device(mesh)
        data_mesh = mesh["data"]
        self.data_group = data_mesh.get_group()
        self.data_rank = data_mesh.get_local_rank()
        self.data_world_size = data_mesh.size()
        self.comm = CommCounter()
        self.step = 0
        # Loss scaling keeps small fp16 gradients from flushing to zero; bf16 has fp32's range.
        self.scaler = torch.amp.GradScaler("cuda") if spec.precision == "fp16" else None
        self.module = self._place(model)
        # Built after placement, so it holds (and sizes its state for) what this worker keeps.
        self.optimizer = self._build_optimizer(optimizer_factory)

    # -- placement ------------------------------------------------------------------

    def _place(self, model: nn.Module) -> nn.Module:
        """Put ``model`` on this worker's device, starting from data-rank 0's weights.

        Strategies that shard or split extend this (before or after); it returns the
        module the step runs, which may be a wrapper of ``model``.
        """
        model.to(self.device)
        broadcast_from_data_rank0(model, self.mesh)
        return model

    def _build_optimizer(self, optimizer_factory: OptimizerFactory) -> torch.optim.Optimizer:
        return optimizer_factory([p for p in self.module.parameters() if p.requires_grad])

    @property
    def bytes_communicated(self) -> int:
        return self.comm.bytes

    # -- the training step ---------------------------------------------------------

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """One optimizer step on this worker's batch; returns the global-batch mean loss."""
        return self.mean_loss(self.local_step(inputs, targets))

    def local_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """:meth:`train_step` without averaging the loss: this worker's loss as a 0-dim
        tensor on its device. No collective beyond gradient synchronisation and no
        CPU-GPU sync, so a loop can average a window of them once (:meth:`mean_loss`)."""
        k = self.spec.grad_accumulation_steps
        micro_inputs = split_batch(inputs.to(self.device), k, "grad_accumulation_steps")
        micro_targets = split_batch(targets.to(self.device), k, "grad_accumulation_steps")
        self.module.train()
        loss_sum = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(zip(micro_inputs, micro_targets)):
            # Gradients cross the network only after the last slice; before that they
            # just accumulate locally.
            with self._grad_sync(enabled=i == k - 1):
                with self.autocast():
                    loss = self.loss_fn(self.module(x), y) / k
                self._backward(loss)
            loss_sum += loss.detach()
        self._apply_grads()
        return loss_sum

    def mean_loss(self, local_loss: torch.Tensor) -> float:
        """The mean over data replicas of :meth:`local_step` losses (or of a mean of several
        steps' losses, each replica's taken at the same steps). A collective."""
        return self._data_mean(local_loss)

    def before_evaluate(self) -> dict[str, Any]:
        """Make this worker ready to evaluate; return metrics to report beside the
        evaluation's. Every worker calls it before evaluating (it may be a collective)."""
        return {}

    @torch.no_grad()
    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """Mean loss over the global batch, without touching gradients or weights."""
        self.module.eval()
        try:
            with self.autocast():
                loss = self.loss_fn(self.module(inputs.to(self.device)), targets.to(self.device))
        finally:
            self.module.train()
        return self._data_mean(loss.detach().float())

    # -- pieces strategies override or reuse ----------------------------------------

    @contextlib.contextmanager
    def _grad_sync(self, enabled: bool) -> Iterator[None]:
        """Context for one slice's forward+backward; ``enabled`` on the last slice only."""
        yield

    def _reduce_grads(self) -> None:
        """Average gradients across data replicas, if backward did not already."""
        if self.syncs_in_backward or self.data_world_size == 1:
            return
        grads = local_grads(self.module.parameters())
        self.comm.bytes += allreduce_mean(grads, self.data_group)

    def _apply_grads(self) -> None:
        """After the last slice's backward: synchronise gradients, take the optimizer step."""
        self._reduce_grads()
        self._optimizer_step()

    def autocast(self):
        """The forward-pass precision context of ``spec.precision`` (autocast; fp32 weights)."""
        if self.spec.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.spec.precision == "bf16" else torch.float16
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def _optimizer_step(self) -> None:
        if self.scaler is not None:
            # Skips the step when the scaled gradients overflowed, then adjusts the scale.
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1

    def _data_mean(self, value: torch.Tensor) -> float:
        if self.data_world_size > 1:
            value = value.clone()
            dist.all_reduce(value, group=self.data_group)
            value /= self.data_world_size
        return value.item()  # a CPU-GPU sync point

    # -- checkpoints ---------------------------------------------------------------

    def state_dict(self) -> dict:
        """This worker's model and optimizer state (sharded where the strategy shards).

        Keys use the plain model's parameter names whatever the strategy, which is what
        lets ``trainers.checkpoint`` load a checkpoint under another layout.
        """
        # Flattened optimizer state is keyed by parameter name ("state.<name>.exp_avg",
        # "param_groups.<name>.lr"). The nested form has one "param_groups" list per
        # worker under the same key, which a checkpoint keeps only one copy of; that
        # breaks as soon as workers hold different parameters (pipeline stages).
        model_sd, optim_sd = get_state_dict(self.module, self.optimizer, options=_FLAT_OPTIM)
        sd = {"model": model_sd, "optimizer": optim_sd, "step": self.step}
        if self.scaler is not None:
            sd["scaler"] = self.scaler.state_dict()
        return sd

    def load_state_dict(self, sd: dict) -> None:
        set_state_dict(
            self.module,
            self.optimizer,
            model_state_dict=sd["model"],
            optim_state_dict=sd["optimizer"],
            options=_FLAT_OPTIM,
        )
        self.step = int(sd["step"])
        if self.scaler is not None and "scaler" in sd:
            self.scaler.load_state_dict(sd["scaler"])

    def full_model_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded CPU weights under the plain model's names on global rank 0, ``{}`` elsewhere.

        A collective: every worker must call it. Load the result into a plain model with
        ``model.load_state_dict``.
        """
        return get_model_state_dict(
            self.module,
            options=StateDictOptions(full_state_dict=True, cpu_offload=True),
        )

    def load_full_model_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load unsharded weights (e.g. from a single-process run); every worker passes them."""
        # A copy: loading renames the keys of the dict it is given (e.g. DDP's "module." prefix).
        set_model_state_dict(self.module, dict(sd), options=StateDictOptions(full_state_dict=True))

    # -- accounting ----------------------------------------------------------------

    def local_state_bytes(self) -> int:
        """Bytes of parameters plus optimizer state held by this worker."""
        total = sum(local_tensor(p).nbytes for p in self.module.parameters())
        for state in self.optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    total += local_tensor(value).nbytes
        return total


def allreduce_mean(tensors: Iterable[torch.Tensor], group: dist.ProcessGroup) -> int:
    """Average ``tensors`` in place across ``group`` in one flat collective; return bytes sent."""
    tensors = list(tensors)
    if not tensors:
        return 0
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
    return flat.nbytes


def local_grads(params: Iterable[nn.Parameter]) -> list[torch.Tensor]:
    """Each parameter's local gradient, created as zeros where backward left none.

    Every replica must contribute tensors in the same order and shapes to one flat
    all-reduce, even if a parameter happened not to be used on some replica.
    """
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(local_tensor(p.grad))
    return grads


def broadcast_from_data_rank0(module: nn.Module, mesh: DeviceMesh) -> None:
    """Make every data replica start from data-rank 0's weights.

    Replicas built from the same seed already agree; this guards against a worker that
    built its model differently, which would otherwise train silently apart.
    """
    data_mesh = mesh["data"]
    if data_mesh.size() == 1:
        return
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(local_tensor(t.data), group=data_mesh.get_group(), group_src=0)
