"""The one seam between raydock and Ray Train's internals (``ray.train.v2._internal``).

Two things raydock needs have no public API in Ray 2.60: a hook when a worker group
starts, and a way to hand a run its starting checkpoint (Train V2 dropped
``resume_from_checkpoint``). Everything else imports Ray's public surface only; when a
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


def seed_checkpoint(checkpoint: Any) -> None:
    """Make ``ray.train.get_checkpoint()`` in this Train worker return ``checkpoint``
    until the run has one of its own. A retried worker group gets the run's own latest
    checkpoint in its context, which this leaves alone."""
    from ray.train.v2._internal.execution.context import get_train_context

    ctx = get_train_context()
    with ctx.report_order_condition:
        if ctx.checkpoint is None:
            ctx.checkpoint = checkpoint


def reread_import_time_settings() -> None:
    """Ray settings read once when ``ray`` is imported, read again from this process's
    environment: a driver forked from a warm process imported ``ray`` under another
    environment (its job's ``RAY_DEDUP_LOGS=0`` must still hold)."""
    import ray._private.ray_constants as constants
    import ray._private.ray_logging as ray_logging

    dedup = constants.env_bool("RAY_DEDUP_LOGS", True)
    constants.RAY_DEDUP_LOGS = dedup
    ray_logging.RAY_DEDUP_LOGS = dedup
