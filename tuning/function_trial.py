"""The trainables of a search whose base is a Ray Tune function trainable (``trainable:
function``): the user's function, called with the trial's ``config`` (base.config with the
searched values put in). It reports with ``tune.report`` and restores with
``tune.get_checkpoint()`` itself; its errors read as its own.

Warm (``run_function_trial`` given the trials' run storage, where a trial fits a node):
the function runs in a local rank forked by the trainable's rank host, a child of the
node's warm process with torch imported already (``tuning.trial_ranks``), in a Tune
session of its own (``trainers.ray_compat.serve_tune_session``): each ``tune.report`` goes
to the trainable, which hands it to Tune's own ``tune.report`` (Tune persists the
checkpoint then, the one copy, before the function may delete it) and answers once Tune
took it, so the function never runs more than a report ahead of Tune's decisions, as in
Tune's own function trainable; ``tune.get_checkpoint()`` is the trial's start (a PBT
clone's: its donor's), then its latest report's, where Tune persisted it;
``tune.get_context()`` answers with the trainable's trial. The process has no torch
process group, whatever the base's ``num_workers``, as in Tune's own trainable. A stop or
reset of the trial kills it, as a warm Train-loop trial's ranks are killed.

Cold (without it): the function runs in the trainable's own thread, as Tune runs one.
This module imports neither torch nor Ray Train's trainers: a trial's process imports
ray.tune and, cold, the user's function, nothing more."""

from __future__ import annotations

import functools
import inspect
import sys
import uuid
from numbers import Number
from typing import Any

from ray import tune

from api.schemas import TuneSpec
from trainers import ray_compat
from trainers.failures import TrialFailed, classify
from trainers.user_loop import load_entrypoint
from tuning.reports import tune_checkpoint
from tuning.trial_ranks import TrialRanks, run_warm

# A forked function's checkpoint, on its way to the trainable with its report's metrics.
CHECKPOINT_KEY = "__raydock_function_checkpoint__"


def run_function_trial(
    config: dict[str, Any], *, spec: dict[str, Any], storage_path: str | None = None, channel: Any = None
) -> Any:
    """The trainable, warm or cold under one name (Tune keeps a trial's trainable name and
    restores a search only with the same one, so a search resumes whichever way its trials
    start now): forked where ``storage_path`` (the trials' runs) is given, else in this
    process, in Tune's own session."""
    if storage_path is not None:
        return _run_forked(config, spec, storage_path, channel)
    trial_spec = TuneSpec.model_validate(spec).trial_spec(config)
    fn = load_entrypoint(trial_spec.entrypoint)
    try:
        return fn(dict(trial_spec.config)) if inspect.signature(fn).parameters else fn()
    except Exception as exc:  # noqa: BLE001 - classified, as a Train loop's failure is
        why = classify(exc)
        raise TrialFailed(why.cause.value, why.message, why.traceback) from None


def _run_forked(config: dict[str, Any], spec: dict[str, Any], storage_path: str, channel: Any) -> None:
    """One start of the trial (its first, or a restart after a PBT exploit) as one local
    rank running the function, until it returns, fails (raised as ``TrialFailed``) or Tune
    stops it."""
    trial_spec = TuneSpec.model_validate(spec).trial_spec(config)
    trial_id = tune.get_context().get_trial_id()
    run_name = f"{trial_id}-{uuid.uuid4().hex[:6]}"  # a run per start, as a warm trial's (Tune keeps the checkpoints)
    runner = FunctionRank(trial_spec, run_name, storage_path, trial_id, tune.get_checkpoint(), channel)
    run_warm(runner)


def _to_tune(metrics: dict, checkpoint: Any) -> None:
    tune.report(metrics, checkpoint=tune_checkpoint(checkpoint))


class FunctionRank(TrialRanks):
    """The rank runner of one start of a function trial: one rank (whatever the base's
    ``num_workers``: a function trial is one process), the function its loop, its reports
    straight to Tune. A failure is the trial's, as in Tune's own function trainable (no
    ``failure.max_retries``), and the trial has no worker group."""

    def __init__(self, spec, run_name: str, storage_path: str, trial_id: str, start: Any, channel: Any) -> None:
        one = {
            "scaling": spec.scaling.model_copy(update={"num_workers": 1}),
            "failure": spec.failure.model_copy(update={"max_retries": 0}),
        }
        spec = spec.model_copy(update=one)
        super().__init__(spec, run_name, storage_path, trial_id, start, channel, _to_tune)
        self.loop = functools.partial(run_forked_function, spec.entrypoint, ray_compat.tune_session_fields())
        self.loop.__module__ = __name__  # what the rank host imports for the rank: this module, not the function's
        self.loop_config = dict(spec.config)
        self.torchrun = False  # no process group: the function may make its own, as in Tune

    def _report(self, metrics: dict, checkpoint_name: str | None) -> None:
        """Tune's own report: it persists the function's checkpoint into the trial's
        directory (the one copy) before the rank hears to go on."""
        self.forward(metrics, metrics.pop(CHECKPOINT_KEY, None))

    def _resume_from(self) -> Any:
        return tune.get_checkpoint()  # the trial's latest, where Tune persisted it

    def _group_event(self, n: int, pids: list[int]) -> None:
        print(
            f"raydock: trial {self.trial_id} runs its function in forked process {pids[0]}", file=sys.stderr, flush=True
        )


def run_forked_function(entrypoint: str, fields: dict[str, Any], config: dict[str, Any]) -> None:
    """The rank's loop: the function in a Tune session of this process; what it returns
    is its last report, as Tune's function trainable takes it."""
    ray_compat.serve_tune_session(fields, _report, _checkpoint)
    fn = load_entrypoint(entrypoint)
    output = fn(config) if inspect.signature(fn).parameters else fn()
    if not output:
        return
    if isinstance(output, dict):
        _report(output, None)
    elif isinstance(output, Number):
        from ray.tune.result import DEFAULT_METRIC

        _report({DEFAULT_METRIC: output}, None)
    else:
        raise ValueError("the function returned a value that is neither a number nor a dict of metrics")


def _report(metrics: dict, checkpoint: Any) -> None:
    """The local rank's report, its checkpoint handed on where the function left it (the
    trainable's ``tune.report`` persists it), its answer once Tune took it."""
    metrics = dict(metrics)
    if checkpoint is not None:
        metrics[CHECKPOINT_KEY] = checkpoint
    ray_compat.rank_report(metrics, None)


def _checkpoint() -> Any:
    return tune_checkpoint(ray_compat.rank_checkpoint())
