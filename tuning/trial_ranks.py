"""A search trial whose workers fit one node, run as local ranks: the trial's Tune
trainable forks them itself (``trainers.ranks``, the path single jobs take) instead of
starting a Ray Train controller actor and one worker actor per rank.

The trainable holds the workers' CPUs with its own (one Tune resource request), and the
search keeps its actors between trials and exploits (Tune's ``reuse_actors``): the
trainable's process, with torch, Ray Train and the loop imported, and its forkserver are
paid for once per actor; each start of a trial (its first, and each PBT exploit, which
restarts it from its donor's checkpoint) forks fresh ranks from there.

What Tune needs from a reused function trainable, it gets: when Tune resets the actor
(another trial, an exploit) or stops the trial, its session's stop flag is set, and the
runner, which looks at it between the ranks' messages, kills the ranks' process groups
and returns within a poll. A trial's ranks die with it on every path: a stop (that flag),
a failure (the runner kills the other ranks), a cancel of the search (the Ray job's
actors die, the forkserver with its parent, the ranks by ``PR_SET_PDEATHSIG``).

Rank 0 waits for the runner's word after each report, which the runner gives once Tune
took the report: the loop never runs more than a report ahead of Tune's decisions, as
the Train path's one-report queue keeps it.
"""

from __future__ import annotations

import functools
import sys
import uuid
from typing import Any, Callable

import ray
from ray import tune
from ray.train import CheckpointConfig

from api.local_ranks import cold_reason
from api.schemas import TuneSpec, WorkerGroupEvent, WorkerNode
from trainers import events, phases, ray_compat
from trainers.callbacks import run_seq
from trainers.failures import TrialFailed
from trainers.launch import EventsChannel
from trainers.loops import builtin_loop_name
from trainers.ranks import RankRunner, RanksFailed
from trainers.user_loop import refusing_tune_calls
from trainers.zygote.client import warm_starts_off
from trainers.zygote.hosted import host_context
from tuning.reports import TrialReports


def trial_cpus(spec: TuneSpec) -> float:
    """What a warm trial's trainable holds: its own CPUs and every worker's."""
    s = spec.base.scaling
    return spec.driver_cpus_per_trial + s.num_workers * s.cpus_per_worker


