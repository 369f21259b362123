"""Admission: what each job needs and holds on the cluster, the queue order, and which
queued jobs start now, wait, or can never start. Pure functions over plain values; the
monitor reads the inputs (database, cluster) and applies the ``Plan``.

A job holds, from the moment it is started until it ends: its workers (an elastic job
its granted max, which Ray Train grows into whenever the cluster has it: its max clamped
at admission to its project's quota and the cluster, ``service.scheduling.elastic_grant``), and a
search its concurrent trials, each with one driver CPU on top of its Train workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from api.errors import CapacityExceeded
from api.schemas import ClusterInfo, FailureCause, JobSpec, TuneSpec
from api.schemas.scaling import ACCELERATOR_PREFIX, ScalingSpec
from service.scheduling import node_fit
from service.scheduling.elastic_grant import Ceiling, grant
from service.scheduling.fair_share import ProjectLoad, order_key

Resources = tuple[float, float]  # (CPUs, GPUs)
# What a job asks beyond CPUs and GPUs, by Ray resource name: memory (bytes), custom
# resources, and "accelerator_type:<name>" counting GPUs on nodes of that type.
Extra = dict[str, float]
EPS = 1e-9


# ----------------------------------------------------------------------------- demand


def trial_demand(spec: TuneSpec) -> Resources:
    """(CPUs, GPUs) one running trial of a search holds."""
    s = spec.base.scaling
    if spec.trainable == "function":  # one process per trial, with one worker's resources
        return s.cpus_per_worker, s.gpus
    # An elastic base (num_workers {min, max}) may grow to max in every trial.
    return s.max_workers * s.cpus_per_worker + spec.driver_cpus_per_trial, s.max_workers * s.gpus


def search_demand(spec: TuneSpec) -> Resources:
    """(CPUs, GPUs) a search holds with all its concurrent trials running."""
    cpus, gpus = trial_demand(spec)
    return spec.concurrency * cpus, spec.concurrency * gpus


def demand(spec: JobSpec) -> Resources:
    """(CPUs, GPUs) a job needs on the cluster to start (an elastic job: its min workers)."""
    if spec.kind == "tune":
        return search_demand(spec)
    s = spec.scaling
    return s.min_workers * s.cpus_per_worker, s.min_workers * s.gpus


def holds(spec: JobSpec) -> Resources:
    """(CPUs, GPUs) a started job may take: an elastic job grows to max whenever the
    cluster has that much (Ray Train sizes it from the cluster's total resources, not
    from what other jobs leave free), so admission keeps that room for it."""
    scaling = getattr(spec, "scaling", None)
    if scaling is None or not scaling.is_elastic:
        return demand(spec)
    return scaling.max_workers * scaling.cpus_per_worker, scaling.max_workers * scaling.gpus


def worker_range(spec: JobSpec) -> tuple[int, int] | None:
    """An elastic training job's (min, max) workers; None for a fixed size, or a search
    (each trial's demand counts its max already)."""
    scaling = getattr(spec, "scaling", None)
    if spec.kind == "tune" or scaling is None or not scaling.is_elastic:
        return None
    return scaling.min_workers, scaling.max_workers


def _extra(s: ScalingSpec, workers: int) -> Extra:
    return {k: v * workers for k, v in s.extra_resources().items()}


def extra_demand(spec: JobSpec) -> Extra:
    """What the job needs to start beyond CPUs and GPUs (``demand``'s other resources)."""
    if spec.kind == "tune":
        return _extra(spec.base.scaling, spec.concurrency * spec.trial_workers)
    return _extra(spec.scaling, spec.scaling.min_workers)


def extra_holds(spec: JobSpec) -> Extra:
    """What a started job may take beyond CPUs and GPUs (``holds``'s other resources)."""
    if spec.kind == "tune":
        return extra_demand(spec)
    return _extra(spec.scaling, spec.scaling.max_workers)


def extra_free(info: ClusterInfo, held: Iterable[Extra]) -> Extra:
    """What the queue may still use of each resource beyond CPUs and GPUs: the alive
    nodes' totals (an accelerator type: the GPUs of the nodes that have it), what the
    autoscaler can add (unbounded where its limits are unknown), less what our started
    jobs hold."""
    total: Extra = {}
    for resources, count in node_fit.nodes(info):  # the alive nodes, and the node types with room
        _add_node(total, resources, count)
    for h in held:
        for k, v in h.items():
            total[k] = total.get(k, 0.0) - v
    return total


def _add_node(total: Extra, resources: dict[str, float], count: float) -> None:
    for k, v in resources.items():
        if k in ("CPU", "GPU"):
            continue
        amount = resources.get("GPU", 0.0) if k.startswith(ACCELERATOR_PREFIX) else v
        total[k] = total.get(k, 0.0) + amount * count


def extra_words(extra: Extra) -> str:
    """What ``extra`` asks, in words: "2 x A100 GPU, 8 GiB memory, 1 infiniband"."""
    parts = []
    for k, v in extra.items():
        if k.startswith(ACCELERATOR_PREFIX):
            parts.append(f"{v:g} x {k.removeprefix(ACCELERATOR_PREFIX)} GPU")
        elif k == "memory":
            parts.append(f"{v / 2**30:g} GiB memory")
        else:
            parts.append(f"{v:g} {k}")
    return ", ".join(parts)


# ----------------------------------------------------------------------------- refusals


def capacity_refusal(spec: JobSpec, max_cpus: float, max_gpus: float, has_autoscaler: bool) -> CapacityExceeded | None:
    """Why the job can never run on a cluster that has at most (``max_cpus``,
    ``max_gpus``) counting what its autoscaler can add; None when it can."""
    if spec.kind == "tune":
        return _search_refusal(spec, max_cpus, max_gpus, has_autoscaler)
    cpus, gpus = demand(spec)
    if cpus <= max_cpus + EPS and gpus <= max_gpus + EPS:
        return None
    s = spec.scaling
    need = f"{s.min_workers} workers x {s.cpus_per_worker:g} CPU"
    if s.use_gpu:
        need += f" + {s.gpus:g} GPU"
    if s.is_elastic:
        need = f"at least {need} (scaling.num_workers.min)"
    scaler = "counting what its autoscaler can add" if has_autoscaler else "and no autoscaler"
    return CapacityExceeded(
        f"The job asks for {need} ({cpus:g} CPUs, {gpus:g} GPUs) but the cluster has "
        f"{max_cpus:g} CPUs and {max_gpus:g} GPUs in all, {scaler}. "
        "Lower scaling.num_workers or scaling.cpus_per_worker, or add nodes.",
        details=[{"loc": ["scaling", "num_workers"], "msg": "exceeds cluster capacity"}],
    )


def _search_refusal(spec: TuneSpec, max_cpus: float, max_gpus: float, has_autoscaler: bool) -> CapacityExceeded | None:
    cpus, gpus = search_demand(spec)
    if cpus <= max_cpus + EPS and gpus <= max_gpus + EPS:
        return None
    per_cpus, per_gpus = trial_demand(spec)
    s = spec.base.scaling
    fits = int(min(max_cpus / per_cpus, max_gpus / per_gpus if per_gpus else float("inf")) + EPS)
    each = f"{s.max_workers} worker(s) x {s.cpus_per_worker:g} CPU + {spec.driver_cpus_per_trial:g} CPU for its driver"
    if s.use_gpu:
        each += f" and {per_gpus:g} GPU(s)"
    if fits >= 1:
        fix = f"Lower max_concurrent_trials to {fits} or less"
    else:
        fix = "Not even one trial fits: lower base.scaling.num_workers, base.scaling.cpus_per_worker or driver_cpus_per_trial"
    scaler = "counting what its autoscaler can add" if has_autoscaler else "and no autoscaler"
    return CapacityExceeded(
        f"The search runs {spec.concurrency} trials at once (max_concurrent_trials), each holding {each} "
        f"= {per_cpus:g} CPUs: {cpus:g} CPUs and {gpus:g} GPUs in all, but the cluster has {max_cpus:g} CPUs and "
        f"{max_gpus:g} GPUs {scaler}. {fix}, or add nodes.",
        details=[{"loc": ["max_concurrent_trials"], "msg": "exceeds cluster capacity"}],
    )


def max_capacity(info: ClusterInfo, addable: Resources) -> Resources:
    """The most a job can ever get: alive nodes plus what the autoscaler can add."""
    alive = [n for n in info.nodes if n.alive]
    return sum(n.cpus for n in alive) + addable[0], sum(n.gpus for n in alive) + addable[1]


# ----------------------------------------------------------------------------- the plan

# What every queued job behind the first one that waits is told: it waits its turn. The
# same words for all of them, so a moving queue rewrites no reasons (the place in the
# queue is ``queue_position``).
BEHIND = "waiting for resources: jobs ahead of it in the queue start first"


@dataclass(frozen=True)
class Queued:
    """A waiting job as admission sees it: the typed columns filled at submit."""

    id: str
    cpus: float
    gpus: float
    queued_at: datetime | None
    scheduling_timeout_s: float | None = None
    reason: str | None = None  # its status reason now
    extra: Extra = field(default_factory=dict)  # beyond CPUs and GPUs (extra_demand)
    project: str = "default"
    priority: int = 0
    workers: tuple[int, int] | None = None  # an elastic job's (min, max); its demand counts min

    def holding(self, workers: int | None) -> tuple[float, float, Extra]:
        """(CPUs, GPUs, beyond them) the job holds once started with ``workers`` as its
        max (``grant``); None: a fixed size, which holds what it needs to start."""
        if workers is None or self.workers is None:
            return self.cpus, self.gpus, self.extra
        scale = workers / self.workers[0]
        return self.cpus * scale, self.gpus * scale, {k: v * scale for k, v in self.extra.items()}


@dataclass(frozen=True)
class Failure:
    job_id: str
    cause: FailureCause
    reason: str
    error: str


@dataclass
class Plan:
    start: list[str] = field(default_factory=list)  # in this order
    reasons: dict[str, str] = field(default_factory=dict)  # job id -> new status reason
    seen: set[str] = field(default_factory=set)  # the jobs it looked at; the rest wait BEHIND
    borrowed: set[str] = field(default_factory=set)  # started beyond their project's guarantee
    # The elastic jobs started: their granted max workers, and (CPUs, GPUs, beyond) held with it.
    granted: dict[str, tuple[int, float, float, Extra]] = field(default_factory=dict)
    # The first job that does not fit although it is within its project's guarantee, and
    # the (CPUs, GPUs) it is short of: borrowed room to take back (service/scheduling/preemption.py).
    wants: tuple[Queued, Resources] | None = None


def overdue(candidates: Iterable[Queued], now: datetime) -> list[Failure]:
    """The queued jobs whose scheduling_timeout_s has passed, as failures."""
    out = []
    for job in candidates:
        timeout = job.scheduling_timeout_s
        if timeout is None or job.queued_at is None or (now - job.queued_at).total_seconds() <= timeout:
            continue
        out.append(
            Failure(
                job.id,
                FailureCause.NO_RESOURCES,
                f"no resources within scheduling_timeout_s={timeout:g}",
                f"The cluster could not start the job within {timeout:g}s ({job.reason}). "
                "Lower scaling.num_workers / cpus_per_worker, raise scheduling_timeout_s, or add nodes.",
            )
        )
    return out


def free(
    cluster: ClusterInfo, held: list[Resources], addable: Resources, released: Resources = (0.0, 0.0)
) -> Resources:
    """What the queue may still use. Our own reservations count from the start on; Ray's
    free count also sees other users. ``released``: what our jobs that ended after Ray
    counted its usage held (Ray's count is seconds old; they no longer use it). What an
    autoscaler can still add counts as free: a started job's pending demand asks for it."""
    cpus = min(cluster.cpus_total - sum(h[0] for h in held), cluster.cpus_free + released[0]) + addable[0]
    gpus = min(cluster.gpus_total - sum(h[1] for h in held), cluster.gpus_free + released[1]) + addable[1]
    return cpus, gpus


def fair_order(heads: dict[str, Iterator[Queued]], loads: dict[str, ProjectLoad]) -> Iterator[Queued]:
    """The waiting jobs of every project (``heads``: each project's jobs in priority and
    arrival order) merged in fair-share order (``fair_share.order_key``), read from the
    loads as they stand when each next job is asked for: ``plan`` updates them as it
    starts jobs, and a project whose job waits for its quota drops out."""
    nxt = {p: next(it, None) for p, it in heads.items()}
    while True:
        live = [(p, j) for p, j in nxt.items() if j is not None and not loads[p].blocked]
        if not live:
            return
        p, job = min(
            live,
            key=lambda pj: order_key(loads[pj[0]], pj[1].cpus, pj[1].gpus, pj[1].priority, pj[1].queued_at, pj[1].id),
        )
        yield job
        nxt[p] = next(heads[p], None)


def plan(
    queue: Iterable[Queued],
    available: Resources,
    extra: Extra | None = None,
    loads: dict[str, ProjectLoad] | None = None,
    ceiling: Ceiling | None = None,
) -> Plan:
    """Which jobs of ``queue`` (in queue order, those that can ever fit) start now with
    ``available`` (CPUs, GPUs) and ``extra`` (``extra_free``) free. One pass that stops at
    the first job that does not fit: a later job never overtakes a waiting one, so the
    rest of the queue (which the caller need not even read) waits ``BEHIND`` it. With
    ``loads`` (each project's load and quota), a job over its project's running limits
    waits for its quota without holding up other projects. A job starts when what it needs
    (an elastic job: its min) fits, and from then on counts what it holds (an elastic job:
    its ``grant`` within ``ceiling`` and its quota) against its quota, its project's
    guarantee and what is free. Lists only reasons that change."""
    out = Plan()
    free_cpus, free_gpus = available
    free_extra = dict(extra or {})
    for job in queue:
        out.seen.add(job.id)
        load = loads.get(job.project) if loads is not None else None
        if load is not None and (reason := load.quota_block(job.cpus, job.gpus)) is not None:
            load.blocked = True
            if job.reason != reason:
                out.reasons[job.id] = reason
            continue
        short = {k: v for k, v in job.extra.items() if v > free_extra.get(k, 0.0) + EPS}
        if job.cpus > free_cpus + EPS or job.gpus > free_gpus + EPS:
            reason = (
                f"waiting for resources: needs {job.cpus:g} CPUs / {job.gpus:g} GPUs, "
                f"{max(free_cpus, 0):g} / {max(free_gpus, 0):g} free"
            )
            if load is not None and load.within_guarantee(job.cpus, job.gpus):
                out.wants = (job, (max(job.cpus - free_cpus, 0.0), max(job.gpus - free_gpus, 0.0)))
        elif short:
            have = {k: max(free_extra.get(k, 0.0), 0.0) for k in short}
            reason = f"waiting for resources: needs {extra_words(short)}, {extra_words(have)} free"
        else:
            out.start.append(job.id)
            workers = grant(job.workers, (job.cpus, job.gpus, job.extra), load, ceiling) if job.workers else None
            cpus, gpus, extra_held = job.holding(workers)
            if workers is not None:
                out.granted[job.id] = (workers, cpus, gpus, extra_held)
            if load is not None:
                if not load.within_guarantee(cpus, gpus):
                    out.borrowed.add(job.id)
                load.admit(cpus, gpus)
            free_cpus, free_gpus = free_cpus - cpus, free_gpus - gpus
            for k, v in extra_held.items():
                free_extra[k] = free_extra.get(k, 0.0) - v
            continue
        if job.reason != reason:
            out.reasons[job.id] = reason
        break
    return out
