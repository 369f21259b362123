"""Sharded checkpoints of a ParallelModel with ``torch.distributed.checkpoint`` (DCP).

Every worker writes only what it holds (an FSDP shard, a tensor-parallel slice, a
pipeline stage; data replicas of the same tensor are written once) into one directory,
plus one metadata file. Loading reads back into the same layout. The saved names are
the plain model's parameter names and DCP reshards on load, so a checkpoint can also
move to another strategy or worker count with the same model and optimizer; the tests
cover ddp into fsdp.

Both functions are collectives over all workers and take the same ``path`` on each.
Workers on different nodes may write to local directories that are merged afterwards
(as Ray Train does with each worker's reported checkpoint directory): file names are
unique per worker.
"""

from __future__ import annotations

import os

import torch.distributed.checkpoint as dcp

from trainers.parallel.base import ParallelModel


def save_checkpoint(pm: ParallelModel, path: str | os.PathLike) -> None:
    """Write model, optimizer and step of every worker under ``path``."""
    dcp.save(pm.state_dict(), checkpoint_id=os.fspath(path))


def load_checkpoint(pm: ParallelModel, path: str | os.PathLike) -> None:
    """Restore ``pm`` in place from ``save_checkpoint``'s directory."""
    # DCP loads into the tensors of a state dict of the right layout, so ask the model
    # for one (this also materialises the optimizer's state to receive the values).
    sd = pm.state_dict()
    dcp.load(sd, checkpoint_id=os.fspath(path))
    pm.load_state_dict(sd)
