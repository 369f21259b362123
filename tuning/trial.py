"""One trial of a search: a Tune function trainable that runs the trial's workers, as
local ranks it forks when they fit one node (``tuning.trial_ranks``: a warm start), else
as a distributed ``TorchTrainer`` (Ray Train V2 no longer runs under a ``Tuner`` directly).
The rest of this docstring is the ``TorchTrainer`` path; the local ranks keep its
contract (each report and its checkpoint to Tune, the start from ``tune.get_checkpoint()``).

Each Train report travels controller -> trainable -> Tune: a ``UserCallback`` in the
trial's Train controller puts the report and its checkpoint on a small Ray queue, and
the trainable hands them to ``ray.tune.report``, which persists the checkpoint as a real
Tune checkpoint (PBT clones trials from those). A restarted trial (PBT exploit, pause
and resume) gets ``tune.get_checkpoint()``; every Train worker then sees it through
``ray.train.get_checkpoint()``, so a loop that resumes from there, built-in or the
user's own, continues from the cloned weights unchanged.
"""

from __future__ import annotations

import inspect
import threading
import uuid
from typing import Any, Callable

import ray.train
from ray import tune
from ray.train import CheckpointConfig, RunConfig, UserCallback
from ray.train.torch import TorchTrainer
from ray.util.queue import Empty, Queue

from api.schemas import TrainSpec, TuneSpec
from trainers import callbacks as run_callbacks
from trainers import phases
from trainers.failures import TrialFailed, classify
from trainers.launch import EventsChannel
from trainers.ray_compat import TrainContextCallback, WorkerGroupCallback, seed_checkpoint
from trainers.trainer import build_trainer, load_entrypoint
from trainers.user_loop import refusing_tune_calls
from tuning.reports import TrialReports

POLL_S = 0.2


class ForwardReports(UserCallback):
    """Runs in the trial's Train controller: hands rank 0's metrics and the checkpoint
    of every report to the trainable. The queue holds one report, so training never
    runs more than a report ahead of what Tune has decided about the trial."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        self.queue.put((dict(metrics[0]) if metrics else {}, checkpoint))


def start_from(loop: Callable, checkpoint: ray.train.Checkpoint | None, trial_id: str, config: dict) -> Any:
    """A Train worker's entry: make ``ray.train.get_checkpoint()`` return the trial's
    starting checkpoint until the run has one of its own, then run ``loop``."""
    phases.for_trial(trial_id)
    if checkpoint is not None:
        # Train V2 dropped `resume_from_checkpoint`; a retried worker group gets the
        # run's own latest checkpoint, which this leaves alone.
        seed_checkpoint(checkpoint)
    takes_config = len(inspect.signature(loop).parameters) > 0
    return refusing_tune_calls(loop, config) if takes_config else refusing_tune_calls(loop)


def trial_trainer(
    spec: TrainSpec,
    run_name: str,
    storage_path: str,
    queue: Queue,
    start: ray.train.Checkpoint | None,
    trial_id: str = "",
    channel: EventsChannel | None = None,
) -> TorchTrainer:
    """The job's own trainer for ``spec`` (``trainers.trainer.build_trainer``), with the
    trial's report forwarding, its starting checkpoint and every checkpoint kept; with
    the search's events ``channel``, its worker groups and first step go to the server."""
    job_trainer = build_trainer(spec, run_name, storage_path)
    callbacks: list = [ForwardReports(queue)]
    if channel is not None:
        if WorkerGroupCallback is not None:
            callbacks.append(run_callbacks.WorkerGroupEvents(channel, trial_id, run_name))
        if TrainContextCallback is not None:
            callbacks.append(run_callbacks.FirstReport())
    return TorchTrainer(
        _partial(start_from, job_trainer.train_loop_per_worker, start, trial_id),
        train_loop_config=job_trainer.train_loop_config,
        datasets=job_trainer.datasets or None,
        dataset_config=job_trainer.data_config,
        scaling_config=job_trainer.scaling_config,
        run_config=RunConfig(
            name=run_name,
            storage_path=storage_path,
            callbacks=callbacks,
            # Tune copies each reported checkpoint; one dropped here before the copy
            # would lose it, so the run keeps all (a trial's run is short-lived).
            checkpoint_config=CheckpointConfig(num_to_keep=None),
            failure_config=job_trainer.run_config.failure_config,
        ),
    )


def restores_from_checkpoint(spec: TrainSpec) -> bool:
    """Whether the loop resumes from ``ray.train.get_checkpoint()``: the built-in ones
    do; for user code, whether its module asks for one (when its source can be read)."""
    if not spec.is_user_code:
        return True
    try:
        source = inspect.getsource(inspect.getmodule(load_entrypoint(spec.entrypoint)))
    except Exception:  # noqa: BLE001 - unreadable or failing to import: the trials will say why
        return True  # unknown: claim nothing
    return "get_checkpoint" in source


def _partial(fn: Callable, loop: Callable, checkpoint, trial_id: str) -> Callable[[dict], Any]:
    def train_loop_per_worker(config: dict) -> Any:
        return fn(loop, checkpoint, trial_id, config)

    return train_loop_per_worker


def run_trial(
    config: dict[str, Any],
    *,
    spec: dict[str, Any],
    storage_path: str,
    population=None,
    channel: EventsChannel | None = None,
) -> None:
    """The trainable of a cold trial: ``config`` holds this trial's values (dotted path ->
    value); its workers are a Ray Train run's (a warm trial's trainable is
    ``tuning.trial_ranks.run_warm_trial``)."""
    search = TuneSpec.model_validate(spec)
    trial_spec = search.trial_spec(config)
    trial_id = tune.get_context().get_trial_id()
    # A fresh run name per start: a Train run of the same name resumes from its own
    # last checkpoint, but a clone must start from its donor's.
    run_name = f"{trial_id}-{uuid.uuid4().hex[:6]}"
    start = tune.get_checkpoint()
    reports = TrialReports(search, trial_id, start, population)
    queue: Queue = Queue(maxsize=1, actor_options={"num_cpus": 0})
    trainer = trial_trainer(trial_spec, run_name, storage_path, queue, start, trial_id, channel)
    failure: list[BaseException] = []
    done = threading.Event()

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the trainable's thread below
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=fit, name="trial-fit", daemon=True).start()
    while True:
        try:
            metrics, checkpoint = queue.get(timeout=POLL_S)
        except Empty:
            if done.is_set() and queue.empty():
                break
            continue
        reports.forward(metrics, checkpoint)
    if failure:
        why = classify(failure[0])
        raise TrialFailed(why.cause.value, why.message, why.traceback) from None
