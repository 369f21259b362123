"""Hybrid parallelism: a data axis combined with one model axis on a 2-D mesh.

The mesh is ``data x pipeline x tensor`` with at most one of the model axes larger
than 1 (see ``api.schemas.validate_parallelism``):

- ``data x pipeline``: every data replica is a full pipeline; after each step every
  stage averages its gradients with the same stage of the other replicas;
- ``data x tensor``: every data replica is a tensor group; after each step every
  worker averages its shards' gradients with the workers holding the same shards.

Workers are laid out row-major, so the workers of one tensor group or one pipeline
have consecutive ranks (on one node, when nodes hold consecutive ranks). The model
axis strategies already handle a data axis; this module only picks between them.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from api.schemas import ParallelismSpec
from trainers.parallel.base import LossFn, OptimizerFactory, ParallelModel
from trainers.parallel.ddp import DDPModel
from trainers.parallel.pipeline import PipelineParallelModel
from trainers.parallel.plan import ModelPlan
from trainers.parallel.tensor import TensorParallelModel


def parallelize_hybrid(
    model: nn.Module,
    mesh: DeviceMesh,
    spec: ParallelismSpec,
    optimizer_factory: OptimizerFactory,
    loss_fn: LossFn,
    plan: ModelPlan | None = None,
) -> ParallelModel:
    if mesh["pipeline"].size() > 1 and mesh["tensor"].size() > 1:
        raise ValueError(
            "pipeline and tensor parallelism together are not supported; set "
            "parallelism.mesh.pipeline or parallelism.mesh.tensor to 1"
        )
    if mesh["pipeline"].size() > 1:
        cls = PipelineParallelModel
    elif mesh["tensor"].size() > 1:
        cls = TensorParallelModel
    else:
        # A mesh with only a data axis is plain data parallelism.
        cls = DDPModel
    pm = cls(model, mesh, spec, optimizer_factory, loss_fn, plan)
    pm.strategy = "hybrid"
    return pm
