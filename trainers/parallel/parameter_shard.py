"""The server side of parameter-server training: one :class:`ParameterShard` actor per
partition of the parameters, with its own optimizer and the update rule.

- ``sync``: a shard sums the gradients of all workers for a round, takes one optimizer
  step on their mean, and only then answers the pushes.
- ``async``: a shard applies each gradient as it arrives (one optimizer step each);
  a worker's push returns only once the slowest worker is at most ``staleness`` steps
  behind it (stale-synchronous parallel). The shard records how far ahead any pushing
  worker was (``max_ahead``) and how many updates old each gradient's weights were
  (``max_grad_staleness``).

The worker side is ``trainers.parallel.parameter_server``.
"""

from __future__ import annotations

import asyncio

import ray
import torch
from torch import nn

from trainers.parallel.base import OptimizerFactory


@ray.remote(num_cpus=0)
class ParameterShard:
    """One partition of the parameters, its optimizer, and the update rule (async actor)."""

    def __init__(
        self,
        params: dict[str, torch.Tensor],
        optimizer_factory: OptimizerFactory,
        num_workers: int,
        mode: str,
        staleness: int,
    ):
        self.names = list(params)
        self.params = [nn.Parameter(t.detach().clone()) for t in params.values()]
        self.optimizer = optimizer_factory(self.params)
        self.num_workers, self.mode, self.staleness = num_workers, mode, staleness
        self.version = 0  # optimizer steps taken
        self.clocks = [0] * num_workers  # gradients pushed by each worker
        self.round_sum: list[torch.Tensor] | None = None
        self.round_count = 0
        self.max_ahead = 0
        self.max_grad_staleness = 0
        self.changed = asyncio.Condition()

    def _apply(self, grads: list[torch.Tensor]) -> None:
        for p, g in zip(self.params, grads):
            p.grad = g
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1

    async def push(self, worker: int, grads: list[torch.Tensor], base_version: int) -> int:
        """Take a worker's gradient (computed on weights ``base_version``); return the version."""
        async with self.changed:
            self.max_ahead = max(self.max_ahead, self.clocks[worker] - min(self.clocks))
            self.clocks[worker] += 1
            if self.mode == "sync":
                if self.round_sum is None:
                    self.round_sum = [g.clone() for g in grads]
                else:
                    for acc, g in zip(self.round_sum, grads):
                        acc += g
                self.round_count += 1
                if self.round_count == self.num_workers:
                    self._apply([acc / self.num_workers for acc in self.round_sum])
                    self.round_sum, self.round_count = None, 0
                    self.changed.notify_all()
                else:
                    await self.changed.wait_for(lambda: self.version > base_version)
                return self.version
            self.max_grad_staleness = max(self.max_grad_staleness, self.version - base_version)
            # Each worker's gradient is an estimate of the same mean gradient the sync
            # mode averages; scaling by 1/N keeps an update per round of the same size.
            self._apply([g / self.num_workers for g in grads])
            self.changed.notify_all()
            mine = self.clocks[worker]
            # Stale-synchronous: run at most `staleness` steps ahead of the slowest worker.
            await self.changed.wait_for(lambda: mine - min(self.clocks) <= self.staleness)
            return self.version

    def pull(self) -> tuple[int, list[torch.Tensor]]:
        return self.version, [p.detach().clone() for p in self.params]

    def stats(self) -> dict[str, int]:
        return {
            "version": self.version,
            "max_ahead": self.max_ahead,
            "max_grad_staleness": self.max_grad_staleness,
            "lr": self.optimizer.param_groups[0]["lr"],
        }

    def hyperparameters(self) -> list[dict]:
        """The optimizer's param groups without their parameters (lr, weight decay, ...)."""
        return [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]

    def set_hyperparameters(self, groups: list[dict]) -> None:
        """New values for the optimizer's groups (a schedule's lr), from the next step on."""
        for group, values in zip(self.optimizer.param_groups, groups):
            group.update({k: v for k, v in values.items() if k != "params" and k in group})

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Overwrite the weights (optimizer state stays as it is)."""
        with torch.no_grad():
            for n, p in zip(self.names, self.params):
                p.copy_(weights[n])

    def get_state(self) -> dict[str, torch.Tensor]:
        """Weights and optimizer state, keyed by parameter name."""
        if not self.optimizer.state:
            self._materialise_optimizer_state()
        state = {f"model.{n}": p.detach().clone() for n, p in zip(self.names, self.params)}
        for n, p in zip(self.names, self.params):
            for key, value in self.optimizer.state[p].items():
                if value is not None:  # e.g. SGD without momentum keeps no buffer
                    state[f"optimizer.{n}.{key}"] = torch.as_tensor(value).clone()
        return state

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        self._materialise_optimizer_state()
        with torch.no_grad():
            for n, p in zip(self.names, self.params):
                p.copy_(state[f"model.{n}"])
                for key, value in list(self.optimizer.state[p].items()):
                    if value is not None:
                        self.optimizer.state[p][key] = state[f"optimizer.{n}.{key}"].clone()

    def _materialise_optimizer_state(self) -> None:
        # A checkpoint is loaded into tensors of the right shape, so a server that has not
        # stepped yet needs its optimizer state to exist: one step with zero gradients
        # and a zero learning rate creates it without moving the weights.
        if self.optimizer.state:
            return
        lrs = [g["lr"] for g in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["lr"] = 0.0
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for g, lr in zip(self.optimizer.param_groups, lrs):
            g["lr"] = lr


def partition(named: list[tuple[str, nn.Parameter]], parts: int) -> list[list[str]]:
    """Parameter names per server, largest first onto the least-loaded server."""
    loads = [0] * parts
    groups: list[list[str]] = [[] for _ in range(parts)]
    for name, p in sorted(named, key=lambda item: -item[1].numel()):
        i = loads.index(min(loads))
        groups[i].append(name)
        loads[i] += p.numel()
    return [g for g in groups if g]
