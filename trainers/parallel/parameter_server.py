"""Parameter-server training: Ray actors hold the parameters, workers push gradients.

The parameters are partitioned over ``parallelism.parameter_server.num_servers``
``ParameterShard`` actors (greedily by size; ``trainers.parallel.parameter_shard``),
each with its own optimizer for its part. Every worker keeps a full copy of the model
to compute with; each step it pushes its gradient to every server and pulls fresh
weights when its copy is too old:

- ``sync``: a server steps once per round on the mean of every worker's gradient, so
  every copy is one update behind after each step and every worker pulls: one step
  equals one data-parallel step on the global batch.
- ``async``: a server applies each gradient as it arrives, so a fast worker does not
  wait for the slow ones, within ``staleness`` (s): a push returns once the slowest
  worker is at most s steps behind, and a worker pulls whenever the servers are more
  than s updates ahead of its copy (s = 0: every step).

The worker-side object is a :class:`ParameterServerModel`, a ``ParallelModel`` like the
others: its placement starts the servers, its gradient step pushes and pulls instead
of synchronising and stepping locally (``local_step`` runs no collective, so async
workers really run apart), and its evaluation hook (``before_evaluate``) waits for every
worker and pulls the latest weights, so all workers evaluate the same model, and
returns the servers' figures (``server_version``, ``max_ahead``,
``max_grad_staleness``). Checkpoints hold the servers' weights and optimizer state,
identical on every worker (DCP writes them once).

Worker rank 0 creates the servers (named after a random id it broadcasts to the other
workers); they live as long as it does, so a restarted worker group starts new ones and
reloads them from the checkpoint. Servers reserve no CPU: they sit idle between pushes.
"""

from __future__ import annotations

import uuid
from typing import Any

import ray
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from api.schemas import ParallelismSpec
from trainers.parallel.base import LossFn, OptimizerFactory, ParallelModel
from trainers.parallel.parameter_shard import ParameterShard, partition
from trainers.parallel.plan import ModelPlan


class ServerOptimizer:
    """The servers' optimizers as a training loop sees them: ``param_groups`` holds their
    hyperparameters (what a loop reports as ``lr``), and ``state`` is empty, since this
    worker holds no optimizer state. Values a loop sets here (a schedule's lr) reach the
    servers before this worker's next push (``ParameterServerModel._apply_grads``)."""

    def __init__(self, param_groups: list[dict]):
        self.param_groups = param_groups
        self.state: dict = {}
        self._sent = [dict(g) for g in param_groups]

    def changed(self) -> list[dict] | None:
        """The groups' values when they differ from those last handed to the servers."""
        now = [dict(g) for g in self.param_groups]
        if now == self._sent:
            return None
        self._sent = now
        return now


