"""Tensor parallelism: layers split across the tensor axis by the model's plan.

The plan (``ModelPlan.tensor``, kept with the model: the GPT's is
``trainers.models.gpt.parallelize``) says which linears are ``ColwiseParallel`` (each
worker computes its own output columns from the full, replicated input) and which
``RowwiseParallel`` (each worker multiplies its slice and one all-reduce sums the
partial results back); ``torch.distributed.tensor.parallel`` applies it. For the GPT
each block then costs two all-reduces of activations forward and two backward, and
holds 1/T of its weights; what the plan leaves out stays replicated.

With a data axis (``tensor_degree`` < workers, or a hybrid mesh), replicas average
their gradients with one flat all-reduce after backward; ``bytes_communicated``
counts that. Workers of one tensor group must get the same batch and, when dropout is
on, the same RNG state, or the replicated activations drift apart.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor.parallel import parallelize_module

from trainers.parallel.base import ParallelModel
from trainers.parallel.plan import missing_plan


class TensorParallelModel(ParallelModel):
    strategy = "tensor"

    def _place(self, model: nn.Module) -> nn.Module:
        if self.plan.tensor is None:
            raise missing_plan(model, "tensor")
        model = super()._place(model)
        # Shards are cut from tensor-rank 0's weights, so the tensor group agrees too.
        parallelize_module(model, self.mesh["tensor"], self.plan.tensor(model))
        return model
