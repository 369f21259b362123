"""What a search holds on the cluster, and the submit-time check that the cluster can
hold it. A trial holds its Train workers (``base.scaling``) plus one driver (the Tune
trainable running its ``TorchTrainer``); a search holds ``max_concurrent_trials`` of
them at once."""

from __future__ import annotations

from api.errors import CapacityExceeded
from api.schemas import TuneSpec


def trial_demand(spec: TuneSpec) -> tuple[float, float]:
    """(CPUs, GPUs) one running trial holds."""
    s = spec.base.scaling
    # An elastic base (num_workers {min, max}) may grow to max in every trial.
    return s.max_workers * s.cpus_per_worker + spec.driver_cpus_per_trial, float(s.max_workers if s.use_gpu else 0)


def search_demand(spec: TuneSpec) -> tuple[float, float]:
    """(CPUs, GPUs) the search holds with all its concurrent trials running."""
    cpus, gpus = trial_demand(spec)
    return spec.concurrency * cpus, spec.concurrency * gpus


def check_search_budget(spec: TuneSpec, max_cpus: float, max_gpus: float) -> None:
    """Refuse a search whose concurrent trials the cluster can never hold at once."""
    cpus, gpus = search_demand(spec)
    if cpus <= max_cpus + 1e-9 and gpus <= max_gpus + 1e-9:
        return
    per_cpus, per_gpus = trial_demand(spec)
    s = spec.base.scaling
    fits = int(min(max_cpus / per_cpus, max_gpus / per_gpus if per_gpus else float("inf")) + 1e-9)
    each = f"{s.max_workers} worker(s) x {s.cpus_per_worker:g} CPU + {spec.driver_cpus_per_trial:g} CPU for its driver"
    if s.use_gpu:
        each += f" and {per_gpus:g} GPU(s)"
    if fits >= 1:
        fix = f"Lower max_concurrent_trials to {fits} or less"
    else:
        fix = "Not even one trial fits: lower base.scaling.num_workers, base.scaling.cpus_per_worker or driver_cpus_per_trial"
    raise CapacityExceeded(
        f"The search runs {spec.concurrency} trials at once (max_concurrent_trials), each holding {each} "
        f"= {per_cpus:g} CPUs: {cpus:g} CPUs and {gpus:g} GPUs in all, but the cluster has {max_cpus:g} CPUs and "
        f"{max_gpus:g} GPUs and no autoscaler. {fix}, or add nodes.",
        details=[{"loc": ["max_concurrent_trials"], "msg": "exceeds cluster capacity"}],
    )