class ParameterServerModel(ParallelModel):
    strategy = "parameter_server"

    def _place(self, model: nn.Module) -> nn.Module:
        # The servers' weights (rank 0's, see _build_optimizer) overwrite every copy,
        # so there is nothing to broadcast here.
        opts = self.spec.parameter_server
        self.mode, self.staleness = opts.mode, opts.staleness
        named = list(model.named_parameters())
        self.params = dict(named)
        self.groups = partition(named, opts.num_servers)
        return model

    def _build_optimizer(self, optimizer_factory: OptimizerFactory) -> ServerOptimizer:
        # The optimizer lives on the servers, built there by the same factory.
        self.servers = self._start_servers(optimizer_factory)
        self.versions = [-1] * len(self.servers)  # of this worker's copy, per server
        self.pull_all()
        return ServerOptimizer(ray.get(self.servers[0].hyperparameters.remote()))

    def _start_servers(self, optimizer_factory: OptimizerFactory) -> list:
        ids = [uuid.uuid4().hex[:12] if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(ids, src=0)
        names = [f"raydock-ps-{ids[0]}-{i}" for i in range(len(self.groups))]
        if dist.get_rank() == 0:
            servers = [
                ParameterShard.options(name=name).remote(
                    {n: self.params[n].detach().cpu() for n in group},
                    optimizer_factory,
                    self.data_world_size,
                    self.mode,
                    self.staleness,
                )
                for name, group in zip(names, self.groups)
            ]
            ray.get([s.stats.remote() for s in servers])  # up before anyone looks them up
        dist.barrier()
        if dist.get_rank() != 0:
            servers = [ray.get_actor(name) for name in names]
        return servers

    # -- pulling and pushing --------------------------------------------------------

    def _pull(self, indices: list[int]) -> None:
        if not indices:
            return
        replies = ray.get([self.servers[i].pull.remote() for i in indices])
        with torch.no_grad():
            for i, (version, tensors) in zip(indices, replies):
                for name, t in zip(self.groups[i], tensors):
                    self.params[name].copy_(t)
                    self.comm.bytes += t.nbytes
                self.versions[i] = version

    def pull_all(self) -> None:
        self._pull(list(range(len(self.servers))))

    def _push(self) -> list[int]:
        refs = []
        for i, group in enumerate(self.groups):
            grads = []
            for name in group:
                p = self.params[name]
                if p.grad is None:
                    grads.append(torch.zeros_like(p, device="cpu"))
                else:
                    grads.append(p.grad.detach().cpu())
            self.comm.bytes += sum(g.nbytes for g in grads)
            refs.append(self.servers[i].push.remote(self.data_rank, grads, self.versions[i]))
        return ray.get(refs)

    # -- the training step ----------------------------------------------------------

    def _apply_grads(self) -> None:
        """Push this worker's gradient to the servers; pull the parts that are too old.
        Changed hyperparameters (every worker applies the same schedule) go first, from
        rank 0, and are in place on every server before its push."""
        if (groups := self.optimizer.changed()) is not None and dist.get_rank() == 0:
            ray.get([s.set_hyperparameters.remote(groups) for s in self.servers])
        server_versions = self._push()
        self.module.zero_grad(set_to_none=True)
        self.step += 1
        # Sync servers have just stepped, so every copy is one update behind.
        stale = [i for i, v in enumerate(server_versions) if v - self.versions[i] > self.staleness]
        self._pull(stale)

    def before_evaluate(self) -> dict[str, Any]:
        """Every worker evaluates the servers' latest weights; report the servers' figures."""
        self.refresh()
        return self.server_stats()

    def refresh(self) -> None:
        """Wait for every worker's pushes, then pull: all workers now hold the same weights."""
        dist.barrier()
        self.pull_all()

    def server_stats(self) -> dict[str, float]:
        stats = ray.get([s.stats.remote() for s in self.servers])
        return {
            "server_version": min(s["version"] for s in stats),
            "max_ahead": max(s["max_ahead"] for s in stats),
            "max_grad_staleness": max(s["max_grad_staleness"] for s in stats),
            "server_lr": max(s["lr"] for s in stats),  # what the servers step with (one value while all agree)
        }

    # -- checkpoints ----------------------------------------------------------------

    def state_dict(self) -> dict:
        self.refresh()
        state: dict = {}
        for part in ray.get([s.get_state.remote() for s in self.servers]):
            state.update(part)
        model = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
        optim = {k.removeprefix("optimizer."): v for k, v in state.items() if k.startswith("optimizer.")}
        return {"model": model, "optimizer": optim, "step": self.step}

    def load_state_dict(self, sd: dict) -> None:
        # Every worker loaded the same values; one of them hands them to the servers.
        if dist.get_rank() == 0:
            calls = []
            for server, group in zip(self.servers, self.groups):
                part = {f"model.{n}": sd["model"][n] for n in group}
                prefixes = tuple(f"{n}." for n in group)
                part.update({f"optimizer.{k}": v for k, v in sd["optimizer"].items() if k.startswith(prefixes)})
                calls.append(server.set_state.remote(part))
            ray.get(calls)
        self.step = int(sd["step"])
        self.refresh()

    def full_model_state_dict(self) -> dict[str, torch.Tensor]:
        self.refresh()
        if dist.get_rank() != 0:
            return {}
        return {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()}

    def load_full_model_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Hand plain weights to the servers (their optimizer state stays); every worker
        passes the same ones and then holds them."""
        if dist.get_rank() == 0:
            ray.get(
                [
                    server.set_weights.remote({n: sd[n].detach().cpu() for n in group})
                    for server, group in zip(self.servers, self.groups)
                ]
            )
        self.refresh()


def parallelize_parameter_server(
    model: nn.Module,
    mesh: DeviceMesh,
    spec: ParallelismSpec,
    optimizer_factory: OptimizerFactory,
    loss_fn: LossFn,
    plan: ModelPlan | None = None,
) -> ParallelModel:
    if mesh["pipeline"].size() > 1 or mesh["tensor"].size() > 1:
        raise ValueError("strategy parameter_server uses a data axis only")
    if not ray.is_initialized():
        raise RuntimeError("strategy parameter_server runs its servers as Ray actors: call it inside a Ray worker")
    return ParameterServerModel(model, mesh, spec, optimizer_factory, loss_fn, plan)
