"""Elastic worker counts in the job contract: ``scaling.num_workers: {min, max}``.

A job gives either a fixed count (``num_workers: 4``) or a range
(``num_workers: {min: 1, max: 4}``). A range makes it an elastic Ray Train run: it
starts with as many workers as fit (at least ``min``), grows towards ``max`` when
capacity appears and shrinks when a node is lost, restarting its worker group from the
last checkpoint each time. Admission and capacity checks count ``min``.

Batch semantics on a resize: the per-worker ``batch_size`` stays fixed, so the global
batch is ``batch_size x world_size`` and scales with the workers; each epoch is one pass
over the training data split into ``world_size`` shards, and a resized group re-shards
from the start of the epoch it resumes in. The learning rate is not rescaled.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator

from api.schemas.common import Strict

MAX_WORKERS = 4096
# Strategies whose mesh is the data axis alone, so any world size runs them. The
# others fix a tensor/pipeline shape (or a parameter-server layout) to a worker count.
ELASTIC_STRATEGIES = frozenset({"ddp", "fsdp"})
# A lost node is a worker failure to Ray Train: an elastic job that does not say how
# many it tolerates gets this many, so losing a node shrinks the job instead of failing it.
ELASTIC_DEFAULT_MAX_RETRIES = 3


class WorkerRange(Strict):
    min: int = Field(
        ge=1, le=MAX_WORKERS, description="Fewest workers the job trains with; it starts once this many fit."
    )
    max: int = Field(
        ge=1, le=MAX_WORKERS, description="Most workers; the job grows to this many when capacity appears."
    )

    @model_validator(mode="after")
    def _ordered(self) -> "WorkerRange":
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


def coerce_num_workers(value: Any) -> Any:
    """A count or a ``{min, max}`` range, checked with messages that name the field.

    Runs before pydantic's union validation, whose errors would otherwise carry the
    union member names (``num_workers.int``, ``num_workers.WorkerRange.min``).
    """
    if isinstance(value, WorkerRange):
        return value
    if isinstance(value, bool):
        raise ValueError("must be a number of workers or {min, max}, not a boolean")
    # What pydantic's lax int accepted before ranges existed: 2.0 and "2".
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int):
        if not 1 <= value <= MAX_WORKERS:
            raise ValueError(f"must be between 1 and {MAX_WORKERS} (got {value})")
        return value
    if isinstance(value, dict):
        try:
            return WorkerRange.model_validate(value)
        except ValidationError as exc:
            parts = []
            for err in exc.errors():
                where = ".".join(str(p) for p in err["loc"])
                msg = err["msg"].removeprefix("Value error, ")
                parts.append(f"{where}: {msg}" if where else msg)
            raise ValueError("; ".join(parts)) from None
    raise ValueError("must be a number of workers (e.g. 2) or a range {min: 1, max: 4}")


def elastic_problems(workers: int | WorkerRange, *, strategy: str, model_type: str | None) -> list[tuple[str, str]]:
    """``(dotted_path, message)`` problems of a worker range with the rest of the job."""
    if not isinstance(workers, WorkerRange):
        return []
    problems = []
    if strategy not in ELASTIC_STRATEGIES:
        problems.append(
            (
                "scaling.num_workers",
                f"a worker range {{min: {workers.min}, max: {workers.max}}} needs a strategy whose mesh is "
                f"data-parallel only (ddp or fsdp); strategy {strategy} fixes the mesh to one worker count. "
                "Give a fixed num_workers or use ddp/fsdp.",
            )
        )
    if model_type == "gpt":
        problems.append(
            (
                "scaling.num_workers",
                "a worker range is not available for model.type gpt: its batches are indexed by step "
                "for a fixed number of data replicas, so a resize would skip or repeat text. "
                "Give a fixed num_workers.",
            )
        )
    return problems


class ScalingSpec(Strict):
    num_workers: Annotated[int, Field(ge=1, le=4096)] | WorkerRange = Field(
        default=2,
        description=(
            "Number of Ray Train workers, or a range {min, max} for an elastic job: it starts with "
            "what fits (at least min), grows towards max as capacity appears and shrinks when a node "
            "is lost, resuming from its last checkpoint each time."
        ),
    )
    use_gpu: bool = Field(default=False, description="Give each worker one GPU and use NCCL.")
    cpus_per_worker: float = Field(default=1.0, gt=0.0, le=512, description="CPUs reserved per worker.")
    resize_check_interval_s: float = Field(
        default=60.0,
        ge=1.0,
        le=86_400,
        description="Elastic jobs only: how often a running job checks whether it can grow (each resize restarts its workers).",
    )

    @field_validator("num_workers", mode="before")
    @classmethod
    def _count_or_range(cls, v: Any) -> Any:
        return coerce_num_workers(v)

    @property
    def is_elastic(self) -> bool:
        return isinstance(self.num_workers, WorkerRange)

    @property
    def min_workers(self) -> int:
        """What admission and capacity checks count: an elastic job starts with this many."""
        return self.num_workers.min if self.is_elastic else self.num_workers

    @property
    def max_workers(self) -> int:
        return self.num_workers.max if self.is_elastic else self.num_workers
