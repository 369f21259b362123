"""Whether a job's workers can ever be placed on the cluster, resource by resource: each
worker's whole bundle (CPUs, GPUs, memory, custom resources, its accelerator type) on one
node, the placement strategy's shape, and the memory and custom resources in total,
counting the nodes its autoscaler can add. ``service.scheduling.admission`` counts CPUs and GPUs in
total; this names what no node has ("no node has accelerator type A100"). Pure functions
over the cluster as Ray reports it.
"""

from __future__ import annotations

from api.errors import CapacityExceeded
from api.schemas import ClusterInfo, JobSpec
from api.schemas.scaling import ACCELERATOR_PREFIX, ScalingSpec

EPS = 1e-9
UNBOUNDED = float("inf")
ACCELERATOR_MARK = 0.001  # what Ray's accelerator_type asks of a node per worker: that it has the type


def _field(name: str, where: str) -> str:
    if name.startswith(ACCELERATOR_PREFIX):
        return f"{where}.accelerator_type"
    fields = {"CPU": "cpus_per_worker", "GPU": "gpus_per_worker", "memory": "memory_per_worker"}
    return f"{where}.{fields[name]}" if name in fields else f"{where}.resources_per_worker.{name}"


def _words(name: str, amount: float) -> str:
    if name.startswith(ACCELERATOR_PREFIX):
        return f"accelerator type {name.removeprefix(ACCELERATOR_PREFIX)}"
    if name == "memory":
        return f"{amount / 2**30:g} GiB of memory"
    return f"{amount:g} {name}"


def bundle(s: ScalingSpec) -> dict[str, float]:
    """What one worker asks of the node it runs on."""
    out = s.worker_resources()
    if s.accelerator_type is not None:
        out[ACCELERATOR_PREFIX + s.accelerator_type] = ACCELERATOR_MARK
    return out


def nodes(info: ClusterInfo) -> list[tuple[dict[str, float], float]]:
    """(resources of one node, how many such nodes the cluster has or can add): the alive
    nodes, then each autoscaler node type with room (unbounded when its limit is unknown).
    A node type whose resources the autoscaler does not say is left out."""
    out: list[tuple[dict[str, float], float]] = [
        (n.resources or {"CPU": n.cpus, "GPU": n.gpus}, 1.0) for n in info.nodes if n.alive
    ]
    for t in info.autoscaler.node_types if info.autoscaler else []:
        room = UNBOUNDED if t.max_workers is None else max(0, t.max_workers - t.running)
        if t.resources and room > 0:
            out.append((t.resources, room))
    return out


def _fits(node: dict[str, float], need: dict[str, float], times: float = 1.0) -> bool:
    return all(node.get(k, 0.0) + EPS >= v * times for k, v in need.items())


def refusal(spec: JobSpec, info: ClusterInfo) -> CapacityExceeded | None:
    """Why the job's workers can never be placed on this cluster; None when they can
    (or when the cluster does not say enough to tell)."""
    if spec.kind == "tune":
        s, where, workers = spec.base.scaling, "base.scaling", spec.trial_workers
    else:
        s, where, workers = spec.scaling, "scaling", spec.scaling.min_workers
    need, offered = bundle(s), nodes(info)
    if not offered:
        return None
    if not any(_fits(node, need) for node, _ in offered):
        return _no_node(need, offered, where)
    if s.placement_strategy == "STRICT_PACK" and not any(_fits(node, need, workers) for node, _ in offered):
        return _refuse(
            f"placement_strategy STRICT_PACK puts all {workers} workers on one node, and no node of the cluster "
            f"(nor any its autoscaler can add) holds {workers} x {_bundle_words(need)}. Use PACK, or fewer or "
            "smaller workers.",
            f"{where}.placement_strategy",
        )
    if s.placement_strategy == "STRICT_SPREAD":
        fitting = sum(count for node, count in offered if _fits(node, need))
        if fitting < workers:
            return _refuse(
                f"placement_strategy STRICT_SPREAD puts each of the {workers} workers on a node of its own, and the "
                f"cluster has (or can add) {fitting:g} nodes that hold {_bundle_words(need)}. Use SPREAD or PACK, "
                "or fewer workers.",
                f"{where}.placement_strategy",
            )
    for name, each in need.items():  # CPUs and GPUs in total are admission's (service/scheduling/admission.py)
        if name in ("CPU", "GPU") or name.startswith(ACCELERATOR_PREFIX):
            continue
        total = sum(node.get(name, 0.0) * count for node, count in offered if node.get(name, 0.0) > 0)
        if total + EPS < each * workers:
            return _refuse(
                f"The job's {workers} workers need {_words(name, each * workers)} in all ({_words(name, each)} each) "
                f"but the cluster has {_words(name, total)}, counting what its autoscaler can add. Lower "
                f"{_field(name, where)} or the number of workers, or add nodes.",
                _field(name, where),
            )
    return None


