"""Which training jobs the single-node rank runner serves, decided from the spec alone.

The rank runner (``trainers.ranks``) runs a job's workers as processes forked from its
Ray job driver on the driver's node, each under Ray Train's local mode with torchrun's
environment, instead of a Train controller actor and one worker actor per rank. The
driver holds the workers' resources as the Ray job's entrypoint resources, so Ray's
accounting is the same as for worker actors.

The server decides (``service.attempts``), with this function and with whether one node
of the cluster can hold every worker; the driver reads the decision from its launch
file and never decides again, so a job runs locally only when its entrypoint holds the
resources. Everything the runner does not serve keeps the ``TorchTrainer`` path.
"""

from __future__ import annotations

from api.schemas import TabularData, TrainSpec

# Strategies that need nothing but torch.distributed between the ranks. The parameter
# server keeps its shards in Ray actors, which belong with Ray Train's worker group.
LOCAL_STRATEGIES = frozenset({"ddp", "fsdp", "tensor", "pipeline", "hybrid"})


def cold_reason(spec: TrainSpec) -> str | None:
    """Why ``spec`` runs on Ray Train's worker actors rather than as forked local ranks;
    None when the rank runner serves it (the node fit is the server's to check).

    - an elastic job (``num_workers: {min, max}``): Ray Train resizes its worker group;
    - Ray Data (a tabular ``data`` table or ``datasets``): shards come from Ray Data's
      coordinator, which local mode has only for one worker;
    - ``placement_strategy`` SPREAD or STRICT_SPREAD: the workers are to be on several nodes;
    - custom ``resources_per_worker``: a loop may ask Ray what its worker was assigned;
    - GPUs other than one per worker: rank ``i`` uses local device ``i``;
    - a strategy that needs Ray actors (``parameter_server``);
    - the job says so (``scaling.local_ranks: false``): its code calls Ray's core API, which a
      forked rank, no Ray worker, refuses (``trainers.ray_compat.refuse_ray_calls``).

    A search trial never gets here: its trials run their own ``TorchTrainer``.
    """
    s = spec.scaling
    if not s.local_ranks:
        return "the job sets scaling.local_ranks false: its workers are Ray workers"
    if s.is_elastic:
        return "an elastic job resizes its Ray Train worker group"
    if isinstance(spec.data, TabularData) or spec.datasets:
        return "Ray Data datasets are sharded by Ray Train's worker group"
    if s.placement_strategy in ("SPREAD", "STRICT_SPREAD"):
        return f"placement_strategy {s.placement_strategy} spreads the workers over nodes"
    if s.resources_per_worker:
        return "custom resources are assigned per Ray Train worker"
    if s.use_gpu and s.gpus != 1.0:
        return "the local ranks take one GPU each"
    if spec.parallelism.strategy not in LOCAL_STRATEGIES:
        return f"strategy {spec.parallelism.strategy} uses Ray actors"
    return None
