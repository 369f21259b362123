"""One local rank of a job that ``trainers.ranks`` runs on its driver's node.

A rank is a process forked from the job's driver (which has imported torch, Ray Train
and the loop already). It takes torchrun's environment (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; not a search's
forked Tune function, ``RankPlan.torchrun``) and runs the job's loop under Ray Train's
local mode (``trainers.ray_compat.run_local_mode``): the
loop keeps the Ray Train API (``ray.train.report``, ``get_checkpoint``, ``get_context``,
``ray.train.torch.prepare_model`` / ``prepare_data_loader``), and a report does here what
a Train worker and its controller do:

- every rank persists the checkpoint it was handed (if any) under the run's storage
  directory, into one directory whose name rank 0 picks (Ray Train's layout: the
  ranks' files merge there), through the report's ``checkpoint_upload_fn`` if it has
  one, and in a thread of its own under ``checkpoint_upload_mode=ASYNC`` (in order,
  one at a time; the loop goes on, as in a Train worker);
- the ranks wait for each other (a report is a barrier);
- rank 0 sends its metrics and the checkpoint's name to the driver, which keeps the
  checkpoint book and sends the events.

A rank that raises sends its exception to the driver and exits 1. It is in a process
group of its own (the driver kills the group, and with it anything the rank started)
and dies with the driver (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch
import torch.distributed as dist

from trainers import phases, ray_compat
from trainers.rank_plan import RankPlan

# What a Ray core call in a rank says (trainers.ray_compat.refuse_ray_calls).
NOT_A_RAY_WORKER = (
    "Ray's core API (ray.put, ray.get, tasks, actors, Ray Data) cannot be called here: this process is a "
    "local rank raydock forked, no Ray worker, and Ray would make it the driver of a Ray job of its own that "
    "nobody tracks. A job whose code calls Ray sets scaling.local_ranks: false (a search: "
    "base.scaling.local_ranks): its workers are then Ray workers."
)

PR_SET_PDEATHSIG = 1


class Rank:
    """What ``ray.train.report`` and ``get_checkpoint`` do in a local rank."""

    def __init__(self, plan: RankPlan, rank: int, link) -> None:
        self.plan, self.rank, self.link = plan, rank, link
        self.checkpoint = plan.checkpoint
        self._storage = None
        # Reports in Ray Train's ASYNC mode: one upload thread, in order, over a gloo
        # group of their own (the loop's collectives go on meanwhile).
        self.uploads: ThreadPoolExecutor | None = None
        self.upload_group: Any = None
        self.pending: list[Future] = []

    @property
    def storage(self):
        if self._storage is None:
            self._storage = ray_compat.storage_context(self.plan.storage_path, self.plan.run_name)
        return self._storage

    def barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def broadcast(self, data: Any) -> Any:
        if not dist.is_initialized():
            return data
        box = [data]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def report(
        self,
        metrics: dict,
        checkpoint: Any,
        dir_name: str | None,
        upload_fn: Callable[[Any, str], Any] | None = None,
        background: bool = False,
    ) -> None:
        phases.mark("first_step")  # unless the loop marked it at its first step
        while self.pending and self.pending[0].done():  # a failed upload fails the loop now, as in Ray Train
            self.pending.pop(0).result()
        name = self.broadcast(dir_name or ray_compat.checkpoint_dir_name())
        while self.plan.acks and len(self.pending) > 1:  # never more than a report ahead of the runner
            self.pending.pop(0).result()
        if background:
            if self.uploads is None:  # a collective, in the loop's thread, at every rank's first
                self.uploads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raydock-upload")
                self.upload_group = dist.new_group(backend="gloo") if dist.is_initialized() else None
            self.pending.append(self.uploads.submit(self._persist, metrics, checkpoint, name, upload_fn, True))
            return
        self.flush()  # a report in the loop's thread comes after those still uploading
        self._persist(metrics, checkpoint, name, upload_fn, False)

    def flush(self) -> None:
        """Wait for the reports still uploading; raise the first one's failure."""
        while self.pending:
            self.pending.pop(0).result()

    def _persist(self, metrics: dict, checkpoint: Any, name: str, upload_fn, background: bool) -> None:
        """Upload (as Ray Train's worker does, or through ``upload_fn``), wait for the
        other ranks, and on rank 0 tell the driver; in the upload thread when ``background``."""
        persisted = None
        if checkpoint is not None:
            persisted = (
                upload_fn(checkpoint, name) if upload_fn else self.storage.persist_current_checkpoint(checkpoint, name)
            )
        held = [persisted is not None]
        if dist.is_initialized():  # the barrier: every rank's files are in place before rank 0 says so
            held = [None] * dist.get_world_size()
            dist.all_gather_object(held, persisted is not None, group=self.upload_group if background else None)
        if any(held):
            self.checkpoint = persisted or ray_compat.checkpoint_at(self.storage, name)
        if self.rank == 0:
            self.link.send(("report", dict(metrics), name if any(held) else None))
            if self.plan.acks:  # the runner's word: go on, maybe from the checkpoint it now holds for the run
                answer = self.link.recv()
                if len(answer) > 1 and answer[1] is not None:
                    self.checkpoint = answer[1]


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the driver's stop still kills the group
        pass
    if os.getppid() == 1:  # the driver died before the line above
        os._exit(1)


def run_rank(plan: RankPlan, rank: int, link) -> None:
    """The rank's process: set up, run the loop, exit (never returns)."""
    os.setpgid(0, 0)
    _die_with_parent()
    ray_compat.refuse_ray_calls(NOT_A_RAY_WORKER)
    if plan.trial_id:
        phases.for_trial(plan.trial_id)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a stop kills a rank at once; the driver reports
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if plan.torchrun:
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(plan.world_size),
            LOCAL_WORLD_SIZE=str(plan.world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(plan.master_port),
        )
    threads = max(1, int(plan.cpus_per_rank))  # what a Train worker with these CPUs gets
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    code = 0
    try:
        me = Rank(plan, rank, link)
        ray_compat.use_local_storage(lambda: me.storage)
        ray_compat.run_local_mode(plan.run_name, _loop_of(plan), me)
        me.flush()  # the last checkpoint is uploaded and told before the rank is done
        link.send(("done",))
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the driver, then exit 1
        code = 1
        _send_failure(link, exc)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _loop_of(plan: RankPlan) -> Callable[[], Any]:
    def loop() -> Any:
        phases.mark("process_group_ready")  # the local controller has just initialised it
        return plan.loop(plan.loop_config)

    return loop


def _send_failure(link, exc: BaseException) -> None:
    text = "".join(traceback.format_exception(exc))
    try:
        link.send(("error", exc, text))
    except Exception:  # noqa: BLE001 - an exception that does not pickle travels as its text
        link.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}"), text))