def _bundle_words(need: dict[str, float]) -> str:
    return " + ".join(_words(k, v) for k, v in need.items() if not k.startswith(ACCELERATOR_PREFIX)) + (
        "".join(f" on {_words(k, v)}" for k, v in need.items() if k.startswith(ACCELERATOR_PREFIX))
    )


def _no_node(need: dict[str, float], offered: list[tuple[dict[str, float], float]], where: str) -> CapacityExceeded:
    lacking = [k for k, v in need.items() if max(node.get(k, 0.0) for node, _ in offered) + EPS < v]
    lacking.sort(key=lambda k: not k.startswith(ACCELERATOR_PREFIX))  # the type asked for says most
    if lacking:
        name = lacking[0]
        most = max(node.get(name, 0.0) for node, _ in offered)
        if name.startswith(ACCELERATOR_PREFIX):
            types = sorted(
                {
                    k.removeprefix(ACCELERATOR_PREFIX)
                    for node, _ in offered
                    for k in node
                    if k.startswith(ACCELERATOR_PREFIX)
                }
            )
            has = f"the accelerator types it has: {', '.join(types)}" if types else "it has no accelerator types"
            message = (
                f"No node of the cluster, nor any node type its autoscaler can add, has "
                f"{_words(name, need[name])} ({has}). Ask for one it has, or drop scaling.accelerator_type."
            )
        elif most <= 0:
            message = (
                f"Each worker needs {_words(name, need[name])}, and no node of the cluster (nor any its autoscaler "
                f"can add) has any {name}. Drop {_field(name, where)}, or run on a cluster that has it."
            )
        else:
            message = (
                f"Each worker needs {_words(name, need[name])}, and no node of the cluster (nor any its autoscaler "
                f"can add) has that much: the most one node has is {_words(name, most)}. Lower {_field(name, where)}."
            )
        return _refuse(message, _field(name, where))
    return _refuse(
        f"Each worker needs {_bundle_words(need)} on one node, and no node of the cluster (nor any its autoscaler can "
        "add) has all of it at once. Ask for less per worker.",
        where,
    )


def _refuse(message: str, path: str) -> CapacityExceeded:
    return CapacityExceeded(message, details=[{"loc": path.split("."), "msg": "can never be placed"}])


def one_node_holds(s: ScalingSpec, info: ClusterInfo) -> dict[str, float] | None:
    """Every worker's bundle together, when one node of the cluster (alive, or of a type
    its autoscaler can add) holds them all; None otherwise. What a job's driver asks as
    its entrypoint resources when it runs the workers as its own local ranks."""
    total = {name: amount * s.min_workers for name, amount in bundle(s).items()}
    if s.accelerator_type is not None:  # the node must have the type; the GPUs are counted as GPU
        total[ACCELERATOR_PREFIX + s.accelerator_type] = ACCELERATOR_MARK
    return total if any(_fits(node, total) for node, _ in nodes(info)) else None
