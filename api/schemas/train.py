"""A training job: one distributed Ray Train run of a built-in model or of user code.

The REST body of ``POST /v1/jobs``, the argument of ``Client.submit`` and the YAML file
given to ``raydock submit`` are the same spec. Cross-field checks report every problem
at once as ``dotted.path: message`` so one 4xx lists all of them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_serializer, field_validator, model_validator

from api.schemas.code import CODE_REF_RE
from api.schemas.common import ENTRYPOINT_RE, FreeJson, Strict
from api.schemas.data import DataSpec, DigitsData, TextData
from api.schemas.datasets import MAX_DATASETS, DatasetName, Datasets, dataset_problems
from api.schemas.job_common import JobCommon, JobName
from api.schemas.mesh import resolve_mesh
from api.schemas.models import GPTModel, ModelSpec
from api.schemas.parallelism import MODEL_AWARE_STRATEGIES, ParallelismSpec
from api.schemas.parallelism_checks import validate_parallelism
from api.schemas.scaling import ELASTIC_DEFAULT_MAX_RETRIES, ScalingSpec, elastic_problems
from api.schemas.schedule import HyperparameterSchedule


class OptimizerSpec(Strict):
    name: Literal["sgd", "adam", "adamw"] = Field(default="adam", description="Optimizer.")
    lr: float = Field(default=1e-3, gt=0.0, le=10.0, description="Learning rate.")
    weight_decay: float = Field(default=0.0, ge=0.0, le=10.0, description="Weight decay.")
    momentum: float = Field(default=0.0, ge=0.0, lt=1.0, description="Momentum (sgd only).")


class CheckpointSpec(Strict):
    every_n_epochs: int = Field(default=1, ge=1, le=100_000, description="Save a checkpoint every N epochs.")
    every_n_steps: int | None = Field(
        default=None, ge=1, le=100_000_000, description="Also save every N optimizer steps (useful with max_steps)."
    )
    keep: int = Field(
        default=2,
        ge=1,
        le=1000,
        description="How many checkpoints to keep: the most recent, or with `score_metric` the best N (the latest is always kept too).",
    )
    score_metric: str | None = Field(
        default=None,
        max_length=200,
        description="Reported metric that ranks checkpoints for retention, e.g. `val_acc`.",
    )
    score_mode: Literal["min", "max"] = Field(
        default="max", description="Whether a higher or lower score_metric is better."
    )
    upload: Literal["sync", "async"] = Field(
        default="async",
        description=(
            "Built-in models: `sync` writes and uploads each checkpoint before training goes on; `async` copies "
            "the state to CPU memory, trains on while a background thread writes and uploads it (one at a time), "
            "and the checkpoint becomes the latest once its upload is complete and verified."
        ),
    )


class FailureSpec(Strict):
    max_retries: int = Field(
        default=0, ge=0, le=100, description="Worker failures tolerated; each retry resumes from the last checkpoint."
    )


class ReportSpec(Strict):
    every_s: float = Field(
        default=10.0,
        ge=0.1,
        le=86_400,
        description="The built-in loops report at least this often (seconds), besides epoch ends and checkpoints.",
    )
    every_n_steps: int | None = Field(
        default=None, ge=1, le=100_000_000, description="Also report every N optimizer steps."
    )


OPTIONAL_PARALLELISM_SECTIONS = ("pipeline", "tensor_degree", "mesh", "parameter_server")


class TrainSpec(JobCommon):
    """A training job: one distributed Ray Train run."""

    kind: Literal["train"] = Field(default="train", description="Job kind.")
    name: JobName = "job"

    model: ModelSpec | None = Field(default=None, description="A built-in model. Give either this or `entrypoint`.")
    entrypoint: str | None = Field(
        default=None,
        max_length=512,
        description="User code: 'package.module:function', a Ray Train per-worker loop taking `config`.",
    )
    working_dir: str | None = Field(
        default=None,
        max_length=4096,
        description=(
            "The directory of the user code. In a YAML file or an SDK call it is a directory on *your* machine "
            "(relative to the YAML file): the CLI and SDK package and upload it and send `code` instead. Sent "
            "as is over REST it names a directory on the server, allowed only under the operator's code root "
            "(RAYDOCK_CODE_ROOT); anything else is refused with a message to upload the code."
        ),
    )
    code: str | None = Field(
        default=None,
        pattern=CODE_REF_RE,
        max_length=71,
        description=(
            "The user code as an uploaded package, `sha256:<hex of the zip>` (PUT /v1/code/{sha256}); it becomes the "
            "job's working directory on the cluster. Set by the CLI and SDK from `working_dir`; not with `working_dir`."
        ),
    )
    runtime_env: FreeJson | None = Field(
        default=None,
        description=(
            "Extra Ray runtime_env (pip, env_vars, py_modules...) for the job. Not for secrets: the whole spec, "
            "`env_vars` included, is shown to every holder of the API token (GET /v1/jobs) and every job's code "
            "can read it; pass credentials through the cluster's own environment or a secret store."
        ),
    )
    config: FreeJson = Field(
        default_factory=dict, description="Free dict passed to a user-code entrypoint as its `config`."
    )

    data: DataSpec | None = Field(
        default=None, description="Dataset; defaults to digits for built-in models. Optional for user code."
    )
    datasets: Datasets | None = Field(
        default=None,
        description=(
            "User code only: the datasets its loop reads with ray.train.get_dataset_shard(NAME), by NAME: a table "
            "({format: csv|parquet|json, path}) or a share of another ({split: {from: NAME, fraction}}). Read with "
            "Ray Data on the cluster; nothing is assumed about the columns."
        ),
    )
    datasets_to_split: list[DatasetName] | None = Field(
        default=None,
        max_length=MAX_DATASETS,
        description="The datasets split across the workers (each worker reads its shard); the others reach every "
        "worker whole. Default: train.",
    )
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec, description="Optimizer settings.")
    batch_size: int = Field(default=64, ge=1, le=1_000_000, description="Per-worker batch size.")
    epochs: int | None = Field(default=None, ge=1, le=100_000, description="Passes over the training data.")
    max_steps: int | None = Field(
        default=None, ge=1, le=100_000_000, description="Stop after this many optimizer steps."
    )
    seed: int = Field(
        default=0, ge=0, lt=2**32, description="Seed for init, data split and shuffling (0 <= seed < 2**32)."
    )
    scaling: ScalingSpec = Field(default_factory=ScalingSpec, description="Workers and resources.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    failure: FailureSpec = Field(default_factory=FailureSpec, description="Retries on worker failure.")
    report: ReportSpec = Field(default_factory=ReportSpec, description="How often the built-in loops report metrics.")
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec,
        description=(
            "How the model and batches are spread over the workers: strategy (ddp, fsdp, "
            "tensor, pipeline, hybrid), precision, gradient accumulation and compression."
        ),
    )

    schedule: HyperparameterSchedule | None = Field(
        default=None,
        description=(
            "Optimizer values by epoch or step (e.g. a PBT trial's schedule, from GET /v1/jobs/{id}/best/replay); "
            "the built-in loops apply them as they train. Each value must be valid for its optimizer field."
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
    def _datasets(self) -> "TrainSpec":
        if self.datasets is None:
            if self.datasets_to_split is not None:
                raise ValueError("datasets_to_split names datasets of the `datasets` section, which this job has not")
            return self
        if self.entrypoint is None:
            raise ValueError("`datasets` is for user code (`entrypoint`); a built-in model reads `data`")
        if self.data is not None:
            raise ValueError("give one of `data` (one classification table) or `datasets` (named datasets), not both")
        if problems := dataset_problems(self.datasets, self.datasets_to_split):
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _one_model_source(self) -> "TrainSpec":
        if (self.model is None) == (self.entrypoint is None):
            raise ValueError("give exactly one of `model` (a built-in) or `entrypoint` (user code)")
        if self.working_dir and self.code:
            raise ValueError("give one of `working_dir` (a directory) or `code` (an uploaded package), not both")
        if self.model is not None:
            if self.working_dir or self.code or self.runtime_env:
                raise ValueError("`working_dir`, `code` and `runtime_env` apply to user code (`entrypoint`) only")
            if self.epochs is None and self.max_steps is None:
                self.epochs = 5
            if self.data is None:
                self.data = TextData(source="text") if isinstance(self.model, GPTModel) else DigitsData(source="digits")
            self._check_model_data()
        problems = self._parallelism_problems()
        if problems:
            raise ValueError("; ".join(f"{path}: {message}" for path, message in problems))
        return self

    @model_validator(mode="after")
    def _schedule_values(self) -> "TrainSpec":
        if self.schedule is None:
            return self
        if self.is_user_code:
            raise ValueError(
                "schedule: the built-in loops apply a schedule; user code reads its own values from `config`"
            )
        for i, interval in enumerate(self.schedule.intervals):
            fields = {path.removeprefix("optimizer."): v for path, v in interval.values.items()}
            try:
                OptimizerSpec.model_validate({**self.optimizer.model_dump(), **fields})
            except ValueError as exc:
                raise ValueError(
                    f"schedule.intervals.{i}.values: {exc.errors()[0]['loc'][0]} {exc.errors()[0]['msg']}"
                ) from None
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
        if self.model is not None and gpt is None and par.strategy in MODEL_AWARE_STRATEGIES:
            problems.append(
                (
                    "parallelism.strategy",
                    f"strategy {par.strategy} splits a transformer's attention heads or layers; "
                    f"model.type {self.model.type} has neither. Use ddp or fsdp, or model.type gpt.",
                )
            )
        if self.is_user_code and not self.default_parallelism and "parallelism" in self.config:
            problems.append(
                (
                    "config.parallelism",
                    "user code receives the job's parallelism section as config['parallelism']; "
                    "rename your own config key or drop the parallelism section.",
                )
            )
        if self.model is None or problems:
            return problems
        if self.batch_size % par.grad_accumulation_steps:
            problems.append(
                (
                    "parallelism.grad_accumulation_steps",
                    f"batch_size {self.batch_size} does not split into {par.grad_accumulation_steps} "
                    "equal slices. Make batch_size a multiple of grad_accumulation_steps.",
                )
            )
        if gpt is not None:
            problems += self._text_batch_problems(gpt)
        return problems

    def _text_batch_problems(self, gpt: "GPTModel") -> list[tuple[str, str]]:
        par = self.parallelism
        mesh = resolve_mesh(par, self.scaling.max_workers)
        problems: list[tuple[str, str]] = []
        if mesh.pipeline > 1 and self.batch_size % par.pipeline.microbatches:
            problems.append(
                (
                    "parallelism.pipeline.microbatches",
                    f"batch_size {self.batch_size} does not split into {par.pipeline.microbatches} "
                    "microbatches. Make batch_size a multiple of pipeline.microbatches.",
                )
            )
        # One global batch is batch_size rows for each data replica.
        global_batch = self.batch_size * mesh.data
        train_blocks, val_blocks = self.data.block_counts(gpt.seq_len)
        if min(train_blocks, val_blocks) < global_batch:
            need = int(global_batch * gpt.seq_len / 0.1) + gpt.seq_len + 1
            problems.append(
                (
                    "data.n_chars",
                    f"{self.data.n_chars} characters give {val_blocks} validation windows of "
                    f"{gpt.seq_len}, fewer than one global batch of {global_batch} "
                    f"(batch_size {self.batch_size} x {mesh.data} data replicas). Raise "
                    f"data.n_chars to at least {need} or lower batch_size.",
                )
            )
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
