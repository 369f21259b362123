"""The Ray Tune pieces of a search, built from its ``TuneSpec``: the parameter space,
the scheduler (ASHA, PBT, PB2 or none), the search algorithm (random, grid, Optuna)
and the ``Tuner`` that runs ``tuning.trial.run_trial`` once per trial."""

from __future__ import annotations

import random
from typing import Any

from ray import tune
from ray.tune.schedulers import ASHAScheduler, TrialScheduler
from ray.tune.search import BasicVariantGenerator, Searcher

from api.schemas import CONTINUOUS, Choice, Grid, LogUniform, TuneSpec, Uniform, clip_to_space
from api.schemas.scaling import ACCELERATOR_PREFIX
from trainers.tune_compat import install_kept_actors, install_settled_removal, started_trainable
from tuning.function_trial import run_function_trial
from tuning.population import LoopEnd, Population
from tuning.schedulers import RecordingPB2, RecordingPBT
from tuning.search_events import SearchCallback, SearchEvents
from tuning.stall import StallGuard, stall_limit_s
from tuning.trial import run_trial
from tuning.trial_ranks import largest_node_cpus, run_warm_trial, trial_cpus, warm_reason

# Tune's own default horizon of ASHA, for a search whose loop's end is its budget.
ASHA_MAX_T = 100


def domain(dist: Any) -> Any:
    if isinstance(dist, Uniform):
        return tune.uniform(dist.low, dist.high)
    if isinstance(dist, LogUniform):
        return tune.loguniform(dist.low, dist.high)
    if isinstance(dist, Choice):
        return tune.choice(list(dist.values))
    if isinstance(dist, Grid):
        return tune.grid_search(list(dist.values))
    raise TypeError(f"unknown distribution {dist!r}")


def param_space(spec: TuneSpec) -> dict[str, Any]:
    # Flat keys: a trial's config maps each dotted path to its value.
    return {path: domain(dist) for path, dist in spec.search_space.items()}


def mutation(dist: Any) -> Any:
    """PBT's form: a domain to resample continuous values from, a list to shift along."""
    return domain(dist) if isinstance(dist, CONTINUOUS) else list(dist.values)


def scheduler(spec: TuneSpec, out: SearchEvents) -> TrialScheduler | None:
    unit, budget = spec.unit, spec.budget_amount
    if spec.algorithm == "asha":
        return ASHAScheduler(
            time_attr=unit,
            max_t=budget or ASHA_MAX_T,
            grace_period=spec.asha.grace_period,
            reduction_factor=spec.asha.reduction_factor,
            brackets=spec.asha.brackets,
        )
    if spec.algorithm not in ("pbt", "pb2"):
        return None
    space = spec.mutations

    def clip(config: dict[str, Any]) -> dict[str, Any]:
        return clip_to_space(config, space)

    options = spec.pbt
    common = dict(
        out=out,
        room_for_all=spec.concurrency >= spec.num_trials,
        time_attr=unit,
        perturbation_interval=options.perturbation_interval,
        quantile_fraction=options.quantile_fraction,
        custom_explore_fn=clip,
        log_config=False,
        # A function trainable reports to Tune directly, so nothing holds a trial at a
        # perturbation point (tuning.population does for Train loops): Tune's synchronous
        # PBT waits for the whole population there instead.
        synch=spec.trainable == "function" and options.align and spec.concurrency >= spec.num_trials,
        # A function trainable's process waits, paused, for its restart (trainers.tune_compat)
        # where the whole population runs at once: a kept process never holds the CPUs a
        # trial that waits for its first needs.
        keeps_paused_actors=spec.trainable == "function" and spec.concurrency >= spec.num_trials,
    )
    if spec.algorithm == "pb2":
        return RecordingPB2(hyperparam_bounds={p: [d.low, d.high] for p, d in space.items()}, **common)
    return RecordingPBT(
        hyperparam_mutations={p: mutation(d) for p, d in space.items()},
        burn_in_period=options.burn_in_period,
        resample_probability=options.resample_probability,
        perturbation_factors=tuple(options.perturbation_factors),
        **common,
    )


def stopper(spec: TuneSpec) -> dict[str, int] | LoopEnd | None:
    """The budget; without one the loop's own end, which a PBT clone of a loop that
    cannot restore would never reach (it starts the loop over at the donor's count)."""
    if spec.budget is not None:
        return {spec.unit: spec.budget_amount}
    return LoopEnd() if spec.algorithm in ("pbt", "pb2") else None


def searcher(spec: TuneSpec) -> Searcher | BasicVariantGenerator | None:
    if spec.algorithm == "bayesian":
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch(seed=spec.seed)
    if spec.seed is not None:
        return BasicVariantGenerator(random_state=spec.seed, max_concurrent=spec.concurrency)
    return None


def trial_runs_path(storage_path: str, job_id: str) -> str:
    """Where the trials' own Train runs keep their state, under the job's storage."""
    return f"{storage_path.rstrip('/')}/{job_id}/trial-runs"


def aligned(spec: TuneSpec) -> bool:
    """Whether the population waits for itself at perturbation points (tuning.population)."""
    return spec.algorithm in ("pbt", "pb2") and spec.pbt.align and spec.concurrency >= spec.num_trials


def experiment_path(storage_path: str, job_id: str) -> str:
    """The search's Tune experiment: its state, trials and their checkpoints."""
    return f"{storage_path.rstrip('/')}/{job_id}"


