"""The ``TorchTrainer`` of a training job, built from its ``TrainSpec``: the loop (the
user's entrypoint or a built-in one), its datasets, the ``ScalingConfig`` (fixed, or
``(min, max)`` for an elastic job), and the ``RunConfig`` with its checkpoint and
failure policies. The job's driver (``trainers.driver``) runs it with the event
callbacks; a search trial (``tuning.trial``) runs it with its own.

An elastic job (``scaling.num_workers: {min, max}``) runs as
``ScalingConfig(num_workers=(min, max))``: Ray Train starts it with what fits, re-checks
every ``scaling.resize_check_interval_s`` and restarts the worker group at a new size,
so the loops resume from ``ray.train.get_checkpoint()``.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import ray
import ray.data
from ray.train import DataConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from api.schemas import TabularData, TrainSpec
from api.schemas.datasets import TableSource, splits
from trainers.data.sources import node_cache
from trainers.data.tables import cached_table
from trainers.loops import builtin_loop, checkpoint_config, loop_and_config, starting_checkpoint  # noqa: F401 - read here too
from trainers.user_loop import load_entrypoint  # noqa: F401 - tuning.trial reads it here


def tabular_datasets(spec: TrainSpec) -> tuple[dict, dict]:
    """Read a user table with Ray Data and split it; returns datasets and column facts."""
    d: TabularData = spec.data
    reader = ray.data.read_csv if d.source == "csv" else ray.data.read_parquet
    ds = cached_table(d.source, d.path, node_cache(d.cache))
    ds = reader(d.path) if ds is None else ds
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


READERS = {"csv": "read_csv", "parquet": "read_parquet", "json": "read_json"}


def table(src: TableSource) -> ray.data.Dataset:
    """One of ``datasets``' tables: from the node's data cache, or read lazily by Ray Data."""
    ds = cached_table(src.format, src.path, node_cache(src.cache))
    return getattr(ray.data, READERS[src.format])(src.path) if ds is None else ds


def named_datasets(spec: TrainSpec) -> tuple[dict, DataConfig]:
    """A user-code job's ``datasets``, read with Ray Data (lazily, on the cluster), each
    share split off its table by the job's seed; and which are split across workers."""
    tables = {name: table(src) for name, src in spec.datasets.items() if isinstance(src, TableSource)}
    left = {name: 1.0 for name in tables}  # the share of each table's rows it still has
    for name, origin, fraction in splits(spec.datasets):
        rest, share = tables[origin].train_test_split(test_size=fraction / left[origin], shuffle=True, seed=spec.seed)
        tables[origin], tables[name] = rest, share
        left[origin] -= fraction
    datasets = {name: tables[name] for name in spec.datasets}  # in the order given
    to_split = (
        spec.datasets_to_split if spec.datasets_to_split is not None else [n for n in ("train",) if n in datasets]
    )
    return datasets, DataConfig(datasets_to_split=to_split)


def scaling_config(spec: TrainSpec) -> ScalingConfig:
    s = spec.scaling
    extra: dict[str, Any] = {}
    if s.is_elastic:
        extra["elastic_resize_monitor_interval_s"] = s.resize_check_interval_s
    return ScalingConfig(
        num_workers=(s.min_workers, s.max_workers) if s.is_elastic else s.num_workers,
        use_gpu=s.use_gpu,
        resources_per_worker=s.worker_resources(),
        accelerator_type=s.accelerator_type,
        placement_strategy=s.placement_strategy,
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


def start_from(loop: Callable, uri: str, config: dict) -> Any:
    """A Train worker's entry for a job with ``init_from``: ``ray.train.get_checkpoint()``
    returns the checkpoint at ``uri`` until the run has one of its own (a retried worker
    group gets the run's latest), as a resumed job's would."""
    from trainers.ray_compat import seed_checkpoint

    seed_checkpoint(starting_checkpoint(uri))
    return loop(config) if len(inspect.signature(loop).parameters) > 0 else loop()


def build_trainer(
    spec: TrainSpec, run_name: str, storage_path: str, callbacks: list | None = None, start: str | None = None
) -> TorchTrainer:
    """The job's trainer; ``callbacks`` go to the Train controller (``trainers.callbacks``);
    ``start``: the checkpoint the run starts from (the job's init_from), if any."""
    datasets, data_meta, data_config = ({}, {}, None)
    if isinstance(spec.data, TabularData):
        datasets, data_meta = tabular_datasets(spec)
    elif spec.datasets:
        datasets, data_config = named_datasets(spec)
    loop, loop_config = loop_and_config(spec, data_meta)
    if start:
        loop = functools.partial(start_from, loop, start)
    return TorchTrainer(
        loop,
        train_loop_config=loop_config,
        datasets=datasets or None,
        dataset_config=data_config,
        scaling_config=scaling_config(spec),
        run_config=RunConfig(
            name=run_name,
            storage_path=storage_path,
            callbacks=list(callbacks or []),
            checkpoint_config=checkpoint_config(spec),
            failure_config=failure_config(spec),
        ),
    )
