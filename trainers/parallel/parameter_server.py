"""Parameter-server training (not implemented yet).

TODO: servers are Ray actors that each own a partition of the parameters; workers
pull weights, compute gradients and push them, synchronously (servers wait for every
worker) or asynchronously (bounded by ``parallelism.parameter_server.staleness``).
That needs Ray actors and so lives outside this torch-only package's process group
model; until then ``api.parallelism.validate_parallelism`` refuses the strategy at
submit time and this entry point says so if reached anyway.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from api.parallelism import ParallelismSpec
from trainers.parallel.base import LossFn, OptimizerFactory, ParallelModel


def parallelize_parameter_server(
    model: nn.Module,
    mesh: DeviceMesh,
    spec: ParallelismSpec,
    optimizer_factory: OptimizerFactory,
    loss_fn: LossFn,
) -> ParallelModel:
    raise NotImplementedError(
        "strategy parameter_server is not available yet; use ddp, or fsdp for a model "
        "too large to replicate"
    )
