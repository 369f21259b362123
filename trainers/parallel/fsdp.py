"""Fully sharded data parallelism (FSDP2, ``torch.distributed.fsdp.fully_shard``).

Each worker keeps 1/N of every parameter, its gradient and its optimizer state (as
DTensors sharded on dim 0 over the data axis). Before a block runs, its parameters
are all-gathered; after backward its gradients are reduce-scattered so each worker
gets the averaged gradient of its own shard. Works on gloo (CPU) and NCCL.

Each transformer block is its own FSDP unit, so only one block's full parameters
exist at a time during forward and backward; the root unit holds the embeddings,
final norm and head. A model without a ``blocks`` container (e.g. from a job's own
code) becomes a single unit: still sharded at rest, gathered whole for compute.

Gradient accumulation turns gradient synchronisation off for all but the last slice
(gradients then accumulate unsharded, trading memory for fewer reduce-scatters).
``bytes_communicated`` counts the reduce-scatter input per synchronisation, i.e. the
fp32 gradient bytes of the whole model; FSDP2 issues the collectives itself, so this
is computed from the parameter sizes rather than observed.

Precision bf16 runs the forward under autocast over fp32 parameters, as every other
strategy does, rather than FSDP's own mixed-precision policy (which would also
all-gather in bf16 and halve that traffic: a later optimisation).

Checkpoints: ``ParallelModel.state_dict`` is sharded (each worker writes its shard with
``trainers.checkpoint``); ``full_model_state_dict`` gathers
plain weights onto rank 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn
from torch.distributed.fsdp import fully_shard

from trainers.parallel.base import ParallelModel


class FSDPModel(ParallelModel):
    strategy = "fsdp"
    syncs_in_backward = True

    def _place(self, model: nn.Module) -> nn.Module:
        # Each worker keeps its own slice of the tensor it built, so all must start from
        # the same full weights (fully_shard itself does not broadcast): super() does that.
        model = super()._place(model)
        data_mesh = self.mesh["data"]
        blocks = getattr(model, "blocks", None)
        if isinstance(blocks, (nn.ModuleDict, nn.ModuleList)):
            for block in blocks.values() if isinstance(blocks, nn.ModuleDict) else blocks:
                fully_shard(block, mesh=data_mesh)
        fully_shard(model, mesh=data_mesh)
        self._grad_bytes = sum(p.numel() * 4 for p in model.parameters())
        return model

    @contextlib.contextmanager
    def _grad_sync(self, enabled: bool) -> Iterator[None]:
        self.module.set_requires_gradient_sync(enabled)
        yield
        if enabled and self.data_world_size > 1:
            self.comm.bytes += self._grad_bytes
