"""The single-node rank runner: a job's workers as processes forked from its driver.

A job the server found fit (``api.local_ranks``, ``service.scheduling.rank_plan``: fixed size, no
Ray Data, a torch.distributed strategy, every worker on one node) has its driver hold
all the workers' resources as its Ray job's entrypoint resources, and runs them itself:
it forks N ranks (``trainers.rank_worker``) once it has imported torch, Ray Train and the
loop, each with torchrun's environment running the loop under Ray Train's local mode.
That skips the Train controller actor and N worker actors, each a new Python importing
torch and Ray Train (seconds apiece on a small node).

What the controller does, the driver does here:

- rank 0's reports become the same events (``trainers.callbacks.ReportEvents``), and
  each checkpoint goes into Ray Train's checkpoint book of the run (retention by
  ``checkpoint.keep`` / ``score_metric``, the run's snapshot, so a resumed or retried
  attempt gets the latest from ``ray.train.get_checkpoint()``, on either path);
- a rank that raises or dies ends the start: the others are killed; up to
  ``failure.max_retries`` times the ranks are forked again from the latest checkpoint
  (a ``worker_failure`` event each), then the failure is the job's, reported as a worker
  failure of the Train path is (the rank's exception and traceback, user code);
- a stop (SIGINT from Ray's job stop, SIGTERM) kills every rank's process group.

Forking needs a single-threaded parent: the first start forks before the driver starts
any thread; a later one (a retry, once the events thread and Ray's run) starts the
ranks from a forkserver instead, which imports torch again (seconds, once).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

import ray

from api.schemas import FailureCause, TrainSpec, WorkerGroupEvent, WorkerNode
from trainers import events, phases, ray_compat
from trainers.callbacks import ReportEvents
from trainers.failures import TRACEBACK_TAIL_CHARS, Failure, headline, readable
from trainers.loops import checkpoint_config, loop_and_config, starting_checkpoint
from trainers.rank_plan import RankPlan

POLL_S = 0.2  # how often a runner with a stop check looks at it


class RankDied(Exception):
    """A rank that ended without saying why (killed, out of memory)."""


class RanksFailed(Exception):
    """The ranks failed more often than ``failure.max_retries`` allows."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@dataclass(frozen=True)
class Outcome:
    """A finished start of the ranks: None ``error`` when every rank returned."""

    rank: int | None = None
    error: BaseException | None = None
    text: str = ""


@dataclass(frozen=True)
class RunResult:
    metrics: dict[str, Any]  # the latest checkpoint's metrics, as Ray Train's Result has them
    path: str


