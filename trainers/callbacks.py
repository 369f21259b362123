"""The Train controller callbacks that turn a run into events for the server.

- ``ReportEvents``: every ``ray.train.report`` (rank 0's metrics, and its checkpoint)
  and every worker failure that Ray Train retries;
- ``WorkerGroupEvents``: every worker group start (the first, an elastic resize, a
  restart after a lost node), one node per rank, which is how the worker count over
  time reaches the job's record; and the start-up phases ``workers_placed`` (the worker
  actors are up) and ``process_group_ready`` (Ray Train's torch backend, an earlier
  callback of the same hook, has initialised the process group on every rank);
- ``FirstReport``: in each Train worker, the ``first_step`` phase at rank 0's first
  report, for a loop that did not mark it itself (user code; the built-in loops mark it
  after their first optimizer step).

The first two run in the controller process, numbered per kind so the server stores
each once. They are made in the driver and carry its events channel there (the launch
file is deleted once the driver has read it).
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

from ray.train import UserCallback

from api import object_store
from api.schemas import CheckpointEvent, MetricEvent, WorkerFailureEvent, WorkerGroupEvent, WorkerNode
from trainers import events, phases
from trainers.launch import EventsChannel, read_launch
from trainers.ray_compat import TrainContextCallback, WorkerGroupCallback


class ReportEvents(UserCallback):
    """Forwards rank 0's metrics and the checkpoint (if any) of every report."""

    def __init__(self) -> None:
        self.seq = 0
        self.failures = 0
        self.channel = read_launch().channel  # made in the driver, which deleted the launch file

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        m = events.sendable_metrics(metrics[0] if metrics else {})
        events.emit(MetricEvent(type="metric", seq=self.seq, metrics=m), self.channel)
        if checkpoint is not None:
            # On an object store Ray names the checkpoint by its path there (bucket/key): the URI says which store.
            path = object_store.uri_of(checkpoint.filesystem, checkpoint.path)
            events.emit(CheckpointEvent(type="checkpoint", seq=self.seq, path=path, metrics=m), self.channel)
        self.seq += 1

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        rank, exc = next(iter(sorted(worker_exceptions.items())), (None, None))
        reason = f"worker rank {rank}: {type(exc).__name__}: {exc}".splitlines()[0][:500]
        events.emit(WorkerFailureEvent(type="worker_failure", seq=self.failures, reason=reason), self.channel)
        self.failures += 1


def run_callbacks() -> list:
    """The callbacks of a job's own run (a search trial's run forwards reports to Tune instead)."""
    return [
        ReportEvents(),
        *([WorkerGroupEvents()] if WorkerGroupCallback is not None else []),
        *([FirstReport()] if TrainContextCallback is not None else []),
    ]


if WorkerGroupCallback is not None:

    class WorkerGroupEvents(WorkerGroupCallback):
        """One event per worker group start, its nodes in rank order. A search trial's
        run names its trial, and numbers its events from its run name: the trials'
        controllers share the search's sequence of worker groups and never meet."""

        def __init__(self, channel: EventsChannel | None = None, trial_id: str | None = None, run: str = "") -> None:
            self.seq = 0
            self.channel = channel or read_launch().channel
            self.trial_id, self.run = trial_id, run

        def before_init_train_context(self, workers) -> dict:
            phases.bind(self.channel)
            phases.mark("workers_placed")  # the actors answered: up and importing done
            return {}

        def after_worker_group_start(self, worker_group) -> None:
            phases.bind(self.channel)
            phases.mark("process_group_ready")
            metas = [worker.metadata for worker in worker_group.get_workers()]
            nodes = [WorkerNode(ip=meta.node_ip, node_id=meta.node_id) for meta in metas]
            seq = self.seq if self.trial_id is None else run_seq(self.run, self.seq)
            event = WorkerGroupEvent(
                type="worker_group", seq=seq, world_size=len(nodes), nodes=nodes, trial_id=self.trial_id
            )
            events.emit(event, self.channel)
            self.seq += 1


def run_seq(run: str, n: int) -> int:
    """The ``n``-th event of the trial run ``run`` as a number of its own: 48 bits of a hash
    (below the contract's bound; two of a thousand runs share one with odds of about 1e-8)."""
    return int.from_bytes(hashlib.blake2b(f"{run}/{n}".encode(), digest_size=6).digest(), "big")


if TrainContextCallback is not None:

    class FirstReport(TrainContextCallback):
        """``first_step`` when rank 0 first reports, unless the loop marked it before."""

        @contextlib.contextmanager
        def on_report(self):
            phases.mark("first_step")
            yield
