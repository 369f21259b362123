"""The Ray job driver of a hyperparameter search: ``python -m tuning.search_driver``.

The server submits this module for a ``kind: tune`` job (a training job has its own,
``python -m trainers.driver``). It runs the Tuner (``tuning.search``) in this process:
Tune's controller, the PBT/ASHA decisions and the event stream to the server all live
here; each trial runs its workers as local ranks its trainable forks (when they fit one
node, ``tuning.trial_ranks``) or as its own distributed ``TorchTrainer`` (``tuning.trial``).

Stopping the Ray job (cancel, preemption, deadline: Ray sends SIGTERM) ends Tune's run as
Ctrl+C would: Tune saves the search's state one last time, each trial's latest checkpoint
in it, so a resumed search goes on from where its trials were (not from Tune's last
periodic save), stops its trials, and this process exits as stopped (``STOPPED``); Ray
kills what is left after the job's stop wait. The trials' trainables are its actors,
their Train controllers and workers are the trainables' actors, and their local ranks
die with the trainables' processes, so all of them and their placement groups go with it.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any

import ray

from api import object_store
from api.schemas import CheckpointEvent, FailureCause, StartedEvent, TuneSpec, jsonable
from trainers import events, phases
from trainers.failures import TRACEBACK_TAIL_CHARS, Failure, classify, report_failure
from trainers.launch import EventsChannel, take_launch
from trainers.zygote import pool
from tuning.search import build_tuner, trial_runs_path
from tuning.search_events import SearchEvents, reported
from tuning.stall import SearchStalled
from tuning.trial import restores_from_checkpoint

NO_RESTORE_NOTE = (
    "PBT exploits cannot carry weights for this loop: {entrypoint} never calls ray.train.get_checkpoint(), "
    "so a trial that clones another starts the loop over with the donor's hyperparameters only. "
    "Restore the model (and optimizer) from ray.train.get_checkpoint() at the loop's start to continue from the donor."
)

# Tune waits this long (its default 2 s) for a trainable's function to return when it keeps
# the trainable's process for another trial or the trial's restart: a function trainable's
# returns at its next report, a warm Train-loop trial's once its ranks are reaped (longer on
# a loaded node). Tune reads it in the trainable's process, which gets the Ray job's
# environment, not this process's: it goes into the job's runtime_env at ray.init, unless
# the job's own env_vars set it (Ray refuses a key set twice).
TRAINABLE_ENV = {"TUNE_FUNCTION_THREAD_TIMEOUT_S": "30"}

STALLED_DETAIL = (
    "{}. Every trial left was PAUSED or PENDING while the cluster had room for one, so Tune would never have "
    "started another and the search would have held its resources for ever; it was stopped. The trials' "
    "statuses and reports are on the search; stall_timeout_s (default RAYDOCK_SEARCH_STALL_S) sets how long "
    "a search may wait so."
)


STOPPED = 128 + signal.SIGTERM  # the exit status of a search its Ray job's stop ended


def _stop(out: SearchEvents, signum: int, frame: Any) -> None:
    """SIGTERM: ask Tune to end its run (its own interrupt, the SIGUSR1 handler Tune
    installs as its run starts), which saves the search's state first; before that, exit
    at once. The trials Tune then stops are the stopped job's (``out.stop``)."""
    out.stop()
    interrupt = signal.getsignal(signal.SIGUSR1)
    if not callable(interrupt):
        raise SystemExit(STOPPED)
    interrupt(signum, frame)


def main() -> int:
    # Tune saves the search's state at most this often (default every 10 s or more): a
    # search whose driver dies outright (SIGKILL, its node lost) resumes from its trials'
    # checkpoints as of the last save; a stop of its Ray job saves it once more (``_stop``).
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "3")
    pool.start_if_asked()  # a cold start: this node's next job starts warm
    launch = take_launch()
    phases.bind(launch.channel)
    phases.mark("driver_started", phases.process_started_at())
    spec = TuneSpec.model_validate(launch.spec)
    events.emit(StartedEvent(type="started", seq=0))
    return run_search(spec, launch.job_id, launch.storage_path, launch.channel, launch.trial_ranks)


