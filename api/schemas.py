"""The raydock contract: pydantic models shared by the server, the SDK and the CLI.

The REST body of ``POST /v1/jobs``, the argument of ``Client.submit`` and the YAML file
given to ``raydock submit`` are all the same ``JobSpec``. Every model forbids unknown
fields so a typo fails loudly, and every field carries a description that feeds the
OpenAPI page, the SDK docs and the CLI.

This module imports nothing heavy (no torch, no ray, no fastapi) and nothing internal
but ``api.parallelism``, the ``parallelism`` section and its cross-field checks.
"""

from __future__ import annotations

import enum
import re
from datetime import datetime
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    field_serializer,
    field_validator,
    model_validator,
)

from api.elastic import ELASTIC_DEFAULT_MAX_RETRIES, AutoscalerPublic, WorkerRange, coerce_num_workers, elastic_problems
from api.parallelism import MODEL_AWARE_STRATEGIES, ParallelismSpec, resolve_mesh, validate_parallelism

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


class GPTModel(Strict):
    type: Literal["gpt"] = Field(
        description=(
            "A small decoder-only transformer over characters; the model the tensor, "
            "pipeline and hybrid strategies can split. Trains on `data: {source: text}`."
        )
    )
    n_layer: int = Field(default=2, ge=1, le=256, description="Transformer blocks (what pipeline stages split).")
    n_head: int = Field(default=2, ge=1, le=256, description="Attention heads per block (what tensor parallelism splits).")
    d_model: int = Field(default=32, ge=1, le=16_384, description="Width of the residual stream; a multiple of n_head.")
    seq_len: int = Field(default=32, ge=2, le=8192, description="Context length in characters.")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout in attention and MLP outputs.")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "GPTModel":
        if self.d_model % self.n_head:
            raise ValueError(
                f"model.d_model ({self.d_model}) must be a multiple of model.n_head "
                f"({self.n_head}) so every head gets the same width"
            )
        return self


ModelSpec = Annotated[Union[MLPModel, CNNModel, GPTModel], Field(discriminator="type")]


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


class TextData(Strict):
    source: Literal["text"] = Field(
        description=(
            "A character corpus generated locally from a small English grammar "
            "(deterministic by seed; no download). The last 10% is held out for validation."
        )
    )
    n_chars: int = Field(
        default=64 * 1024, ge=1024, le=100_000_000, description="Length of the generated corpus in characters."
    )
    val_batches: int = Field(
        default=4, ge=1, le=10_000, description="Validation batches evaluated at each report."
    )

    def block_counts(self, seq_len: int) -> tuple[int, int]:
        """(train, val) windows of ``seq_len`` characters, as ``trainers.text_data`` cuts them."""
        cut = int(self.n_chars * 0.9)
        return (cut - 1) // seq_len, (self.n_chars - cut - 1) // seq_len


DataSpec = Annotated[
    Union[DigitsData, SyntheticData, TabularData, TextData], Field(discriminator="source")
]


# ----------------------------------------------------------------------------- training knobs


class OptimizerSpec(Strict):
    name: Literal["sgd", "adam", "adamw"] = Field(default="adam", description="Optimizer.")
    lr: float = Field(default=1e-3, gt=0.0, le=10.0, description="Learning rate.")
    weight_decay: float = Field(default=0.0, ge=0.0, description="Weight decay.")
    momentum: float = Field(default=0.0, ge=0.0, lt=1.0, description="Momentum (sgd only).")


class ScalingSpec(Strict):
    num_workers: Annotated[int, Field(ge=1, le=4096)] | WorkerRange = Field(
        default=2,
        description=(
            "Number of Ray Train workers, or a range {min, max} for an elastic job: it starts with "
            "what fits (at least min), grows towards max as capacity appears and shrinks when a node "
            "is lost, resuming from its last checkpoint each time (see api/elastic.py)."
        ),
    )
    use_gpu: bool = Field(default=False, description="Give each worker one GPU and use NCCL.")
    cpus_per_worker: float = Field(default=1.0, gt=0.0, le=512, description="CPUs reserved per worker.")
    resize_check_interval_s: float = Field(
        default=60.0, ge=1.0, le=86_400,
        description="Elastic jobs only: how often a running job checks whether it can grow (each resize restarts its workers).",
    )  # fmt: skip

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


