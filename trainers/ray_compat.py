"""The one seam between raydock and Ray Train's internals (``ray.train.v2._internal``).

Three things raydock needs have no public API in Ray 2.60: hooks when a worker group
starts, a hook in each worker as it reports, and a way to hand a run its starting
checkpoint (Train V2 dropped ``resume_from_checkpoint``). Everything else imports Ray's public surface only; when a
Ray upgrade moves these, this module is the one place to change.
"""

from __future__ import annotations

from typing import Any

try:
    # Ray Train's internal controller callback interface; RunConfig passes callbacks
    # that are not UserCallbacks through to the controller as they are.
    from ray.train.v2._internal.execution.callback import WorkerGroupCallback
except ImportError:  # a Ray without it: jobs run, only the worker_group events are missing
    WorkerGroupCallback = None
try:
    # Run in every Train worker around each ``ray.train.report`` (RunConfig passes it on too).
    from ray.train.v2._internal.execution.callback import TrainContextCallback
except ImportError:  # a Ray without it: a user loop's first_step phase is missing
    TrainContextCallback = None


def seed_checkpoint(checkpoint: Any) -> None:
    """Make ``ray.train.get_checkpoint()`` in this Train worker return ``checkpoint``
    until the run has one of its own. A retried worker group gets the run's own latest
    checkpoint in its context, which this leaves alone."""
    from ray.train.v2._internal.execution.context import get_train_context

    ctx = get_train_context()
    with ctx.report_order_condition:
        if ctx.checkpoint is None:
            ctx.checkpoint = checkpoint
