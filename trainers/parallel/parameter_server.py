"""Parameter-server training: Ray actors hold the parameters, workers push gradients.

The parameters are partitioned over ``parallelism.parameter_server.num_servers``
:class:`ParameterShard` actors (greedily by size), each with its own optimizer for its
part. Every worker keeps a full copy of the model to compute with; each step it pushes
its gradient to every server and pulls fresh weights when its copy is too old:

- ``sync``: a server sums the gradients of all workers for a round, takes one optimizer
  step on their mean, and only then answers the pushes; every worker pulls after every
  step. One step equals one data-parallel step on the global batch.
- ``async``: a server applies each gradient as it arrives (one optimizer step each),
  so a fast worker does not wait for the slow ones, within two bounds set by
  ``staleness`` (s): a worker's push returns only once the slowest worker is at most s
  steps behind it (stale-synchronous parallel), and a worker pulls fresh weights
  whenever the servers are more than s updates ahead of its copy (s = 0: every step).
  The servers record how far ahead any pushing worker was (``max_ahead``, at most s)
  and how many updates old each gradient's weights were (``max_grad_staleness``).

The worker-side object is a :class:`ParameterServerModel`, a ``ParallelModel`` like the
others, except that a training step runs no collective (so async workers really run
apart) and its loss is this worker's own. Call :meth:`ParameterServerModel.refresh`
before evaluating or saving: it waits for every worker and pulls the latest weights,
so all workers hold the same model. Checkpoints hold the servers' weights and
optimizer state, identical on every worker (DCP writes them once).

Worker rank 0 creates the servers (named after a random id it broadcasts to the other
workers); they live as long as it does, so a restarted worker group starts new ones and
reloads them from the checkpoint. Servers reserve no CPU: they sit idle between pushes.
"""

from __future__ import annotations

import asyncio
import uuid

import ray
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from api.schemas import ParallelismSpec
from trainers.parallel.base import LossFn, OptimizerFactory, ParallelModel, split_batch


@ray.remote(num_cpus=0)
class ParameterShard:
    """One partition of the parameters, its optimizer, and the update rule (async actor)."""

    def __init__(self, params: dict[str, torch.Tensor], optimizer_factory: OptimizerFactory, num_workers: int, mode: str, staleness: int):
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
        return {"version": self.version, "max_ahead": self.max_ahead, "max_grad_staleness": self.max_grad_staleness}

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


class ParameterServerModel(ParallelModel):
    strategy = "parameter_server"

    def __init__(
        self,
        model: nn.Module,
        mesh: DeviceMesh,
        spec: ParallelismSpec,
        optimizer_factory: OptimizerFactory,
        loss_fn: LossFn,
    ):
        # The optimizer lives on the servers; the base class's local one is never stepped.
        super().__init__(model, mesh, spec, optimizer_factory, loss_fn)
        opts = spec.parameter_server
        self.mode, self.staleness = opts.mode, opts.staleness
        named = list(self.module.named_parameters())
        self.params = dict(named)
        self.groups = partition(named, opts.num_servers)
        self.servers = self._start_servers(optimizer_factory)
        self.versions = [-1] * len(self.servers)  # of this worker's copy, per server
        self.pull_all()

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
                grads.append(p.grad.detach().cpu() if p.grad is not None else torch.zeros_like(p, device="cpu"))
            self.comm.bytes += sum(g.nbytes for g in grads)
            refs.append(self.servers[i].push.remote(self.data_rank, grads, self.versions[i]))
        return ray.get(refs)

    # -- the training step ----------------------------------------------------------

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """One step on this worker's batch; returns this worker's loss (no collective)."""
        return self.local_step(inputs, targets).item()

    def local_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        k = self.spec.grad_accumulation_steps
        xs = split_batch(inputs.to(self.device), k, "grad_accumulation_steps")
        ys = split_batch(targets.to(self.device), k, "grad_accumulation_steps")
        self.module.train()
        loss_sum = torch.zeros((), device=self.device)
        for x, y in zip(xs, ys):
            with self.autocast():
                loss = self.loss_fn(self.module(x), y) / k
            loss.backward()
            loss_sum += loss.detach()
        server_versions = self._push()
        self.module.zero_grad(set_to_none=True)
        self.step += 1
        # Sync servers have just stepped, so every copy is one update behind.
        stale = [i for i, v in enumerate(server_versions) if v - self.versions[i] > self.staleness]
        self._pull(stale)
        return loss_sum

    def refresh(self) -> None:
        """Wait for every worker's pushes, then pull: all workers now hold the same weights."""
        dist.barrier()
        self.pull_all()

    def server_stats(self) -> dict[str, int]:
        stats = ray.get([s.stats.remote() for s in self.servers])
        return {
            "server_version": min(s["version"] for s in stats),
            "max_ahead": max(s["max_ahead"] for s in stats),
            "max_grad_staleness": max(s["max_grad_staleness"] for s in stats),
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
        raise NotImplementedError("load a parameter-server model from a checkpoint (trainers.checkpoint.restore) instead")


def parallelize_parameter_server(
    model: nn.Module,
    mesh: DeviceMesh,
    spec: ParallelismSpec,
    optimizer_factory: OptimizerFactory,
    loss_fn: LossFn,
) -> ParallelModel:
    if mesh["pipeline"].size() > 1 or mesh["tensor"].size() > 1:
        raise ValueError("strategy parameter_server uses a data axis only")
    if not ray.is_initialized():
        raise RuntimeError("strategy parameter_server runs its servers as Ray actors: call it inside a Ray worker")
    return ParameterServerModel(model, mesh, spec, optimizer_factory, loss_fn)