def trainable(
    spec: TuneSpec, job_id: str, storage_path: str, out: SearchEvents, channel: Any = None, warm: bool = False
) -> Any:
    """``run_trial`` (``run_warm_trial`` for a warm trial) with the search's spec, the trials' run storage, its population
    (which ``out`` hands the driver's callback too) and the trial's CPUs: a warm trial's
    trainable holds its workers' too (it forks them, ``tuning.trial_ranks``)."""
    if spec.trainable == "function":  # the user's own Tune trainable, one trainable per running trial
        out.population = None  # its reports go straight to Tune: nothing here can hold a trial at a perturbation
        scaling = spec.base.scaling
        resources = scaling.worker_resources()  # CPU, GPU, memory, custom: Tune names the first two cpu, gpu
        if scaling.accelerator_type is not None:  # as Ray's accelerator_type= asks for it: a sliver of the node's tag
            resources[ACCELERATOR_PREFIX + scaling.accelerator_type] = 0.001
        # Warm: the function forked, in a process with torch imported (tuning.function_trial).
        runs = trial_runs_path(storage_path, job_id) if warm else None
        fn = tune.with_parameters(
            run_function_trial, spec=spec.model_dump(mode="json"), storage_path=runs, channel=channel
        )
        return tune.with_resources(fn, {k.lower() if k in ("CPU", "GPU") else k: v for k, v in resources.items()})
    out.population = Population.remote() if aligned(spec) else None
    fn = tune.with_parameters(
        run_warm_trial if warm else run_trial,
        spec=spec.model_dump(mode="json"),
        storage_path=trial_runs_path(storage_path, job_id),
        population=out.population,
        channel=channel,
    )
    return tune.with_resources(fn, {"cpu": trial_cpus(spec) if warm else spec.driver_cpus_per_trial})


def trials_start_warm(spec: TuneSpec, trial_ranks: bool) -> bool:
    """Whether this search's trials run as local ranks (``trial_ranks``: the server lets
    them), said in the search's log either way."""
    why = warm_reason(spec, largest_node_cpus()) if trial_ranks else "local ranks are off (RAYDOCK_LOCAL_RANKS)"
    if why is None and spec.trainable == "function":
        print("raydock: trials start warm: each runs its function in a process forked with torch imported")
    elif why is None:
        print("raydock: trials start warm: each runs its workers as local ranks, kept between trials and exploits")
    else:
        print(f"raydock: trials start cold, each a Ray Train run: {why}")
    return why is None


def resumed_warm(spec: TuneSpec, started: str | None, warm: bool) -> bool:
    """Whether a resumed search's Train-loop trials go on warm: the way they started
    (``started``, the saved trainable's name), since Tune resumes a search only with the
    trainable it started with, whichever way they would start now (the cluster's nodes or
    the server's RAYDOCK_LOCAL_RANKS may have changed since). A function search's trainable
    has one name either way."""
    if spec.trainable == "function":
        return warm
    was_warm = {run_warm_trial.__name__: True, run_trial.__name__: False}.get(started or "")
    if was_warm is None or was_warm == warm:
        return warm
    how = "warm, as local ranks" if was_warm else "cold, each a Ray Train run"
    print(f"raydock: the search's trials started {how}: they go on so (Tune resumes a search with its own trainable)")
    return was_warm


def build_tuner(
    spec: TuneSpec, job_id: str, storage_path: str, out: SearchEvents, channel: Any = None, trial_ranks: bool = False
) -> tune.Tuner:
    """A new search, or, when the job's storage holds one (a resumed job), that search
    where it stopped: finished and failed trials stay so, the others go on from their
    last checkpoints with their values and the scheduler's state."""
    if spec.seed is not None:
        random.seed(spec.seed)  # PBT draws its donors and perturbations from `random`
    path = experiment_path(storage_path, job_id)
    warm = trials_start_warm(spec, trial_ranks)
    install_settled_removal()
    install_kept_actors()
    if tune.Tuner.can_restore(path):
        warm = resumed_warm(spec, started_trainable(path), warm)
        return tune.Tuner.restore(
            path, trainable=trainable(spec, job_id, storage_path, out, channel, warm), resume_unfinished=True
        )
    # Grid points each run num_trials / grid_size times (Tune's num_samples).
    samples = spec.num_trials // spec.grid_size
    search_alg = searcher(spec)
    return tune.Tuner(
        trainable(spec, job_id, storage_path, out, channel, warm),
        param_space=param_space(spec),
        tune_config=tune.TuneConfig(
            metric=spec.metric,
            mode=spec.mode,
            num_samples=samples,
            # A seeded variant generator carries the limit itself (Tune ignores this one then).
            max_concurrent_trials=None if isinstance(search_alg, BasicVariantGenerator) else spec.concurrency,
            scheduler=scheduler(spec, out),
            search_alg=search_alg,
            # A warm trial's actor (its imports, its rank host) serves the next trial and
            # the trial's restarts after exploits; each start forks fresh ranks. A cold
            # trial's trainable owns its Train run: a fresh actor per start keeps a paused
            # or cloned trial from reusing a run it no longer owns. A function trainable's
            # actor is kept too (not Tune's default in Ray 2.60), its function started afresh
            # each time, and a paused trial's waits for its restart (trainers.tune_compat).
            # Kept actors make Tune drop placement groups it asked for, which
            # tune_compat's SettledRemoval removes only once placed (Ray 2.60 leaks a
            # bundle's CPU otherwise).
            reuse_actors=warm or spec.trainable == "function",
        ),
        run_config=tune.RunConfig(
            name=job_id,
            storage_path=storage_path,
            callbacks=[SearchCallback(out), StallGuard(stall_limit_s(spec.stall_timeout_s))],
            stop=stopper(spec),
            failure_config=tune.FailureConfig(max_failures=0),
            # Every checkpoint is kept: PBT may clone any trial's latest one, and one
            # deleted while a clone restores from it fails the clone.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=None),
            verbose=1,
        ),
    )
