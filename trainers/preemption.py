"""The training loop's side of preemption: whether this attempt is asked to give its
room back, so the loop writes a checkpoint now rather than at its next epoch end.

Two signals, checked together at the same steps on every worker (``Watch.check``):
raydock's marker file (``RAYDOCK_PREEMPT_URI``, written by the server when it preempts a
borrowed job: service/scheduling/preemption.py) and Ray Train's own, ``ray.train.get_preemption_info()``
(a node of the run is being drained, e.g. a spot reclaim). Either one makes the loop
checkpoint once; it then trains on until the server stops it (or it finishes first).
"""

from __future__ import annotations

import os
from typing import Protocol

import torch
import torch.distributed as dist

from api import object_store
from api.cluster_contract import PREEMPT_URI_ENV

CHECK_EVERY_S = 1.0  # how often the workers agree whether a preemption was asked


class Clock(Protocol):
    def due(self, step: int) -> bool: ...

    def restart(self, step: int) -> None: ...


def marker_exists(uri: str) -> bool:
    if "://" not in uri or uri.startswith("file://"):
        return os.path.exists(uri.removeprefix("file://"))
    import pyarrow.fs as pafs

    fs, path = object_store.filesystem(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def ray_preempting() -> bool:
    """Ray Train's own preemption signal (a barrier: every worker calls it at the same steps)."""
    import ray.train

    get = getattr(ray.train, "get_preemption_info", None)
    if get is None:  # a Ray without the preemption API
        return False
    try:
        return get() is not None
    except (RuntimeError, DeprecationWarning):  # outside a Train worker (a loop run by hand, a Tune session)
        return False


class Watch:
    """Tells the loop, identically on every worker, the step at which to checkpoint for a preemption."""

    def __init__(self, clock: Clock, device: torch.device, uri: str | None = None):
        self.clock, self.device = clock, device
        self.uri = uri if uri is not None else os.environ.get(PREEMPT_URI_ENV)
        self.asked = False  # answered with a checkpoint already: no more checks

    def check(self, step: int) -> bool:
        """True once: at the first agreed check after a preemption was asked."""
        if self.asked or not self.clock.due(step):
            return False
        self.clock.restart(step)
        seen = bool(self.uri) and marker_exists(self.uri)
        flag = torch.tensor([1.0 if seen else 0.0], device=self.device)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # one worker seeing it is enough
        asked = flag.item() > 0 or ray_preempting()
        self.asked = asked
        return asked
