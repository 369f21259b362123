"""The raydock contract: pydantic models shared by the server, the SDK and the CLI.

The REST body of ``POST /v1/jobs``, the argument of ``Client.submit`` and the YAML file
given to ``raydock submit`` are all the same ``JobSpec``. Every model forbids unknown
fields so a typo fails loudly, and every field carries a description that feeds the
OpenAPI page, the SDK docs and the CLI.

This module imports nothing internal and nothing heavy (no torch, no ray, no fastapi).
"""

from __future__ import annotations

import enum
import re
from datetime import datetime
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

ENTRYPOINT_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ----------------------------------------------------------------------------- models


class MLPModel(Strict):
    type: Literal["mlp"] = Field(description="A multilayer perceptron over flat features.")
    hidden_sizes: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [128], description="Width of each hidden layer."
    )
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout after each hidden layer.")


class CNNModel(Strict):
    type: Literal["cnn"] = Field(description="A small convolutional net for square single-channel images.")
    channels: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [16, 32], description="Output channels of each 3x3 conv block."
    )
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout before the classifier.")


ModelSpec = Annotated[Union[MLPModel, CNNModel], Field(discriminator="type")]


# ----------------------------------------------------------------------------- data


class DigitsData(Strict):
    source: Literal["digits"] = Field(
        description="scikit-learn's bundled handwritten digits (1797 8x8 images, 10 classes); no download."
    )
    val_fraction: float = Field(default=0.2, gt=0.0, lt=1.0, description="Share held out for validation.")


class SyntheticData(Strict):
    source: Literal["synthetic"] = Field(description="A generated classification problem (deterministic by seed).")
    n_samples: int = Field(default=2048, ge=16, le=10_000_000, description="Number of rows.")
    n_features: int = Field(default=32, ge=2, le=100_000, description="Number of features.")
    n_classes: int = Field(default=4, ge=2, le=1000, description="Number of classes.")
    val_fraction: float = Field(default=0.2, gt=0.0, lt=1.0, description="Share held out for validation.")


class TabularData(Strict):
    source: Literal["csv", "parquet"] = Field(
        description="A user table read with Ray Data and sharded across workers."
    )
    path: str = Field(min_length=1, description="File, directory or URI (s3://, gs://, ...) of the table.")
    label_column: str = Field(min_length=1, description="Column holding the integer class label.")
    feature_columns: list[str] | None = Field(
        default=None, description="Columns used as features; all other numeric columns when omitted."
    )
    num_classes: int | None = Field(
        default=None, ge=2, description="Number of classes; inferred from the labels when omitted."
    )
    val_fraction: float = Field(default=0.2, gt=0.0, lt=1.0, description="Share held out for validation.")


DataSpec = Annotated[Union[DigitsData, SyntheticData, TabularData], Field(discriminator="source")]


# ----------------------------------------------------------------------------- training knobs


class OptimizerSpec(Strict):
    name: Literal["sgd", "adam", "adamw"] = Field(default="adam", description="Optimizer.")
    lr: float = Field(default=1e-3, gt=0.0, le=10.0, description="Learning rate.")
    weight_decay: float = Field(default=0.0, ge=0.0, description="Weight decay.")
    momentum: float = Field(default=0.0, ge=0.0, lt=1.0, description="Momentum (sgd only).")


class ScalingSpec(Strict):
    num_workers: int = Field(default=2, ge=1, le=4096, description="Number of Ray Train workers.")
    use_gpu: bool = Field(default=False, description="Give each worker one GPU and use NCCL.")
    cpus_per_worker: float = Field(default=1.0, gt=0.0, le=512, description="CPUs reserved per worker.")


class CheckpointSpec(Strict):
    every_n_epochs: int = Field(default=1, ge=1, description="Save a checkpoint every N epochs.")
    every_n_steps: int | None = Field(
        default=None, ge=1, description="Also save every N optimizer steps (useful with max_steps)."
    )
    keep: int = Field(default=2, ge=1, le=1000, description="How many recent checkpoints to keep.")


class FailureSpec(Strict):
    max_retries: int = Field(
        default=0, ge=0, le=100, description="Worker failures tolerated; each retry resumes from the last checkpoint."
    )


