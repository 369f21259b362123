"""Worker counts on the cluster side: the ``ScalingConfig`` of a job (fixed or elastic)
and a ``worker_group`` event each time Ray Train starts a worker group.

An elastic job (``scaling.num_workers: {min, max}``) runs as
``ScalingConfig(num_workers=(min, max))``: Ray Train starts it with what fits, re-checks
every ``scaling.resize_check_interval_s`` and restarts the worker group at a new size,
so the loops resume from ``ray.train.get_checkpoint()``. Every start (the first, a
resize, a restart after a lost node) is sent to the server as
``{"type": "worker_group", "seq", "world_size", "nodes": [{"ip", "node_id"}, ...]}``,
one entry per rank, which is how the worker count over time reaches the job's record.
"""

from __future__ import annotations

from typing import Any

from ray.train import FailureConfig, ScalingConfig

from api.schemas import TrainSpec
from trainers import events

try:
    # The worker-group hooks are Ray Train's internal callback interface; RunConfig
    # passes callbacks that are not UserCallbacks through to the controller as they are.
    from ray.train.v2._internal.execution.callback import WorkerGroupCallback
except ImportError:  # a Ray without it: jobs run, only the worker_group events are missing
    WorkerGroupCallback = None


def scaling_config(spec: TrainSpec) -> ScalingConfig:
    s = spec.scaling
    extra: dict[str, Any] = {}
    if s.is_elastic:
        extra["elastic_resize_monitor_interval_s"] = s.resize_check_interval_s
    return ScalingConfig(
        num_workers=(s.min_workers, s.max_workers) if s.is_elastic else s.num_workers,
        use_gpu=s.use_gpu,
        resources_per_worker={"CPU": s.cpus_per_worker, **({"GPU": 1} if s.use_gpu else {})},
        **extra,
    )


def failure_config(spec: TrainSpec) -> FailureConfig:
    # A bounded controller failure limit: resources that never appear end the job
    # instead of retrying worker-group start-up forever. An elastic job gets as many
    # start-up retries as worker retries: right after a node is lost, Ray may still list
    # it as alive, so the restarted group is sized for it and its start times out; the
    # next try sees the cluster as it is.
    limit = spec.failure.max_retries if spec.scaling.is_elastic else 0
    return FailureConfig(max_failures=spec.failure.max_retries, controller_failure_limit=limit)


def worker_group_callbacks() -> list:
    return [WorkerGroupEvents()] if WorkerGroupCallback is not None else []


if WorkerGroupCallback is not None:

    class WorkerGroupEvents(WorkerGroupCallback):
        """Runs in the Train controller: one event per worker group start, in rank order."""

        def __init__(self) -> None:
            self.seq = 0

        def after_worker_group_start(self, worker_group) -> None:
            nodes = []
            for worker in worker_group.get_workers():
                meta = worker.metadata
                nodes.append({"ip": meta.node_ip, "node_id": meta.node_id})
            events.emit({"type": "worker_group", "seq": self.seq, "world_size": len(nodes), "nodes": nodes})
            self.seq += 1