def largest_node_cpus() -> float:
    """The most CPUs one live node of the cluster has (the driver is connected)."""
    return max((n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")), default=0.0)


def warm_reason(spec: TuneSpec, node_cpus: float) -> str | None:
    """Why the trials of ``spec`` start cold (a Ray Train run each, as before); None when
    they start warm as local ranks. ``node_cpus``: the largest node's CPUs."""
    if not sys.platform.startswith("linux"):
        return "local ranks are forked, which needs Linux"
    if spec.trainable == "function" and spec.base.scaling.use_gpu:
        return "a GPU function trial runs in its Tune trainable's process (a forked one is not yet measured on GPUs)"
    if spec.trainable == "function" and warm_starts_off():  # the server's setting, in the job's environment
        return (
            "warm starts are off (RAYDOCK_WARM_START): the function runs in its Tune trainable's process, a Ray worker"
        )
    if spec.trainable == "function" and not spec.base.scaling.local_ranks:
        return "the search sets base.scaling.local_ranks false: the function runs in its Tune trainable, a Ray worker"
    if spec.trainable == "function":
        return None  # its one process, forked: the trainable holds what the cold one would
    if spec.base.scaling.use_gpu:
        return "GPU trials keep Ray Train's worker actors (the trainable would hold every GPU of the trial)"
    why = cold_reason(spec.base)
    if why is not None:
        return why
    need = trial_cpus(spec)
    if need > node_cpus:
        return f"a trial's {need:g} CPUs (its driver and workers) fit no node of the cluster (the largest has {node_cpus:g})"
    return None


class TrialRanks(RankRunner):
    """The rank runner of one start of a trial: reports go to ``forward`` (Tune), worker
    groups name the trial, and a stop of the trainable ends the ranks. The trainable runs
    it in Tune's thread beside Ray's own, so its ranks come from a forkserver (one per
    trainable, kept with it): a fork of a process with other threads may hang."""

    forks_from_here = False
    loops_by_name = True

    def __init__(
        self,
        spec,
        run_name: str,
        storage_path: str,
        trial_id: str,
        start: Any,
        channel: EventsChannel | None,
        forward: Callable[[dict, Any], None],
    ) -> None:
        super().__init__(spec, run_name, storage_path)
        # Tune copies each reported checkpoint into the trial; the run keeps every one
        # until then, as the Train path's run does.
        self.book = ray_compat.checkpoint_book(self.storage, CheckpointConfig(num_to_keep=None))
        loop = self.loop
        self.loop = functools.partial(refusing_tune_calls, loop)
        self.loop.__module__ = _loop_module(spec)  # what the rank host or forkserver imports for the ranks
        self.start_checkpoint, self.trial_id, self.acks = start, trial_id, True
        self.should_stop = ray_compat.tune_stopping
        self.channel, self.forward = channel, forward

    def _events(self) -> Any:
        return _RetryLines()

    def _context(self):
        """The node's warm process forks the ranks (its rank host for this trainable, which
        has torch and Ray Train imported already); a forkserver of this process when it cannot."""
        modules = [getattr(self.loop, "__module__", "trainers")]
        hosted = host_context(modules, ray_compat.session_dir(), ray.get_runtime_context().gcs_address)
        return hosted if hosted is not None else super()._context()

    def _report(self, metrics: dict, checkpoint_name: str | None) -> None:
        checkpoint = None
        if checkpoint_name is not None:
            checkpoint = ray_compat.checkpoint_at(self.storage, checkpoint_name)
            self.book.register(checkpoint, metrics)
        self.forward(metrics, checkpoint)

    def _group_event(self, n: int, pids: list[int]) -> None:
        print(f"raydock: trial {self.trial_id} runs {n} local rank(s), pids {pids}", file=sys.stderr, flush=True)
        if self.channel is None:
            return
        node = WorkerNode(ip=ray.util.get_node_ip_address(), node_id=ray.get_runtime_context().get_node_id())
        seq = run_seq(self.run_name, self.groups)
        events.emit(
            WorkerGroupEvent(type="worker_group", seq=seq, world_size=n, nodes=[node] * n, trial_id=self.trial_id),
            self.channel,
        )
        self.groups += 1


def _loop_module(spec) -> str:
    """A built-in loop's module (handed on by name), imported once for the ranks."""
    return "trainers" if spec.is_user_code else builtin_loop_name(spec).split(":")[0]


class _RetryLines:
    """A retried start of a trial's ranks: a line in the trial's log (a trial has no job events)."""

    def after_exception(self, run_context, worker_exceptions: dict) -> None:
        for rank, exc in worker_exceptions.items():
            print(f"raydock: local rank {rank} failed ({exc}); starting the ranks again", file=sys.stderr, flush=True)


def run_warm_trial(
    config: dict[str, Any], *, spec: dict[str, Any], storage_path: str, population=None, channel=None
) -> None:
    """The trainable of a warm trial: ``config`` holds this trial's values (dotted path ->
    value). This module imports neither torch nor the loop: the trainable's process (a
    new Ray worker per trainable) only hands the loop to ranks forked elsewhere."""
    search = TuneSpec.model_validate(spec)
    trial_spec = search.trial_spec(config)
    trial_id = tune.get_context().get_trial_id()
    # A fresh run name per start: a run of the same name resumes from its own last
    # checkpoint, but a clone must start from its donor's.
    run_name = f"{trial_id}-{uuid.uuid4().hex[:6]}"
    start = tune.get_checkpoint()
    reports = TrialReports(search, trial_id, start, population, ray_compat.tune_stopping)
    return run_warm(TrialRanks(trial_spec, run_name, storage_path, trial_id, start, channel, reports.forward))


def run_warm(runner: TrialRanks) -> None:
    """Run one start of the trial as local ranks until its loop ends, it fails (raised
    as ``TrialFailed``), or Tune stops it (``SystemExit``, as Tune's own stop does)."""
    phases.for_trial(runner.trial_id)
    if runner.channel is not None:
        phases.bind(runner.channel)
    try:
        runner.fit()
    except RanksFailed as exc:
        why = exc.failure
        raise TrialFailed(why.cause.value, why.message, why.traceback) from None
