"""The specs the tests submit beside ``harness.specs``: a user-code job over the fixtures' ``usercode``
folder (``tests/fixtures``), and a small search (``search``) over a digits MLP (``BASE``)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def user_spec(entrypoint: str, **overrides) -> dict:
    spec = {
        "name": "user-code",
        "entrypoint": entrypoint,
        "working_dir": str(FIXTURES / "usercode"),
        "config": {},
        "scaling": {"num_workers": 2},
    }
    spec.update(overrides)
    return spec


BASE = {
    "model": {"type": "mlp", "hidden_sizes": [32]},
    "data": {"source": "digits"},
    "optimizer": {"name": "sgd", "lr": 0.01},
    "batch_size": 64,
    "seed": 0,
    "scaling": {"num_workers": 1, "cpus_per_worker": 0.25},
}


def search(**overrides) -> dict:
    spec = {
        "kind": "tune",
        "name": "search-test",
        "base": BASE,
        "search_space": {"optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.5}},
        "algorithm": "random",
        "metric": "val_acc",
        "mode": "max",
        "num_trials": 4,
        "max_concurrent_trials": 4,
        "budget": {"epochs": 6},
        "driver_cpus_per_trial": 0.5,
        "seed": 1,
    }
    spec.update(overrides)
    return spec


def steps_search(scaling: dict, **overrides) -> dict:
    """A search over ``userpkg.steps`` (a user loop of 100,000 steps of 0.2 s) that runs until cancelled."""
    base = user_spec("userpkg.steps:train", config={"steps": 100_000, "sleep_s": 0.2}, scaling=scaling)
    return search(
        base=base,
        search_space={"config.lr": {"type": "uniform", "low": 0.01, "high": 0.1}},
        metric="loss",
        mode="min",
        num_trials=2,
        budget={"steps": 100_000},
        **overrides,
    )


def function_pbt_search(
    entrypoint: str,
    config: dict,
    *,
    cpus: float,
    lr: tuple[float, float],
    interval: int,
    num_trials: int,
    reports: int,
    **overrides,
) -> dict:
    """A PBT search over a Ray Tune function trainable of the fixtures (``trainable: function``)
    minimising its ``loss`` over ``config.lr``: one process of ``cpus`` CPUs per trial, no driver."""
    spec = search(
        base=user_spec(entrypoint, config=config, scaling={"cpus_per_worker": cpus}),
        trainable="function",
        search_space={"config.lr": {"type": "loguniform", "low": lr[0], "high": lr[1]}},
        algorithm="pbt",
        pbt={"perturbation_interval": interval, "quantile_fraction": 0.5},
        metric="loss",
        mode="min",
        num_trials=num_trials,
        budget={"reports": reports},
        **overrides,
    )
    spec.pop("driver_cpus_per_trial")
    return spec
