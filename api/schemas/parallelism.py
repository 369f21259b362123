"""The ``parallelism`` section of a job spec, and the checks that need the rest of the spec.

A job says *how* its model is spread over its workers here: plain data parallelism
(``ddp``), sharded data parallelism (``fsdp``), tensor or pipeline model parallelism,
a ``hybrid`` mesh of data x pipeline or data x tensor, or a parameter server.

Every strategy is a point on one 3-D mesh of workers, ``data x pipeline x tensor``
(see :func:`resolve_mesh`). ``tensor`` and ``pipeline`` use one model axis and give the
remaining workers to the data axis: 4 workers with ``tensor_degree: 2`` train two data
replicas, each split over 2 workers. ``hybrid`` names the mesh explicitly.

The models below check single fields only. Checks that need other parts of the job
(worker count, GPU, model size, whether the job brings its own code) live in
:func:`validate_parallelism`, which returns every problem at once as
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


def resolve_mesh(par: ParallelismSpec, num_workers: int) -> MeshShape:
    """The ``data x pipeline x tensor`` mesh a strategy runs on with ``num_workers``.

    Assumes :func:`validate_parallelism` found no errors; raises ``ValueError`` if the
    sizes do not multiply out to ``num_workers``.
    """
    if par.strategy == "hybrid":
        shape = par.mesh if par.mesh is not None else MeshShape(data=num_workers)
    elif par.strategy == "tensor":
        degree = par.tensor_degree or num_workers
        shape = MeshShape(data=num_workers // degree, tensor=degree)
    elif par.strategy == "pipeline":
        stages = par.pipeline.stages or num_workers
        shape = MeshShape(data=num_workers // stages, pipeline=stages)
    else:
        shape = MeshShape(data=num_workers)
    if shape.size != num_workers:
        raise ValueError(
            f"parallelism resolves to a {shape.data}x{shape.pipeline}x{shape.tensor} "
            f"(data x pipeline x tensor) mesh, which does not fit {num_workers} workers"
        )
    return shape


def validate_parallelism(
    par: ParallelismSpec,
    *,
    num_workers: int,
    use_gpu: bool,
    n_layers: int | None,
    n_heads: int | None,
    user_code: bool,
) -> list[tuple[str, str]]:
    """Check ``par`` against the rest of the job; return ``(dotted_path, message)`` errors.

    ``n_layers`` / ``n_heads`` describe the built-in model and are ``None`` when unknown
    (a job that brings its own code); checks that need them are then skipped. An empty
    list means the job can run.
    """
    errors: list[tuple[str, str]] = []

    def err(path: str, message: str) -> None:
        errors.append((f"parallelism.{path}" if path else "parallelism", message))

    strategy = par.strategy
    if strategy in CLASSIFIER_ONLY_STRATEGIES and (user_code or n_layers is not None):
        what = "user code" if user_code else "model.type gpt"
        err(
            "strategy",
            f"strategy {strategy} runs the built-in mlp and cnn only, not {what}. "
            "Use ddp or fsdp, or model.type mlp/cnn.",
        )
    if user_code and strategy in MODEL_AWARE_STRATEGIES:
        err(
            "strategy",
            f"strategy {strategy} needs raydock's built-in model: it has to know which "
            "projections to split and where to cut between layers, which it cannot know "
            "for your own training code. Use ddp, or fsdp to shard a large model.",
        )

    _check_unused_sections(par, err)
    shape = _check_mesh(par, num_workers, err)
    if shape is not None:
        _check_model_fits(par, shape, n_layers, n_heads, err)
        if shape.pipeline > 1:
            _check_pipeline(par, shape, err)

    if par.precision == "fp16":
        if not use_gpu:
            err(
                "precision",
                "fp16 needs a GPU (its loss scaling runs on CUDA). Use bf16 on CPU, or run the job with GPUs.",
            )
        if strategy != "ddp":
            err(
                "precision",
                f"fp16 loss scaling is supported with strategy ddp only, not {strategy}. "
                "Use bf16, which needs no loss scaling.",
            )
    if par.grad_compression != "none" and strategy != "ddp":
        err(
            "grad_compression",
            f"gradient compression runs in ddp's communication hooks; strategy {strategy} "
            "synchronises gradients differently. Set grad_compression: none or use ddp.",
        )
    ps = par.parameter_server
    if ps.staleness > 0 and ps.mode != "async":
        err(
            "parameter_server.staleness",
            "staleness only applies to mode async; sync servers wait for every worker. "
            "Set staleness: 0 or mode: async.",
        )
    return errors


def _check_unused_sections(par: ParallelismSpec, err) -> None:
    # A section the chosen strategy never reads is most likely a mistake in the
    # strategy name; ignoring it silently would train something the user did not ask for.
    strategy = par.strategy
    readers = {
        "mesh": ("hybrid",),
        "tensor_degree": ("tensor", "hybrid"),
        "pipeline": ("pipeline", "hybrid"),
        "parameter_server": ("parameter_server",),
    }
    for field, strategies in readers.items():
        given = field in par.model_fields_set and getattr(par, field) is not None
        if given and strategy not in strategies:
            err(
                field,
                f"{field} is only read by strategy {' or '.join(strategies)}, not "
                f"{strategy}. Remove it or change the strategy.",
            )


def _check_mesh(par: ParallelismSpec, num_workers: int, err) -> MeshShape | None:
    """Check the mesh the strategy implies; return it, or None if it cannot be built."""
    strategy = par.strategy
    stages = par.pipeline.stages
    if strategy == "tensor":
        degree = par.tensor_degree or num_workers
        if num_workers % degree:
            err(
                "tensor_degree",
                f"tensor_degree {degree} does not divide the {num_workers} workers; the "
                "workers left over would have no tensor group. Pick a divisor of the "
                "worker count.",
            )
            return None
        return MeshShape(data=num_workers // degree, tensor=degree)
    if strategy == "pipeline":
        stages = stages or num_workers
        if num_workers % stages:
            err(
                "pipeline.stages",
                f"{stages} stages do not divide the {num_workers} workers; each data "
                "replica needs a full pipeline. Pick a divisor of the worker count.",
            )
            return None
        return MeshShape(data=num_workers // stages, pipeline=stages)
    if strategy != "hybrid":
        return MeshShape(data=num_workers)

    mesh = par.mesh
    if mesh is None:
        err("mesh", "strategy hybrid needs a mesh, e.g. mesh: {data: 2, tensor: 2}.")
        return None
    ok = True
    if mesh.size != num_workers:
        err(
            "mesh",
            f"mesh data x pipeline x tensor = {mesh.data} x {mesh.pipeline} x "
            f"{mesh.tensor} = {mesh.size} workers, but the job has {num_workers}. "
            "Change the mesh or the number of workers so they match.",
        )
        ok = False
    if mesh.pipeline > 1 and mesh.tensor > 1:
        err(
            "mesh",
            "pipeline and tensor parallelism together (3-D) are not supported; set mesh.pipeline or mesh.tensor to 1.",
        )
        ok = False
    if stages is not None and stages != mesh.pipeline:
        err(
            "pipeline.stages",
            f"pipeline.stages ({stages}) must equal mesh.pipeline ({mesh.pipeline}) or be left out.",
        )
        ok = False
    if par.tensor_degree is not None and par.tensor_degree != mesh.tensor:
        err(
            "tensor_degree",
            f"tensor_degree ({par.tensor_degree}) must equal mesh.tensor ({mesh.tensor}) or be left out.",
        )
        ok = False
    return mesh if ok else None


def _check_model_fits(par: ParallelismSpec, shape: MeshShape, n_layers: int | None, n_heads: int | None, err) -> None:
    stages_path = "mesh.pipeline" if par.strategy == "hybrid" else "pipeline.stages"
    tensor_path = "mesh.tensor" if par.strategy == "hybrid" else "tensor_degree"
    if n_layers is not None and shape.pipeline > n_layers:
        err(
            stages_path,
            f"{shape.pipeline} pipeline stages but the model has {n_layers} layers; every "
            "stage needs at least one layer. Use fewer stages or a deeper model.",
        )
    if n_heads is not None and n_heads % shape.tensor:
        err(
            tensor_path,
            f"tensor parallelism over {shape.tensor} workers splits attention heads "
            f"between them, but {n_heads} heads do not divide by {shape.tensor}. Pick a "
            "tensor size that divides the head count, or change the model's heads.",
        )


def _check_pipeline(par: ParallelismSpec, shape: MeshShape, err) -> None:
    opts = par.pipeline
    if opts.schedule == "1f1b" and opts.microbatches < shape.pipeline:
        err(
            "pipeline.microbatches",
            f"schedule 1f1b needs at least as many microbatches as stages "
            f"({opts.microbatches} < {shape.pipeline}). Raise microbatches or use "
            "schedule gpipe.",
        )
    if par.grad_accumulation_steps != 1:
        err(
            "grad_accumulation_steps",
            "a pipeline already accumulates gradients over its microbatches. Set "
            "grad_accumulation_steps: 1 and raise pipeline.microbatches instead.",
        )
