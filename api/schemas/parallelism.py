"""The ``parallelism`` section of a job spec, and the checks that need the rest of the spec.

A job says *how* its model is spread over its workers here: plain data parallelism
(``ddp``), sharded data parallelism (``fsdp``), tensor or pipeline model parallelism,
a ``hybrid`` mesh of data x pipeline or data x tensor, or a parameter server.

Every strategy is a point on one 3-D mesh of workers, ``data x pipeline x tensor``
(see ``api.schemas.mesh.resolve_mesh``). ``tensor`` and ``pipeline`` use one model axis and give the
remaining workers to the data axis: 4 workers with ``tensor_degree: 2`` train two data
replicas, each split over 2 workers. ``hybrid`` names the mesh explicitly.

The models here check single fields only. The mesh a strategy implies is worked out
in ``api.schemas.mesh``; checks that need other parts of the job (worker count, GPU,
model size, whether the job brings its own code) live in
``api.schemas.parallelism_checks``, which returns every problem at once as
``(dotted_path, message)`` pairs so the API can answer one 4xx listing all of them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from api.schemas.common import Strict

Strategy = Literal["ddp", "fsdp", "tensor", "pipeline", "hybrid", "parameter_server"]
Precision = Literal["fp32", "bf16", "fp16"]
GradCompression = Literal["none", "bf16", "fp16", "powersgd"]

# Strategies that need to know the model's structure (which projections to shard,
# where to cut between layers). A job that brings its own training code brings its
# own model, so only structure-agnostic strategies apply to it.
MODEL_AWARE_STRATEGIES = frozenset({"tensor", "pipeline", "hybrid"})

# Strategies that run only the built-in classifiers (mlp, cnn): the parameter server
# holds their parameters in Ray actors shard by shard.
CLASSIFIER_ONLY_STRATEGIES = frozenset({"parameter_server"})
Compile = Literal["auto", "on", "off"]


class PipelineOptions(Strict):
    """How a pipeline-parallel model is cut and scheduled."""

    stages: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Number of pipeline stages, one per worker on the pipeline axis. Each stage "
            "holds a contiguous run of transformer blocks. Default: all workers (strategy "
            "pipeline) or mesh.pipeline (strategy hybrid). With strategy pipeline, workers "
            "beyond the stages form data-parallel replicas of the whole pipeline."
        ),
    )
    microbatches: int = Field(
        default=4,
        ge=1,
        description=(
            "Number of microbatches each worker's batch is split into so stages work "
            "concurrently. More microbatches shrink the idle 'bubble'; the per-worker "
            "batch size must be divisible by it. Schedule 1f1b needs at least as many "
            "microbatches as stages."
        ),
    )
    schedule: Literal["gpipe", "1f1b"] = Field(
        default="1f1b",
        description=(
            "gpipe: all forwards, then all backwards (simple, holds every microbatch's "
            "activations). 1f1b: interleaves one forward with one backward (same result, "
            "activation memory bounded by the number of stages)."
        ),
    )


class MeshShape(Strict):
    """Sizes of the three worker axes; their product is the number of workers."""

    data: int = Field(default=1, ge=1, description="Data-parallel replicas of the model.")
    pipeline: int = Field(default=1, ge=1, description="Pipeline stages per replica.")
    tensor: int = Field(default=1, ge=1, description="Workers each layer's weights are split over.")

    @property
    def size(self) -> int:
        return self.data * self.pipeline * self.tensor


class ParameterServerOptions(Strict):
    """Parameter-server training: servers hold the weights, workers push gradients."""

    num_servers: int = Field(
        default=1,
        ge=1,
        description="Number of server processes the parameters are partitioned over.",
    )
    mode: Literal["sync", "async"] = Field(
        default="sync",
        description=(
            "sync: servers wait for every worker's gradient before updating. async: "
            "servers apply each gradient as it arrives."
        ),
    )
    staleness: int = Field(
        default=0,
        ge=0,
        description=(
            "async only: how many updates behind the servers a worker's copy of the "
            "parameters may fall before it must pull fresh ones. 0 means always pull."
        ),
    )


class ParallelismSpec(Strict):
    """How a training job spreads its model and batches over its workers."""

    strategy: Strategy = Field(
        default="ddp",
        description=(
            "ddp: every worker holds the whole model, gradients are averaged. fsdp: "
            "parameters, gradients and optimizer state are sharded over workers. tensor: "
            "each layer's weights are split over workers. pipeline: consecutive layers "
            "live on different workers. hybrid: an explicit mesh (data x pipeline or data "
            "x tensor). parameter_server: Ray actors hold parameter shards and optimizer "
            "state; workers push gradients and pull weights (built-in mlp and cnn)."
        ),
    )
    pipeline: PipelineOptions = Field(
        default_factory=PipelineOptions,
        description="Pipeline options; read by strategies pipeline and hybrid.",
    )
    tensor_degree: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Workers each layer is split over (strategy tensor). Must divide the number "
            "of attention heads. Default: all workers."
        ),
    )
    mesh: MeshShape | None = Field(
        default=None,
        description=(
            "Worker mesh for strategy hybrid, e.g. {data: 2, tensor: 2}. The product of "
            "its sizes must equal the number of workers."
        ),
    )
    precision: Precision = Field(
        default="fp32",
        description=(
            "Compute precision. bf16 runs forward under autocast on CPU or GPU with fp32 "
            "weights. fp16 needs a GPU and uses loss scaling."
        ),
    )
    grad_accumulation_steps: int = Field(
        default=1,
        ge=1,
        description=(
            "Split each worker's batch into this many slices, run forward/backward per "
            "slice and synchronise gradients once. Same update as one big batch, less "
            "activation memory."
        ),
    )
    grad_compression: GradCompression = Field(
        default="none",
        description=(
            "Compress gradients before averaging them (strategy ddp): bf16/fp16 halve the "
            "bytes sent; powersgd sends a low-rank approximation with error feedback."
        ),
    )
    parameter_server: ParameterServerOptions = Field(
        default_factory=ParameterServerOptions,
        description="Parameter-server options; read by strategy parameter_server.",
    )
    compile: Compile = Field(
        default="auto",
        description=(
            "torch.compile the built-in model and its loss: auto compiles on GPU and not on CPU "
            "(where compile time outweighs the gain for small models); on/off force it."
        ),
    )