class TrainSpec(Strict):
    """A training job: one distributed Ray Train run."""

    kind: Literal["train"] = Field(default="train", description="Job kind.")
    name: str = Field(default="job", pattern=NAME_RE, description="Human-readable name (letters, digits, . _ -).")
    labels: dict[str, str] = Field(default_factory=dict, description="Free labels to filter jobs by.")

    model: ModelSpec | None = Field(
        default=None, description="A built-in model. Give either this or `entrypoint`."
    )
    entrypoint: str | None = Field(
        default=None,
        description="User code: 'package.module:function', a Ray Train per-worker loop taking `config`.",
    )
    working_dir: str | None = Field(
        default=None,
        description="Local directory on the server uploaded to the cluster with the job (like `ray job submit --working-dir`).",
    )
    runtime_env: dict[str, Any] | None = Field(
        default=None, description="Extra Ray runtime_env (pip, env_vars, py_modules...) for the job."
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="Free dict passed to a user-code entrypoint as its `config`."
    )

    data: DataSpec | None = Field(
        default=None, description="Dataset; defaults to digits for built-in models. Optional for user code."
    )
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec, description="Optimizer settings.")
    batch_size: int = Field(default=64, ge=1, le=1_000_000, description="Per-worker batch size.")
    epochs: int | None = Field(default=None, ge=1, le=100_000, description="Passes over the training data.")
    max_steps: int | None = Field(
        default=None, ge=1, le=100_000_000, description="Stop after this many optimizer steps."
    )
    seed: int = Field(default=0, ge=0, description="Seed for init, data split and shuffling.")
    scaling: ScalingSpec = Field(default_factory=ScalingSpec, description="Workers and resources.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    failure: FailureSpec = Field(default_factory=FailureSpec, description="Retries on worker failure.")

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_form(cls, v: str | None) -> str | None:
        if v is not None and not ENTRYPOINT_RE.match(v):
            raise ValueError("must look like 'package.module:function'")
        return v

    @model_validator(mode="after")
    def _one_model_source(self) -> "TrainSpec":
        if (self.model is None) == (self.entrypoint is None):
            raise ValueError("give exactly one of `model` (a built-in) or `entrypoint` (user code)")
        if self.model is not None:
            if self.working_dir or self.runtime_env:
                raise ValueError("`working_dir` and `runtime_env` apply to user code (`entrypoint`) only")
            if self.epochs is None and self.max_steps is None:
                self.epochs = 5
            if self.data is None:
                self.data = DigitsData(source="digits")
        return self

    @property
    def is_user_code(self) -> bool:
        return self.entrypoint is not None


JobSpec = TrainSpec
job_spec_adapter: TypeAdapter[JobSpec] = TypeAdapter(JobSpec)


def parse_job_spec(data: dict[str, Any]) -> JobSpec:
    """Validate a plain dict (from JSON or YAML) into a JobSpec."""
    return job_spec_adapter.validate_python(data)


# ----------------------------------------------------------------------------- lifecycle


class JobStatus(str, enum.Enum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    def is_terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class FailureCause(str, enum.Enum):
    USER_CODE = "USER_CODE"  # the training code raised
    NO_RESOURCES = "NO_RESOURCES"  # the cluster could not give what the job asked for
    INFRASTRUCTURE = "INFRASTRUCTURE"  # Ray, the node, or raydock itself failed


# ----------------------------------------------------------------------------- responses


class ErrorBody(BaseModel):
    code: str = Field(description="Machine-readable error code, e.g. `invalid_spec`.")
    message: str = Field(description="What went wrong and what to change.")
    details: list[dict[str, Any]] = Field(default_factory=list, description="Per-field problems, if any.")


class ErrorResponse(BaseModel):
    error: ErrorBody


class JobPublic(BaseModel):
    id: str = Field(description="Job id.")
    name: str
    kind: str
    status: JobStatus
    status_reason: str | None = Field(default=None, description="Why the job is in its status.")
    failure_cause: FailureCause | None = Field(default=None, description="Set when FAILED.")
    error: str | None = Field(default=None, description="The error message and traceback tail when FAILED.")
    labels: dict[str, str] = Field(default_factory=dict)
    spec: dict[str, Any] = Field(description="The submitted spec with defaults filled in.")
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempt: int = Field(default=0, description="Number of times the job has been started.")
    ray_job_id: str | None = Field(default=None, description="The Ray job submission id.")
    latest_metrics: dict[str, Any] | None = Field(default=None, description="The last reported metrics.")


class JobList(BaseModel):
    items: list[JobPublic]
    total: int
    limit: int
    offset: int


class MetricPoint(BaseModel):
    seq: int = Field(description="Position in the job's report sequence (0-based, gap-free).")
    ts: float = Field(description="Unix time the report was made.")
    step: int | None = None
    epoch: int | None = None
    metrics: dict[str, Any]


class CheckpointPublic(BaseModel):
    id: int = Field(description="Checkpoint id within raydock.")
    path: str = Field(description="Where the checkpoint lives in storage.")
    step: int | None = None
    epoch: int | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime


class NodeInfo(BaseModel):
    node_id: str
    ip: str
    alive: bool
    is_head: bool
    cpus: float
    gpus: float


class ClusterInfo(BaseModel):
    address: str = Field(description="The Ray dashboard address raydock talks to.")
    nodes: list[NodeInfo]
    cpus_total: float
    cpus_free: float
    gpus_total: float
    gpus_free: float