class CheckpointSpec(Strict):
    every_n_epochs: int = Field(default=1, ge=1, description="Save a checkpoint every N epochs.")
    every_n_steps: int | None = Field(
        default=None, ge=1, description="Also save every N optimizer steps (useful with max_steps)."
    )
    keep: int = Field(
        default=2, ge=1, le=1000,
        description="How many checkpoints to keep: the most recent, or with `score_metric` the best N (the latest is always kept too).",
    )  # fmt: skip
    score_metric: str | None = Field(
        default=None, description="Reported metric that ranks checkpoints for retention, e.g. `val_acc`."
    )
    score_mode: Literal["min", "max"] = Field(default="max", description="Whether a higher or lower score_metric is better.")


class FailureSpec(Strict):
    max_retries: int = Field(
        default=0, ge=0, le=100, description="Worker failures tolerated; each retry resumes from the last checkpoint."
    )


OPTIONAL_PARALLELISM_SECTIONS = ("pipeline", "tensor_degree", "mesh", "parameter_server")


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
    priority: int = Field(
        default=0, ge=-1000, le=1000, description="Queue priority: higher starts first; equal priorities start in arrival order."
    )
    max_runtime_s: float | None = Field(
        default=None, gt=0, description="Fail the job (cause TIMEOUT) if it runs longer than this many seconds."
    )
    scheduling_timeout_s: float | None = Field(
        default=None, gt=0,
        description="Fail the job (cause NO_RESOURCES) if the cluster cannot start it within this many seconds of submission.",
    )  # fmt: skip
    scaling: ScalingSpec = Field(default_factory=ScalingSpec, description="Workers and resources.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    failure: FailureSpec = Field(default_factory=FailureSpec, description="Retries on worker failure.")
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec,
        description=(
            "How the model and batches are spread over the workers: strategy (ddp, fsdp, "
            "tensor, pipeline, hybrid), precision, gradient accumulation and compression."
        ),
    )

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_form(cls, v: str | None) -> str | None:
        if v is not None and not ENTRYPOINT_RE.match(v):
            raise ValueError("must look like 'package.module:function'")
        return v

    @model_validator(mode="after")
    def _elastic(self) -> "TrainSpec":
        problems = elastic_problems(
            self.scaling.num_workers,
            strategy=self.parallelism.strategy,
            model_type=self.model.type if self.model is not None else None,
        )
        if problems:
            raise ValueError("; ".join(f"{path}: {message}" for path, message in problems))
        if self.scaling.is_elastic and "failure" not in self.model_fields_set:
            self.failure = FailureSpec(max_retries=ELASTIC_DEFAULT_MAX_RETRIES)
        return self

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
                self.data = TextData(source="text") if isinstance(self.model, GPTModel) else DigitsData(source="digits")
            self._check_model_data()
        problems = self._parallelism_problems()
        if problems:
            raise ValueError("; ".join(f"{path}: {message}" for path, message in problems))
        return self

    def _check_model_data(self) -> None:
        if isinstance(self.model, GPTModel) and not isinstance(self.data, TextData):
            raise ValueError(
                f"data.source: model.type gpt reads characters, not {self.data.source} rows. "
                "Use data: {source: text}."
            )
        if isinstance(self.data, TextData) and not isinstance(self.model, GPTModel):
            raise ValueError(
                f"data.source: the text corpus is read by model.type gpt only, not {self.model.type}. "
                "Use model: {type: gpt} or a tabular source."
            )

    def _parallelism_problems(self) -> list[tuple[str, str]]:
        """Every ``(dotted_path, message)`` problem of ``parallelism`` with the rest of the job."""
        par = self.parallelism
        gpt = self.model if isinstance(self.model, GPTModel) else None
        problems = validate_parallelism(
            par,
            num_workers=self.scaling.max_workers,
            use_gpu=self.scaling.use_gpu,
            n_layers=gpt.n_layer if gpt else None,
            n_heads=gpt.n_head if gpt else None,
            user_code=self.is_user_code,
        )
        if par.strategy == "parameter_server":
            problems = self._parameter_server_problems(problems)
        if self.model is not None and gpt is None and par.strategy in MODEL_AWARE_STRATEGIES:
            problems.append((
                "parallelism.strategy",
                f"strategy {par.strategy} splits a transformer's attention heads or layers; "
                f"model.type {self.model.type} has neither. Use ddp or fsdp, or model.type gpt.",
            ))
        if self.is_user_code and not self.default_parallelism and "parallelism" in self.config:
            problems.append((
                "config.parallelism",
                "user code receives the job's parallelism section as config['parallelism']; "
                "rename your own config key or drop the parallelism section.",
            ))
        if self.model is None or problems:
            return problems
        if self.batch_size % par.grad_accumulation_steps:
            problems.append((
                "parallelism.grad_accumulation_steps",
                f"batch_size {self.batch_size} does not split into {par.grad_accumulation_steps} "
                "equal slices. Make batch_size a multiple of grad_accumulation_steps.",
            ))
        if gpt is not None:
            problems += self._text_batch_problems(gpt)
        return problems

    def _parameter_server_problems(self, problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
        # validate_parallelism lists parameter_server as unavailable everywhere; the
        # trainer runs it for the built-in classifiers (trainers.parallel.parameter_server),
        # so that refusal stands only for the GPT and user code, with the reason.
        others = [p for p in problems if p[0] != "parallelism.strategy"]
        if isinstance(self.model, (MLPModel, CNNModel)):
            return others
        what = "model.type gpt" if self.model is not None else "user code"
        return others + [(
            "parallelism.strategy",
            f"strategy parameter_server runs the built-in mlp and cnn only, not {what}. "
            "Use ddp or fsdp, or model.type mlp/cnn.",
        )]

    def _text_batch_problems(self, gpt: "GPTModel") -> list[tuple[str, str]]:
        par = self.parallelism
        mesh = resolve_mesh(par, self.scaling.max_workers)
        problems: list[tuple[str, str]] = []
        if mesh.pipeline > 1 and self.batch_size % par.pipeline.microbatches:
            problems.append((
                "parallelism.pipeline.microbatches",
                f"batch_size {self.batch_size} does not split into {par.pipeline.microbatches} "
                "microbatches. Make batch_size a multiple of pipeline.microbatches.",
            ))
        # One global batch is batch_size rows for each data replica.
        global_batch = self.batch_size * mesh.data
        train_blocks, val_blocks = self.data.block_counts(gpt.seq_len)
        if min(train_blocks, val_blocks) < global_batch:
            need = int(global_batch * gpt.seq_len / 0.1) + gpt.seq_len + 1
            problems.append((
                "data.n_chars",
                f"{self.data.n_chars} characters give {val_blocks} validation windows of "
                f"{gpt.seq_len}, fewer than one global batch of {global_batch} "
                f"(batch_size {self.batch_size} x {mesh.data} data replicas). Raise "
                f"data.n_chars to at least {need} or lower batch_size.",
            ))
        return problems

    @field_serializer("parallelism")
    def _dump_parallelism(self, par: ParallelismSpec) -> dict[str, Any]:
        # Optional sections appear only when given: a dumped spec must validate again
        # (the job driver re-reads it), and a section the strategy does not read is refused.
        dumped = par.model_dump(mode="json")
        for section in OPTIONAL_PARALLELISM_SECTIONS:
            if section not in par.model_fields_set:
                dumped.pop(section)
        return dumped

    @property
    def is_user_code(self) -> bool:
        return self.entrypoint is not None

    @property
    def default_parallelism(self) -> bool:
        """Plain data parallelism in fp32 with no accumulation or compression."""
        return self.parallelism.model_dump() == ParallelismSpec().model_dump()


# --- tune jobs: a TuneSpec (api/tune_schemas.py) wraps a TrainSpec, so it joins the union here;
# a spec without `kind` is a training job.
from pydantic import Discriminator, Tag  # noqa: E402

from api.tune_schemas import TuneSpec, job_kind  # noqa: E402

TuneSpec.model_rebuild()
JobSpec = Annotated[
    Union[Annotated[TrainSpec, Tag("train")], Annotated[TuneSpec, Tag("tune")]],
    Discriminator(job_kind, custom_error_type="invalid_kind", custom_error_message="kind must be train (the default) or tune"),
]
# --- end tune jobs
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
    TIMEOUT = "TIMEOUT"  # the job ran past its max_runtime_s


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
    queue_position: int | None = Field(default=None, description="1-based place in the queue while QUEUED.")
    restarts: list["RestartInfo"] = Field(
        default_factory=list, description="Worker-group restarts from checkpoint within the job's attempts, with why."
    )


class RestartInfo(BaseModel):
    attempt: int = Field(description="The job attempt (Ray job submission) it happened in.")
    at: float = Field(description="Unix time of the failure.")
    reason: str = Field(description="The worker failure that caused the restart.")


class JobList(BaseModel):
    items: list[JobPublic]
    total: int
    limit: int
    offset: int


class MetricPoint(BaseModel):
    seq: int = Field(description="Position in the job's report sequence (0-based, gap-free).")
    attempt: int = Field(default=1, description="The job attempt that reported it (resume starts a new one).")
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
    autoscaler: AutoscalerPublic | None = Field(
        default=None, description="What the cluster's autoscaler can add; None when the cluster has no autoscaler."
    )
