"""The Ray job driver of one raydock training job: ``python -m trainers.driver``.

The server submits this module through the Ray Jobs API, with the job spec in the
``RAYDOCK_JOB_SPEC`` environment variable. It builds a ``TorchTrainer`` for the spec,
forwards every ``ray.train.report`` to the server as an event (see ``trainers.events``),
and on failure says why: the user's error with their traceback tail, no resources, or
an infrastructure fault. Because it runs on the cluster, a job outlives the API process.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from typing import Any, Callable

import ray
import ray.train
from ray.train import CheckpointConfig, RunConfig, UserCallback
from ray.train.torch import TorchTrainer

from api.schemas import FailureCause, GPTModel, TabularData, TrainSpec, parse_job_spec
from trainers import elastic, events

TRACEBACK_TAIL_CHARS = 4000


class EventCallback(UserCallback):
    """Runs in the Train controller after every report: forwards rank 0's metrics and
    the checkpoint (if any) to the server, numbered so the server stores each once."""

    def __init__(self) -> None:
        self.seq = 0
        self.failures = 0

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        m = dict(metrics[0]) if metrics else {}
        events.emit({"type": "metric", "seq": self.seq, "metrics": m})
        if checkpoint is not None:
            events.emit({"type": "checkpoint", "seq": self.seq, "path": checkpoint.path, "metrics": m})
        self.seq += 1

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        rank, exc = next(iter(sorted(worker_exceptions.items())), (None, None))
        reason = f"worker rank {rank}: {type(exc).__name__}: {exc}".splitlines()[0][:500]
        events.emit({"type": "worker_failure", "seq": self.failures, "reason": reason})
        self.failures += 1


def load_entrypoint(entrypoint: str) -> Callable[[dict], None]:
    module_name, fn_name = entrypoint.split(":")
    module = importlib.import_module(module_name)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise AttributeError(f"entrypoint {entrypoint!r}: module {module_name!r} has no function {fn_name!r}")
    return fn


def tabular_datasets(spec: TrainSpec) -> tuple[dict, dict]:
    """Read a user table with Ray Data and split it; returns datasets and column facts."""
    d: TabularData = spec.data
    reader = ray.data.read_csv if d.source == "csv" else ray.data.read_parquet
    ds = reader(d.path)
    columns = ds.columns()
    if d.label_column not in columns:
        raise ValueError(f"data.label_column {d.label_column!r} is not a column of {d.path}; columns: {columns}")
    features = d.feature_columns or [c for c in columns if c != d.label_column]
    missing = [c for c in features if c not in columns]
    if missing:
        raise ValueError(f"data.feature_columns {missing} are not columns of {d.path}; columns: {columns}")
    num_classes = d.num_classes or int(max(ds.unique(d.label_column))) + 1
    train, val = ds.train_test_split(test_size=d.val_fraction, shuffle=True, seed=spec.seed)
    return {"train": train, "val": val}, {"feature_columns": features, "num_classes": num_classes}


def builtin_loop(spec: TrainSpec) -> Callable[[dict], None]:
    """The per-worker loop for a built-in model and its parallelism."""
    if isinstance(spec.model, GPTModel):
        from trainers.lm_loop import train_loop

        return train_loop
    if not spec.default_parallelism:
        from trainers.classifier_loop import train_loop

        return train_loop
    # The default (plain DDP, fp32) keeps Ray's prepare_model path and its checkpoint format.
    from trainers.loop import train_loop

    return train_loop


def build_trainer(spec: TrainSpec, job_id: str, storage_path: str) -> TorchTrainer:
    datasets, data_meta = ({}, {})
    if isinstance(spec.data, TabularData):
        datasets, data_meta = tabular_datasets(spec)
    if spec.is_user_code:
        loop, loop_config = load_entrypoint(spec.entrypoint), dict(spec.config)
        if not spec.default_parallelism:
            # User code applies the strategy itself (e.g. with trainers.parallel.parallelize).
            loop_config["parallelism"] = spec.model_dump(mode="json")["parallelism"]
    else:
        loop, loop_config = builtin_loop(spec), {"spec": spec.model_dump(mode="json"), "data_meta": data_meta}
    return TorchTrainer(
        loop,
        train_loop_config=loop_config,
        datasets=datasets or None,
        scaling_config=elastic.scaling_config(spec),  # fixed, or (min, max) for an elastic job
        run_config=RunConfig(
            name=job_id,
            storage_path=storage_path,
            callbacks=[EventCallback(), *elastic.worker_group_callbacks()],
            checkpoint_config=CheckpointConfig(
                num_to_keep=spec.checkpoint.keep,
                checkpoint_score_attribute=spec.checkpoint.score_metric,
                checkpoint_score_order=spec.checkpoint.score_mode,
            ),
            failure_config=elastic.failure_config(spec),
        ),
    )


def classify(exc: BaseException) -> tuple[FailureCause, str, str]:
    """Map a failed fit to (cause, message, traceback tail)."""
    from ray.train import ControllerError, WorkerGroupError

    if isinstance(exc, WorkerGroupError):
        errors = list(getattr(exc, "worker_failures", {}).values())
        root = errors[0] if errors else exc
        # Ray formats the workers' tracebacks into the error message; the exception
        # objects arrive unpickled without their frames.
        tb = getattr(exc, "_error_message", "") or "".join(traceback.format_exception(root))
        return FailureCause.USER_CODE, f"{type(root).__name__}: {root}".splitlines()[0], tb[-TRACEBACK_TAIL_CHARS:]
    text = "".join(traceback.format_exception(exc))
    if isinstance(exc, ControllerError) and "start" in str(exc).lower() and "timed out" in text.lower():
        return FailureCause.NO_RESOURCES, (
            "the cluster could not start the worker group in time: not enough free resources "
            "(lower scaling.num_workers / cpus_per_worker or add nodes)"
        ), text[-TRACEBACK_TAIL_CHARS:]
    if isinstance(exc, (ImportError, AttributeError, ValueError)):
        return FailureCause.USER_CODE, f"{type(exc).__name__}: {exc}", text[-TRACEBACK_TAIL_CHARS:]
    return FailureCause.INFRASTRUCTURE, f"{type(exc).__name__}: {exc}", text[-TRACEBACK_TAIL_CHARS:]


def main() -> int:
    job_id = os.environ["RAYDOCK_JOB_ID"]
    storage_path = os.environ["RAYDOCK_STORAGE_PATH"]
    spec = parse_job_spec(json.loads(os.environ["RAYDOCK_JOB_SPEC"]))
    events.emit({"type": "started", "seq": 0, "pid": os.getpid()})
    if spec.kind == "tune":  # a hyperparameter search: one TorchTrainer per trial (tuning/driver.py)
        from tuning.driver import run_search
        return run_search(spec, job_id, storage_path)
    try:
        ray.init(address="auto", log_to_driver=True)
        result = build_trainer(spec, job_id, storage_path).fit()
    except (KeyboardInterrupt, SystemExit):
        raise  # a stop (cancel, deadline): the server already knows why
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then re-raised as exit 1
        cause, message, tb = classify(exc)
        events.emit({"type": "error", "seq": 0, "cause": cause.value, "message": message, "traceback": tb})
        events.flush()
        print(tb, file=sys.stderr, flush=True)
        return 1
    final = result.metrics or {}
    events.emit({"type": "result", "seq": 0, "metrics": final, "path": result.path})
    events.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
