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

import re
from typing import Annotated, Any, Literal

from pydantic import ByteSize, Field, ValidationError, field_validator, model_validator

from api.schemas.common import Strict

MAX_WORKERS = 4096
# Strategies whose mesh is the data axis alone, so any world size runs them. The
# others fix a tensor/pipeline shape (or a parameter-server layout) to a worker count.
ELASTIC_STRATEGIES = frozenset({"ddp", "fsdp"})
# A lost node is a worker failure to Ray Train: an elastic job that does not say how
# many it tolerates gets this many, so losing a node shrinks the job instead of failing it.
ELASTIC_DEFAULT_MAX_RETRIES = 3
MAX_GPUS_PER_WORKER = 64
MAX_MEMORY_PER_WORKER = 1 << 46  # 64 TiB
MAX_CUSTOM_RESOURCES = 16
RESOURCE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$")
ACCELERATOR_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
ACCELERATOR_PREFIX = "accelerator_type:"  # Ray's resource for a node's accelerator type
# What Ray names the resources of a placement group's bundles (``CPU_group_<id>``,
# ``CPU_group_<index>_<id>``, ``bundle_group_<id>``, and ``bundle`` itself): asked for by a
# job, they would place its workers in the bundles another job reserved.
PLACEMENT_GROUP_MARK, PLACEMENT_GROUP_BUNDLE = "_group_", "bundle"
# Resources that have fields of their own, or that Ray sets on every node.
RESERVED_RESOURCES = {"CPU": "cpus_per_worker", "GPU": "gpus_per_worker", "memory": "memory_per_worker"}


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
    use_gpu: bool = Field(default=False, description="Give each worker GPUs (one, or gpus_per_worker) and use NCCL.")
    cpus_per_worker: float = Field(default=1.0, gt=0.0, le=512, description="CPUs reserved per worker.")
    gpus_per_worker: float | None = Field(
        default=None,
        gt=0.0,
        le=MAX_GPUS_PER_WORKER,
        description=(
            "GPUs per worker (implies use_gpu): a fraction below 1 shares a GPU between small workers "
            "(e.g. 0.5), a whole number above 1 gives a worker several (for model parallelism of its own). "
            "Default 1 with use_gpu."
        ),
    )
    accelerator_type: str | None = Field(
        default=None,
        max_length=64,
        description=(
            "Run the workers only on nodes with this accelerator type, as Ray names it (e.g. A100, H100, "
            "L4; Ray's accelerator_type:<name> node resource). Needs GPUs."
        ),
    )
    memory_per_worker: ByteSize | None = Field(
        default=None,
        gt=0,
        le=MAX_MEMORY_PER_WORKER,
        description='Memory reserved per worker (Ray\'s memory resource): bytes, or "8GiB", "512MiB".',
    )
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict,
        max_length=MAX_CUSTOM_RESOURCES,
        description='Custom Ray resources per worker, by name (e.g. {"infiniband": 1}); CPU, GPU and memory have fields of their own.',
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        default="PACK",
        description=(
            "How Ray places the workers on nodes: PACK (as few nodes as possible), SPREAD (as many), or the STRICT_ "
            "forms, which wait rather than place otherwise."
        ),
    )
    local_ranks: bool = Field(
        default=True,
        description=(
            "false: every worker is a Ray worker (Ray Train's worker actors; a function trial runs in its Tune "
            "trainable), as code that calls Ray's core API (tasks, actors, ray.put, Ray Data) needs. true: a "
            "fixed-size job whose workers fit one node runs them as local ranks forked from its driver (a search's "
            "trials: forked by their trainables), which start faster but are no Ray workers."
        ),
    )
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

    @field_validator("resources_per_worker")
    @classmethod
    def _custom_resources(cls, v: dict[str, float]) -> dict[str, float]:
        for name, amount in v.items():
            if name in RESERVED_RESOURCES:
                raise ValueError(f"{name!r} has a field of its own: set scaling.{RESERVED_RESOURCES[name]}")
            if name.startswith(ACCELERATOR_PREFIX):
                raise ValueError(f"{name!r}: set scaling.accelerator_type instead")
            if PLACEMENT_GROUP_MARK in name or name == PLACEMENT_GROUP_BUNDLE:
                raise ValueError(
                    f"{name[:80]!r} is the form of Ray's placement-group resources (<resource>_group_<id>, "
                    "<resource>_group_<index>_<id>, bundle), which hold other jobs' reserved workers: "
                    "name a custom resource your nodes declare instead (e.g. infiniband), without '_group_'"
                )
            if name.startswith("node:") or name == "object_store_memory" or not RESOURCE_NAME.match(name):
                raise ValueError(
                    f"{name[:80]!r} is not a custom resource name this server takes: a letter, then up to 63 "
                    "letters, digits, '_', '.' or '-' (and not node:*, object_store_memory)"
                )
            if not 0 < amount <= 1_000_000:
                raise ValueError(f"{name}: the amount must be > 0 and <= 1000000 (got {amount:g})")
        return v

    @model_validator(mode="after")
    def _hardware(self) -> "ScalingSpec":
        if self.gpus_per_worker is not None:
            if "use_gpu" in self.model_fields_set and not self.use_gpu:
                raise ValueError("gpus_per_worker asks for GPUs but use_gpu is false: drop one of them")
            if self.gpus_per_worker > 1 and not float(self.gpus_per_worker).is_integer():
                raise ValueError(
                    f"gpus_per_worker {self.gpus_per_worker:g}: above 1 it must be a whole number of GPUs "
                    "(Ray shares a GPU only in fractions below 1)"
                )
            self.use_gpu = True
        if self.accelerator_type is not None:
            if not ACCELERATOR_TYPE.match(self.accelerator_type):
                raise ValueError(
                    f"accelerator_type {self.accelerator_type[:80]!r}: letters, digits, '_', '.' or '-' "
                    "(e.g. A100, H100)"
                )
            if not self.use_gpu:
                raise ValueError(
                    f"accelerator_type {self.accelerator_type} picks the workers' GPUs: set use_gpu or gpus_per_worker"
                )
        return self

    @property
    def gpus(self) -> float:
        """GPUs each worker holds."""
        if not self.use_gpu:
            return 0.0
        return float(self.gpus_per_worker) if self.gpus_per_worker is not None else 1.0

    def worker_resources(self) -> dict[str, float]:
        """What one worker reserves, as Ray's ``resources_per_worker`` (the accelerator
        type is Ray's own ``accelerator_type`` argument, and not in here)."""
        out = {"CPU": self.cpus_per_worker, **({"GPU": self.gpus} if self.use_gpu else {})}
        if self.memory_per_worker is not None:
            out["memory"] = float(self.memory_per_worker)
        return {**out, **self.resources_per_worker}

    def extra_resources(self) -> dict[str, float]:
        """One worker's resources beyond CPUs and GPUs, as admission counts them: memory,
        the custom ones, and its accelerator type (a node must have it)."""
        out = {k: v for k, v in self.worker_resources().items() if k not in ("CPU", "GPU")}
        if self.accelerator_type is not None:
            out[ACCELERATOR_PREFIX + self.accelerator_type] = self.gpus
        return out

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
