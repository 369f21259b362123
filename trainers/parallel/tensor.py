"""Tensor parallelism: each attention and MLP layer split across the tensor axis.

Megatron-style pairing, applied with ``torch.distributed.tensor.parallel``:

- ``attn.q``, ``attn.k``, ``attn.v`` and ``mlp.fc`` are ``ColwiseParallel``: each worker
  computes its own output columns, i.e. its own heads / its own slice of the hidden
  layer, from the full (replicated) input;
- ``attn.proj`` and ``mlp.proj`` are ``RowwiseParallel``: each worker multiplies its
  slice and one all-reduce sums the partial results back into the replicated residual
  stream.

So each block costs two all-reduces of activations forward and two backward, and
holds 1/T of its weights. Embeddings, layer norms and the head stay replicated (they
are small next to the blocks at this scale, and a replicated head keeps the loss a
plain cross-entropy).

With a data axis (``tensor_degree`` < workers, or a hybrid mesh), replicas average
their gradients with one flat all-reduce after backward; ``bytes_communicated``
counts that. Workers of one tensor group must get the same batch and, when dropout is
on, the same RNG state, or the replicated activations drift apart.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from api.schemas import ParallelismSpec
from trainers.parallel.base import (
    LossFn,
    OptimizerFactory,
    ParallelModel,
    allreduce_mean,
    broadcast_from_data_rank0,
    local_grads,
    mesh_device,
)


def gpt_tensor_plan(model: nn.Module) -> dict[str, ColwiseParallel | RowwiseParallel]:
    """The sharding plan for ``trainers.gpt.GPT``'s blocks, by parameter-path."""
    plan: dict[str, ColwiseParallel | RowwiseParallel] = {}
    for name in model.blocks.keys():
        prefix = f"blocks.{name}"
        for proj in ("q", "k", "v"):
            plan[f"{prefix}.attn.{proj}"] = ColwiseParallel()
        plan[f"{prefix}.attn.proj"] = RowwiseParallel()
        plan[f"{prefix}.mlp.fc"] = ColwiseParallel()
        plan[f"{prefix}.mlp.proj"] = RowwiseParallel()
    return plan


class TensorParallelModel(ParallelModel):
    strategy = "tensor"

    def __init__(
        self,
        model: nn.Module,
        mesh: DeviceMesh,
        spec: ParallelismSpec,
        optimizer_factory: OptimizerFactory,
        loss_fn: LossFn,
    ):
        model.to(mesh_device(mesh))
        broadcast_from_data_rank0(model, mesh)
        # Shards are cut from tensor-rank 0's weights, so the tensor group agrees too.
        parallelize_module(model, mesh["tensor"], gpt_tensor_plan(model))
        super().__init__(model, mesh, spec, optimizer_factory, loss_fn)

    def _reduce_grads(self) -> None:
        if self.data_world_size > 1:
            grads = local_grads(self.module.parameters())
            self.comm.bytes += allreduce_mean(grads, self.data_group)
