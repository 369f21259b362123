"""How far an elastic job may grow: its ``scaling.num_workers.max`` clamped, as it is
admitted, to what the cluster could ever hold and to the room its project's quota leaves.

Ray Train sizes an elastic run from the cluster's total resources, not from what other
runs leave free, and grows it to its max whenever it can: left unclamped, a range of
1..4096 in a project with ``max_cpus: 2`` would hold the whole cluster. The grant is what
the attempt's driver hands Ray Train as its max, and what admission, the quota, the
guarantee (``borrowed``), preemption and usage count the job as holding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from service.scheduling.fair_share import ProjectLoad

EPS = 1e-9
Extra = dict[str, float]  # resources beyond CPUs and GPUs, by Ray resource name


@dataclass(frozen=True)
class Ceiling:
    """The most the cluster could ever hold: its alive nodes and what its autoscaler can add
    (``admission.max_capacity``, and ``admission.extra_free`` with nothing held)."""

    cpus: float
    gpus: float
    extra: Extra = field(default_factory=dict)


def grant(
    workers: tuple[int, int],
    at_min: tuple[float, float, Extra],
    load: ProjectLoad | None,
    ceiling: Ceiling | None,
) -> int:
    """The most workers an elastic job of (min, max) ``workers``, needing ``at_min`` (CPUs,
    GPUs, beyond) with its min, may grow to in the attempt starting now: its max, clamped to
    ``ceiling`` and to the room its project's quota (max_cpus, max_gpus) leaves beside what
    the project holds; never below its min, which admission checked against both."""
    lo, hi = workers
    cpus, gpus, extra = at_min
    limits: list[tuple[float, float]] = []  # (room, what the job's min takes of it)
    if ceiling is not None:
        limits += [(ceiling.cpus, cpus), (ceiling.gpus, gpus)]
        limits += [(ceiling.extra.get(k, 0.0), v) for k, v in extra.items()]
    if load is not None and load.quota.max_cpus is not None:
        limits.append((load.quota.max_cpus - load.cpus, cpus))
    if load is not None and load.quota.max_gpus is not None:
        limits.append((load.quota.max_gpus - load.gpus, gpus))
    n = hi
    for room, taken in limits:
        each = taken / lo
        if each > EPS and math.isfinite(room):
            n = min(n, math.floor((room + EPS) / each))
    return max(n, lo)


def launched_spec(spec: dict, granted: int | None) -> dict:
    """The stored spec as an attempt's driver gets it: an elastic job's range with its
    granted max (the stored spec keeps the submitted one, which the next attempt is
    clamped from again)."""
    workers = (spec.get("scaling") or {}).get("num_workers")
    if granted is None or not isinstance(workers, dict):
        return spec
    return {**spec, "scaling": {**spec["scaling"], "num_workers": {**workers, "max": granted}}}
