"""Pipeline parallelism: consecutive blocks on consecutive workers.

Stage ``s`` of ``S`` keeps what the model's plan (``ModelPlan.pipeline``, kept with the
model: the GPT's is ``trainers.models.gpt.parallelize``) gives it: a contiguous run of
blocks, the embeddings on the first stage, the head on the last. Everything else is
dropped from the worker's copy of the model, and the names of what is kept do not
change, so checkpoints line up with the plain model's.

Each batch is cut into ``pipeline.microbatches`` microbatches that flow through the
stages under ``torch.distributed.pipelining``'s GPipe or 1F1B schedule, which sends
activations forward and their gradients back between neighbouring stages. The
schedule averages gradients over microbatches, so one step equals one step on the
whole batch. The last stage computes the loss; ``mean_loss`` broadcasts it so every
worker returns the same number.

With a data axis, each stage averages its gradients with the same stage of the other
replicas after the schedule (``bytes_communicated`` counts that). Every worker of one
pipeline must get the same batch. A stage fixes its activation shapes the first time it
runs, so each batch shape (a last partial batch, an evaluation batch) gets its own stage
and schedule, built on first use.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from trainers.parallel.base import ParallelModel, split_batch
from trainers.parallel.plan import missing_plan


class PipelineParallelModel(ParallelModel):
    strategy = "pipeline"

    def _place(self, model: nn.Module) -> nn.Module:
        if self.plan.pipeline is None:
            raise missing_plan(model, "pipeline")
        pp_mesh = self.mesh["pipeline"]
        self.num_stages = pp_mesh.size()
        self.pp_group = pp_mesh.get_group()
        self.stage_index = pp_mesh.get_local_rank()
        self.is_first = self.stage_index == 0
        self.is_last = self.stage_index == self.num_stages - 1
        self._schedules: dict[tuple[int, ...], ScheduleGPipe | Schedule1F1B] = {}
        self.plan.pipeline(model, self.stage_index, self.num_stages)
        return super()._place(model)

    def _schedule_for(self, shape: torch.Size) -> ScheduleGPipe | Schedule1F1B:
        # Every worker of the pipeline sees the same batch, so they all build the stage
        # for a new shape at the same step.
        key = tuple(shape)
        if key not in self._schedules:
            stage = PipelineStage(
                self.module,
                self.stage_index,
                self.num_stages,
                self.device,
                group=self.pp_group,
            )
            schedule_cls = ScheduleGPipe if self.spec.pipeline.schedule == "gpipe" else Schedule1F1B
            self._schedules[key] = schedule_cls(
                stage,
                n_microbatches=self.spec.pipeline.microbatches,
                loss_fn=self.loss_fn,
            )
        return self._schedules[key]

    def local_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The step's loss on the last stage; zero on the others until :meth:`mean_loss`."""
        self.module.train()
        losses = self._run(self._schedule_for(inputs.shape).step, inputs, targets)
        self._apply_grads()
        return self._stage_loss(losses)

    def mean_loss(self, local_loss: torch.Tensor) -> float:
        return self._data_mean(self._from_last_stage(local_loss))

    @torch.no_grad()
    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        self.module.eval()
        try:
            losses = self._run(self._schedule_for(inputs.shape).eval, inputs, targets)
        finally:
            self.module.train()
        return self.mean_loss(self._stage_loss(losses))

    def _run(self, schedule_fn: Callable, inputs: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
        split_batch(inputs, self.spec.pipeline.microbatches, "pipeline.microbatches")
        # Only the first stage reads the tokens and only the last the targets; the
        # schedule cuts both into microbatches itself.
        args = (inputs.to(self.device),) if self.is_first else ()
        target = targets.to(self.device) if self.is_last else None
        losses: list[torch.Tensor] = []
        # Backward runs inside the schedule, so it sits in the autocast context too;
        # autocast only affects forward ops, backward reuses their recorded dtypes.
        with self.autocast():
            schedule_fn(
                *args,
                target=target,
                losses=losses if self.is_last else None,
                return_outputs=False,
            )
        return losses

    def _stage_loss(self, losses: list[torch.Tensor]) -> torch.Tensor:
        if self.is_last:
            return torch.stack(losses).detach().float().mean()
        return torch.zeros((), device=self.device)

    def _from_last_stage(self, loss: torch.Tensor) -> torch.Tensor:
        loss = loss.clone()
        dist.broadcast(loss, group=self.pp_group, group_src=self.num_stages - 1)
        return loss

    def full_model_state_dict(self) -> dict[str, torch.Tensor]:
        local = {k: v.detach().cpu() for k, v in self.module.state_dict().items()}
        parts: list | None = [None] * self.num_stages if self.is_first else None
        dist.gather_object(local, parts, group=self.pp_group, group_dst=0)
        if dist.get_rank() != 0:
            return {}
        merged: dict[str, torch.Tensor] = {}
        for part in parts:
            merged.update(part)
        return merged

    def load_full_model_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        own = self.module.state_dict().keys()
        self.module.load_state_dict({k: sd[k] for k in own})