def preload(spec: TrainSpec) -> None:
    """Import here, once, what every rank would import on its own before its first step:
    a first optimizer imports torch._dynamo (seconds), Ray Train's API checks import Ray
    Tune, the built-in tables scikit-learn."""
    import ray.tune  # noqa: F401
    import torch._dynamo  # noqa: F401

    import trainers.rank_worker  # noqa: F401

    if not spec.is_user_code:
        import sklearn.datasets  # noqa: F401


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankRunner:
    """Runs one attempt of ``spec`` as local ranks; ``fit()`` as ``TorchTrainer.fit``."""

    # Whether the ranks may be forked from this process (so it imports their modules
    # first); a runner that always starts them from a forkserver imports nothing for them.
    forks_from_here = True
    # Whether a built-in loop is handed to the ranks by name (this process never imports it).
    loops_by_name = False

    def __init__(self, spec: TrainSpec, run_name: str, storage_path: str, start: str | None = None) -> None:
        self.spec, self.run_name, self.storage_path = spec, run_name, storage_path
        self.storage = ray_compat.storage_context(storage_path, run_name)
        self.book = ray_compat.checkpoint_book(self.storage, checkpoint_config(spec))
        self.loop, self.loop_config = loop_and_config(spec, by_name=self.loops_by_name)
        if self.forks_from_here:
            preload(spec)
        self.report_events: ReportEvents | None = None  # made once the ranks run: it may start a thread
        self.groups = 0
        self.after_start = None  # called once the first ranks are forked (the driver's set-up that starts threads)
        # The checkpoint the run starts from until it has one of its own: a job's init_from,
        # or a search trial's (tuning.trial_ranks), which also sets its id, report-by-report
        # acks, and a check, between messages, of whether to stop.
        self.start_checkpoint = starting_checkpoint(start)
        self.trial_id = ""
        self.acks = False
        self.should_stop = None
        self.torchrun = True  # the ranks' process group (a Tune function has none)

    def fit(self) -> RunResult:
        failures = 0
        while (outcome := self._start()).error is not None:
            if failures >= self.spec.failure.max_retries:
                raise RanksFailed(self._failure(outcome))
            failures += 1
            self._events().after_exception(None, {outcome.rank: outcome.error})
        latest = self.book.latest_checkpoint_result
        return RunResult(metrics=dict(latest.metrics) if latest else {}, path=self.storage.experiment_fs_path)

    def _events(self) -> ReportEvents:
        if self.report_events is None:
            self.report_events = ReportEvents()
        return self.report_events

    def _failure(self, outcome: Outcome) -> Failure:
        text = readable(outcome.text or f"{type(outcome.error).__name__}: {outcome.error}")
        return Failure(FailureCause.USER_CODE, headline(outcome.error), text[:TRACEBACK_TAIL_CHARS])

    # ------------------------------------------------------------------ one start

    def _start(self) -> Outcome:
        n = self.spec.scaling.num_workers
        plan = RankPlan(
            run_name=self.run_name,
            storage_path=self.storage_path,
            world_size=n,
            master_port=free_port(),
            loop=self.loop,
            loop_config=self.loop_config,
            checkpoint=self.book.latest or self.start_checkpoint,
            cpus_per_rank=self.spec.scaling.cpus_per_worker,
            trial_id=self.trial_id,
            acks=self.acks,
            torchrun=self.torchrun,
        )
        ctx = self._context()
        links, procs = [], []
        # A driver's stop unwinds through here; a trial's runner (not the main thread) is stopped by Tune.
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _exit_on_term) if main else None
        try:
            for rank in range(n):
                recv, send = ctx.Pipe(duplex=self.acks)
                proc = ctx.Process(target=run_rank, args=(plan, rank, send), name=f"raydock-rank-{rank}")
                proc.start()
                send.close()
                links.append(recv)
                procs.append(proc)
            phases.mark("workers_placed")
            if self.after_start is not None:
                self.after_start()
                self.after_start = None
            self._group_event(n, [proc.pid for proc in procs])
            return self._watch(links, procs)
        finally:
            for proc in procs:
                _kill_group(proc)
            for proc in procs:
                proc.join(timeout=10)
            if main:
                signal.signal(signal.SIGTERM, previous)

    def _context(self):
        if threading.active_count() == 1:
            return mp.get_context("fork")
        ctx = mp.get_context("forkserver")
        # What preload() imported here, imported once in the forkserver rather than in each rank.
        # The driver's module too: each child imports it again as its __main__.
        modules = ["torch", "torch._dynamo", "ray.tune", "trainers.rank_worker", "trainers.driver"]
        if not self.spec.is_user_code:  # the built-in tables: seconds for each rank to import on its own
            modules.append("sklearn.datasets")
        ctx.set_forkserver_preload([*modules, getattr(self.loop, "__module__", "trainers")])
        return ctx

    def _group_event(self, n: int, pids: list[int]) -> None:
        node = WorkerNode(ip=ray.util.get_node_ip_address(), node_id=_node_id())
        event = WorkerGroupEvent(type="worker_group", seq=self.groups, world_size=n, nodes=[node] * n)
        events.emit(event)
        self.groups += 1

    def _watch(self, links: list, procs: list) -> Outcome:
        """Take the ranks' messages until every rank has ended, or one failed."""
        open_links = dict(enumerate(links))
        running = {proc.sentinel: rank for rank, proc in enumerate(procs)}
        said_done: set[int] = set()
        while running or open_links:
            ready = wait([*open_links.values(), *running], timeout=None if self.should_stop is None else POLL_S)
            if self.should_stop is not None and self.should_stop():
                raise SystemExit(0)  # unwinds through _start, which kills the ranks
            for rank, link in list(open_links.items()):
                if link in ready and (failed := self._drain(rank, link, open_links, said_done)) is not None:
                    return failed
            for sentinel in [s for s in ready if s in running]:
                rank = running.pop(sentinel)
                if rank in open_links and (failed := self._drain(rank, open_links[rank], open_links, said_done)):
                    return failed
                procs[rank].join(timeout=10)  # its pipe closing made the sentinel ready: reap it
                code = procs[rank].exitcode
                if rank not in said_done or code != 0:
                    return Outcome(rank, RankDied(f"local rank {rank} ended with {_exit_words(code)}"))
        return Outcome()

    def _drain(self, rank: int, link, open_links: dict, said_done: set) -> Outcome | None:
        """Every message ``link`` has now; an Outcome when it says the rank failed."""
        while open_links.get(rank) is link and link.poll():
            try:
                message = link.recv()
            except (EOFError, OSError):
                del open_links[rank]
                break
            if message[0] == "report":
                self._report(message[1], message[2])
                if self.acks:
                    _tell(link, ("go", self._resume_from()))
            elif message[0] == "error":
                return Outcome(rank, message[1], message[2])
            elif message[0] == "done":
                said_done.add(rank)
        return None

    def _resume_from(self) -> Any:
        """What rank 0's ``get_checkpoint()`` answers after a report it waited for; None:
        the checkpoint its report persisted, if any."""
        return None

    def _report(self, metrics: dict, checkpoint_name: str | None) -> None:
        checkpoint = None
        if checkpoint_name is not None:
            checkpoint = ray_compat.checkpoint_at(self.storage, checkpoint_name)
            self.book.register(checkpoint, metrics)
        self._events().after_report(None, [metrics], checkpoint)


def run_rank(plan: RankPlan, rank: int, link) -> None:
    """A forked rank's entry (``trainers.rank_worker``, imported there: it imports torch)."""
    from trainers.rank_worker import run_rank as run

    run(plan, rank, link)


def _tell(link, message: tuple) -> None:
    try:
        link.send(message)
    except OSError:  # the rank is gone: its sentinel says so next
        pass


def _node_id() -> str:
    """This node's Ray id, once the driver has joined the cluster (after the first fork)."""
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


def _exit_on_term(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through RankRunner._start, which kills the ranks


def _kill_group(proc) -> None:
    if proc.pid is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the rank and whatever it started
    except (ProcessLookupError, PermissionError):
        pass


def _exit_words(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"


def uses_local_ranks(launch_resources: dict | None, spec: TrainSpec) -> bool:
    """Whether this attempt runs as local ranks: the server said so (its Ray job holds
    the workers' resources) and this driver runs on Linux with fork."""
    return bool(launch_resources) and sys.platform.startswith("linux") and not spec.scaling.is_elastic
