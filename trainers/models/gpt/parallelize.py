"""How the parallelism strategies split the GPT: its tensor plan and its pipeline stages.

Beside the model, not in ``trainers.parallel``, which applies plans and names no model
(torchtitan keeps ``parallelize_llama`` with Llama for the same reason).

- tensor (Megatron-style pairing): ``attn.q``, ``attn.k``, ``attn.v`` and ``mlp.fc`` are
  ``ColwiseParallel`` (each worker computes its own heads / its own slice of the hidden
  layer from the full input); ``attn.proj`` and ``mlp.proj`` are ``RowwiseParallel`` (one
  all-reduce sums the partial results back into the replicated residual stream).
  Embeddings, layer norms and the head stay replicated.
- pipeline: stage ``s`` of ``S`` keeps a contiguous run of blocks (earlier stages take
  the remainder, since the last stage also runs the head); stage 0 also keeps the
  embeddings, the last stage the final norm and head.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from trainers.models.gpt.model import GPT
from trainers.parallel.plan import ModelPlan, register_plan


def gpt_tensor_plan(model: nn.Module) -> dict[str, ColwiseParallel | RowwiseParallel]:
    """The sharding plan for the GPT's blocks, by parameter-path."""
    plan: dict[str, ColwiseParallel | RowwiseParallel] = {}
    for name in model.blocks:
        prefix = f"blocks.{name}"
        for proj in ("q", "k", "v"):
            plan[f"{prefix}.attn.{proj}"] = ColwiseParallel()
        plan[f"{prefix}.attn.proj"] = RowwiseParallel()
        plan[f"{prefix}.mlp.fc"] = ColwiseParallel()
        plan[f"{prefix}.mlp.proj"] = RowwiseParallel()
    return plan


def split_gpt_for_stage(model: nn.Module, stage_index: int, num_stages: int) -> nn.Module:
    """Drop, in place, every part of a GPT that this stage does not run."""
    names = list(model.blocks.keys())
    if len(names) < num_stages:
        raise ValueError(
            f"{num_stages} pipeline stages but the model has {len(names)} blocks; lower parallelism.pipeline.stages"
        )
    per_stage, extra = divmod(len(names), num_stages)
    start = stage_index * per_stage + min(stage_index, extra)
    stop = start + per_stage + (1 if stage_index < extra else 0)
    for name in names[:start] + names[stop:]:
        del model.blocks[name]
    if stage_index != 0:
        model.tok_emb = None
        model.pos_emb = None
    if stage_index != num_stages - 1:
        model.ln_f = None
        model.lm_head = None
    return model


GPT_PLAN = ModelPlan(tensor=gpt_tensor_plan, pipeline=split_gpt_for_stage)
register_plan(GPT, GPT_PLAN)