def run_search(
    spec: TuneSpec, job_id: str, storage_path: str, channel: EventsChannel | None = None, trial_ranks: bool = False
) -> int:
    out = SearchEvents(spec.metric, spec.mode, key=job_id)
    out.first_report_timeout_s = spec.first_report_timeout_s
    if spec.algorithm in ("pbt", "pb2") and not restores_from_checkpoint(spec.base):
        out.note = NO_RESTORE_NOTE.format(entrypoint=spec.base.entrypoint)
        print(out.note, file=sys.stderr, flush=True)
    try:
        ray.init(address="auto", log_to_driver=True, runtime_env=trainables_runtime_env(os.environ))
        if threading.current_thread() is threading.main_thread():  # after ray.init: its own handler dies at once
            signal.signal(signal.SIGTERM, functools.partial(_stop, out))
        results = build_tuner(spec, job_id, storage_path, out, channel, trial_ranks).fit()
        if out.stopped:  # Tune saved the search and stopped its trials: nothing more is done
            raise SystemExit(STOPPED)
    except (KeyboardInterrupt, SystemExit):
        raise  # a stop (cancel, deadline): the server already knows why
    except SearchStalled as stalled:  # Tune stopped every trial; the job fails saying why
        return report_failure(Failure(FailureCause.INFRASTRUCTURE, str(stalled), STALLED_DETAIL.format(stalled)))
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then exit 1
        return report_failure(classify(exc))
    _drop_trial_runs(storage_path, job_id)
    for result in results:  # a resumed search: trials that finished in an earlier attempt
        if result.metrics and result.metrics.get("trial_id"):
            out.consider(
                result.metrics["trial_id"],
                events.sendable_metrics(reported(result.metrics)),
                jsonable(result.config or {}),
            )
    if out.best is None:
        errors = [r.error for r in results if r.error is not None]
        if not errors and not out.failures:
            return report_failure(
                Failure(
                    FailureCause.USER_CODE,
                    f"no trial of the search reported {spec.metric!r}",
                    f"{len(results)} trials ended without reporting the metric {spec.metric!r}; report it, or change `metric`.",
                )
            )
        # The first trial's own error leads: the job's error reads like a training job's.
        first = next(iter(out.failures.values()), None) or classify(errors[0])
        return report_failure(
            Failure(
                first.cause,
                first.message,
                f"every trial of the search failed ({max(len(errors), len(out.failures))} of {len(results)}); the first one's error:\n\n{first.traceback}"[
                    :TRACEBACK_TAIL_CHARS
                ],
            )
        )
    best = out.best
    checkpoint = _best_checkpoint(results, best["trial_id"], spec)
    summary = events.sendable_metrics({**best["metrics"], "trial_id": best["trial_id"]})
    if checkpoint is not None:
        path = object_store.uri_of(checkpoint.filesystem, checkpoint.path)
        events.emit(CheckpointEvent(type="checkpoint", seq=0, path=path, metrics=summary))
    out.best_trial(object_store.uri_of(checkpoint.filesystem, checkpoint.path) if checkpoint else None)
    events.flush()
    return 0


def trainables_runtime_env(environ: Mapping[str, str]) -> dict | None:
    """What this driver adds to its Ray job's runtime_env: ``TRAINABLE_ENV`` but for what
    the job's own env_vars, which are in this driver's environment ``environ``, set."""
    own = {k: v for k, v in TRAINABLE_ENV.items() if k not in environ}
    return {"env_vars": own} if own else None


def _best_checkpoint(results, trial_id: str, spec: TuneSpec) -> Any:
    for result in results:
        if (result.metrics or {}).get("trial_id") == trial_id:
            if not result.best_checkpoints:
                return None  # a user loop that never checkpoints
            return result.get_best_checkpoint(spec.metric, spec.mode) or result.checkpoint
    return None


def _drop_trial_runs(storage_path: str, job_id: str) -> None:
    """The trials' own Train runs: Tune copied every checkpoint they reported into the
    trial directories, so once the search ended these only double its storage."""
    try:
        fs, root = object_store.filesystem(trial_runs_path(storage_path, job_id))
        fs.delete_dir(root)
    except (OSError, ValueError):
        pass  # nothing there, or storage we cannot delete from: job deletion removes it


if __name__ == "__main__":
    sys.exit(main())
