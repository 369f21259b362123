"""The built-in GPT: the model (``model``) and how the strategies split it (``parallelize``).

Importing this package registers the GPT's plan with ``trainers.parallel``, so
``parallelize(build_gpt(...), mesh, spec, ...)`` finds it for the tensor, pipeline and
hybrid strategies without being told.
"""

from trainers.models.gpt.model import GPT, GPTConfig, build_gpt, lm_loss
from trainers.models.gpt.parallelize import (
    GPT_PLAN,
    gpt_tensor_plan,
    split_gpt_for_stage,
)

__all__ = [
    "GPT",
    "GPT_PLAN",
    "GPTConfig",
    "build_gpt",
    "gpt_tensor_plan",
    "lm_loss",
    "split_gpt_for_stage",
]
