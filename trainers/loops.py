"""Which loop a job's workers run and with what, chosen without importing it: a built-in
loop's module (torch, the models) is imported where the loop runs, so a process that
only hands the loop on (a search trial's trainable, whose local ranks run it) stays
light."""

from __future__ import annotations

import functools
from typing import Any, Callable

import ray.train
from ray.train import CheckpointConfig

from api.schemas import GPTModel, TrainSpec
from trainers.user_loop import load_entrypoint, user_loop


def builtin_loop_name(spec: TrainSpec) -> str:
    """The entrypoint of the built-in loop for ``spec``'s model, whatever its parallelism."""
    if isinstance(spec.model, GPTModel):
        return "trainers.lm_loop:train_loop"
    return "trainers.classifier_loop:train_loop"  # mlp and cnn: one loop, one checkpoint format


def builtin_loop(spec: TrainSpec) -> Callable[[dict], None]:
    """The per-worker loop for a built-in model and its parallelism."""
    return load_entrypoint(builtin_loop_name(spec))


def run_builtin_loop(entrypoint: str, config: dict) -> Any:
    return load_entrypoint(entrypoint)(config)


def checkpoint_config(spec: TrainSpec) -> CheckpointConfig:
    return CheckpointConfig(
        num_to_keep=spec.checkpoint.keep,
        checkpoint_score_attribute=spec.checkpoint.score_metric,
        checkpoint_score_order=spec.checkpoint.score_mode,
    )


def loop_and_config(
    spec: TrainSpec, data_meta: dict | None = None, by_name: bool = False
) -> tuple[Callable[[dict], Any], dict]:
    """The per-worker loop and its config: the user's entrypoint (imported in the
    workers only, trainers/user_loop.py: the driver runs none of the user's code) or a
    built-in loop (``by_name``: imported where it runs too)."""
    if spec.is_user_code:
        loop_config = dict(spec.config)
        if not spec.default_parallelism:
            # User code applies the strategy itself (e.g. with trainers.parallel.parallelize).
            loop_config["parallelism"] = spec.model_dump(mode="json")["parallelism"]
        return user_loop(spec.entrypoint), loop_config
    loop = functools.partial(run_builtin_loop, builtin_loop_name(spec)) if by_name else builtin_loop(spec)
    return loop, {"spec": spec.model_dump(mode="json"), "data_meta": data_meta or {}}


def starting_checkpoint(uri: str | None) -> ray.train.Checkpoint | None:
    """The checkpoint at ``uri`` (a path or an object store URI); None for none."""
    return ray.train.Checkpoint(uri) if uri else None
