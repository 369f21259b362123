"""The checks of a job's ``parallelism`` section that need the rest of the job: its
worker count, GPUs, model size and whether it brings its own code.

:func:`validate_parallelism` returns every problem at once as ``(dotted_path, message)``
pairs, so the API answers one 4xx listing all of them.
"""

from __future__ import annotations

from api.schemas.mesh import mesh_problems
from api.schemas.parallelism import CLASSIFIER_ONLY_STRATEGIES, MODEL_AWARE_STRATEGIES, MeshShape, ParallelismSpec


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
    shape, problems = mesh_problems(par, num_workers)
    for path, message in problems:
        err(path, message)
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
