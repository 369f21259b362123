"""Parallelism strategies, applied to a plain model from outside.

Inside each training worker, after the default process group exists (Ray Train
creates it: gloo on CPU, NCCL on GPU, with each worker's GPU already selected):

    mesh = build_mesh(spec.parallelism)                          # collective
    model = build_gpt(cfg, seed=seed)            # trainers.models.gpt; same seed everywhere
    pm = parallelize(model, mesh, spec.parallelism,
                     optimizer_factory=lambda ps: torch.optim.AdamW(ps, lr=3e-4))
    for step in range(start, steps):
        x, y = batch_at(ds, step, batch_size, rank=pm.data_rank, world_size=pm.data_world_size)
        loss = pm.train_step(x, y)

Batches are sharded by ``pm.data_rank`` / ``pm.data_world_size``, not by the worker's
global rank: the workers of one tensor group or one pipeline must see the same batch.

``parallelize`` returns a :class:`ParallelModel` (see ``base``) whatever the strategy;
``trainers.checkpoint`` writes and restores it. One module per strategy: ``ddp``,
``fsdp``, ``tensor``, ``pipeline``, ``hybrid``, ``parameter_server``.

This package names no model. Tensor and pipeline parallelism take the model's
:class:`ModelPlan` (``plan``), registered by the model's package (the GPT's lives in
``trainers.models.gpt.parallelize``) or passed to ``parallelize``.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from api.schemas import ParallelismSpec, resolve_mesh, validate_parallelism
from trainers.parallel.base import (
    LossFn,
    OptimizerFactory,
    ParallelModel,
    mean_cross_entropy,
)
from trainers.parallel.ddp import DDPModel
from trainers.parallel.fsdp import FSDPModel
from trainers.parallel.hybrid import parallelize_hybrid
from trainers.parallel.parameter_server import parallelize_parameter_server
from trainers.parallel.pipeline import PipelineParallelModel
from trainers.parallel.plan import ModelPlan, plan_for, register_plan
from trainers.parallel.tensor import TensorParallelModel

__all__ = [
    "MESH_DIMS",
    "ModelPlan",
    "ParallelModel",
    "build_mesh",
    "parallelize",
    "register_plan",
]

MESH_DIMS = ("data", "pipeline", "tensor")

_STRATEGIES = {
    "ddp": DDPModel,
    "fsdp": FSDPModel,
    "tensor": TensorParallelModel,
    "pipeline": PipelineParallelModel,
    "hybrid": parallelize_hybrid,
    "parameter_server": parallelize_parameter_server,
}


def build_mesh(spec: ParallelismSpec, *, device_type: str | None = None) -> DeviceMesh:
    """The ``data x pipeline x tensor`` device mesh for ``spec`` over all workers.

    A collective: every worker calls it once, after the default process group is up.
    ``device_type`` defaults to ``cuda`` when the process group uses NCCL, else ``cpu``.
    """
    if not dist.is_initialized():
        raise RuntimeError(
            "build_mesh needs the default process group; inside Ray Train it already "
            "exists, elsewhere call torch.distributed.init_process_group first"
        )
    if device_type is None:
        device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    shape = resolve_mesh(spec, dist.get_world_size())
    return init_device_mesh(
        device_type,
        (shape.data, shape.pipeline, shape.tensor),
        mesh_dim_names=MESH_DIMS,
    )


def parallelize(
    model: nn.Module,
    mesh: DeviceMesh,
    spec: ParallelismSpec,
    *,
    optimizer_factory: OptimizerFactory,
    loss_fn: LossFn = mean_cross_entropy,
    plan: ModelPlan | None = None,
) -> ParallelModel:
    """Place ``model`` on this worker's part of ``mesh`` as ``spec`` says; build its optimizer.

    Modifies ``model`` in place (sharding, dropping other stages' layers): use the
    returned object from then on. ``optimizer_factory`` receives this worker's
    parameters after placement. ``loss_fn(logits, targets)`` must average over the
    batch so that microbatches and replicas average to the full-batch loss; the default
    is the mean cross-entropy over every position. ``plan`` says how tensor and pipeline
    parallelism split the model; by default the one registered for its class.
    """
    if mesh.mesh_dim_names != MESH_DIMS:
        raise ValueError(f"mesh must have dimensions {MESH_DIMS}; build it with build_mesh")
    cfg = getattr(model, "config", None)
    errors = validate_parallelism(
        spec,
        num_workers=mesh.size(),
        use_gpu=mesh.device_type == "cuda",
        n_layers=getattr(cfg, "n_layer", None),
        n_heads=getattr(cfg, "n_head", None),
        user_code=False,
    )
    if errors:
        details = "; ".join(f"{path}: {msg}" for path, msg in errors)
        raise ValueError(f"invalid parallelism: {details}")
    shape = resolve_mesh(spec, mesh.size())
    if tuple(mesh.shape) != (shape.data, shape.pipeline, shape.tensor):
        raise ValueError(
            f"mesh shape {tuple(mesh.shape)} does not match the spec's "
            f"{(shape.data, shape.pipeline, shape.tensor)}; build it with build_mesh(spec)"
        )
    if plan is None:
        plan = plan_for(model)
    return _STRATEGIES[spec.strategy](model, mesh, spec, optimizer_factory, loss_fn, plan)
