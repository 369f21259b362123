"""What a strategy that splits a model's layers needs to know about that model.

Data parallelism (ddp, fsdp, the parameter server) treats a model as a bag of
parameters. Tensor and pipeline parallelism cut through its layers, so they need a
:class:`ModelPlan`: which linears are split by columns or rows, and which parts a
pipeline stage keeps. The plan lives with the model (the GPT's is
``trainers.models.gpt.parallelize``), as torchtitan keeps ``parallelize_llama`` with
Llama; this package only applies it and never names a model.

A model package registers its plan once (:func:`register_plan`); ``parallelize`` looks
it up by the model's class, or takes one passed as ``plan=``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

TensorPlan = Callable[[nn.Module], dict[str, ParallelStyle]]
StageSplit = Callable[[nn.Module, int, int], nn.Module]


@dataclass(frozen=True)
class ModelPlan:
    """How tensor and pipeline parallelism split one kind of model.

    ``tensor(model)``: ``parallelize_module``'s plan, submodule path -> style.
    ``pipeline(model, stage_index, num_stages)``: drop, in place, every part stage
    ``stage_index`` does not run, keeping the names of what stays (checkpoints line up).
    """

    tensor: TensorPlan | None = None
    pipeline: StageSplit | None = None


_PLANS: dict[type, ModelPlan] = {}


def register_plan(model_type: type, plan: ModelPlan) -> None:
    """Make ``plan`` the plan of ``model_type`` and its subclasses."""
    _PLANS[model_type] = plan


def plan_for(model: nn.Module) -> ModelPlan:
    """The registered plan of ``model``'s class (an empty one when there is none)."""
    for cls in type(model).__mro__:
        if cls in _PLANS:
            return _PLANS[cls]
    return ModelPlan()


def missing_plan(model: nn.Module, strategy: str) -> ValueError:
    return ValueError(
        f"strategy {strategy} splits the model's layers and has no plan for "
        f"{type(model).__name__}: pass parallelize(..., plan=ModelPlan(...)) or use "
        "ddp or fsdp, which need none"
    )
