"""Admission: what each job needs and holds on the cluster, the queue order, and which
queued jobs start now, wait, or can never start. Pure functions over plain values; the
monitor reads the inputs (database, cluster) and applies the ``Plan``.

A job holds, from the moment it is started until it ends: its workers (an elastic job
its max, which Ray Train grows into whenever the cluster has it), and a search its
concurrent trials, each with one driver CPU on top of its Train workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from api.errors import CapacityExceeded
from api.schemas import ClusterInfo, FailureCause, JobSpec, TuneSpec

Resources = tuple[float, float]  # (CPUs, GPUs)
EPS = 1e-9


# ----------------------------------------------------------------------------- demand


def trial_demand(spec: TuneSpec) -> Resources:
    """(CPUs, GPUs) one running trial of a search holds."""
    s = spec.base.scaling
    # An elastic base (num_workers {min, max}) may grow to max in every trial.
    return s.max_workers * s.cpus_per_worker + spec.driver_cpus_per_trial, float(s.max_workers if s.use_gpu else 0)


def search_demand(spec: TuneSpec) -> Resources:
    """(CPUs, GPUs) a search holds with all its concurrent trials running."""
    cpus, gpus = trial_demand(spec)
    return spec.concurrency * cpus, spec.concurrency * gpus


def demand(spec: JobSpec) -> Resources:
    """(CPUs, GPUs) a job needs on the cluster to start (an elastic job: its min workers)."""
    if spec.kind == "tune":
        return search_demand(spec)
    s = spec.scaling
    return s.min_workers * s.cpus_per_worker, float(s.min_workers if s.use_gpu else 0)


def holds(spec: JobSpec) -> Resources:
    """(CPUs, GPUs) a started job may take: an elastic job grows to max whenever the
    cluster has that much (Ray Train sizes it from the cluster's total resources, not
    from what other jobs leave free), so admission keeps that room for it."""
    scaling = getattr(spec, "scaling", None)
    if scaling is None or not scaling.is_elastic:
        return demand(spec)
    return scaling.max_workers * scaling.cpus_per_worker, float(scaling.max_workers if scaling.use_gpu else 0)


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
        need += " + 1 GPU"
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


@dataclass(frozen=True)
class Queued:
    id: str
    spec: JobSpec
    priority: int
    queued_at: datetime | None


@dataclass(frozen=True)
class Failure:
    job_id: str
    cause: FailureCause
    reason: str
    error: str


@dataclass
class Plan:
    start: list[str] = field(default_factory=list)  # in this order
    fail: list[Failure] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # job id -> new status reason


def queue_order(jobs: list[Queued]) -> list[Queued]:
    """The one queue order: priority first, then arrival."""
    return sorted(jobs, key=lambda j: (-j.priority, j.queued_at or datetime.max, j.id))


def missed_deadline(job: Queued, now: datetime) -> float | None:
    """The job's scheduling_timeout_s when it has passed, else None."""
    timeout = job.spec.scheduling_timeout_s
    if timeout is None or job.queued_at is None or (now - job.queued_at).total_seconds() <= timeout:
        return None
    return timeout


def plan(
    queued: list[Queued],
    held: list[JobSpec],
    now: datetime,
    cluster: ClusterInfo | None,
    addable: Resources = (0.0, 0.0),
    *,
    unavailable: str | None = None,
    reasons: dict[str, str | None] | None = None,
) -> Plan:
    """Which queued jobs start, fail or wait. ``held``: specs of the jobs started and
    not ended (and those being submitted); ``cluster`` None when Ray did not answer
    (``unavailable`` says why); ``reasons``: each queued job's current status reason,
    so the plan lists only reasons that change."""
    out, reasons = Plan(), reasons or {}

    def say(job_id: str, reason: str) -> None:
        if reasons.get(job_id) != reason:
            out.reasons[job_id] = reason

    waiting = []
    for job in queue_order(queued):
        if (timeout := missed_deadline(job, now)) is not None:
            out.fail.append(Failure(
                job.id, FailureCause.NO_RESOURCES, f"no resources within scheduling_timeout_s={timeout:g}",
                f"The cluster could not start the job within {timeout:g}s ({reasons.get(job.id)}). "
                "Lower scaling.num_workers / cpus_per_worker, raise scheduling_timeout_s, or add nodes.",
            ))  # fmt: skip
        else:
            waiting.append(job)
    if cluster is None:
        for job in waiting:
            say(job.id, f"waiting for the Ray cluster: {unavailable}")
        return out
    # A job submitted while Ray did not answer skipped the submit-time check: one that can
    # never fit fails here instead of blocking the queue behind it for ever.
    max_cpus, max_gpus = max_capacity(cluster, addable)
    fitting = []
    for job in waiting:
        refusal = capacity_refusal(job.spec, max_cpus, max_gpus, cluster.autoscaler is not None)
        if refusal is not None:
            out.fail.append(Failure(job.id, FailureCause.NO_RESOURCES, "can never fit the cluster", refusal.message))
        else:
            fitting.append(job)
    # Our own reservations count from the start on; Ray's free count also sees other
    # users. What an autoscaler can still add counts as free: a started job's pending
    # demand asks for it.
    holding = [holds(spec) for spec in held]
    free_cpus = min(cluster.cpus_total - sum(h[0] for h in holding), cluster.cpus_free) + addable[0]
    free_gpus = min(cluster.gpus_total - sum(h[1] for h in holding), cluster.gpus_free) + addable[1]
    blocked = 0
    for job in fitting:
        cpus, gpus = demand(job.spec)
        # Strict queue order: once one job waits, every later one waits behind it.
        if blocked or cpus > free_cpus + EPS or gpus > free_gpus + EPS:
            ahead = f"; {blocked} job(s) ahead of it in the queue" if blocked else ""
            say(job.id, f"waiting for resources: needs {cpus:g} CPUs / {gpus:g} GPUs, "
                        f"{max(free_cpus, 0):g} / {max(free_gpus, 0):g} free{ahead}")  # fmt: skip
            blocked += 1
            continue
        out.start.append(job.id)
        free_cpus, free_gpus = free_cpus - cpus, free_gpus - gpus
    return out
