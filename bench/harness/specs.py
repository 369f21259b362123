"""The job spec the tests and the benchmarks submit most: a small MLP on digits."""

from __future__ import annotations


def digits_spec(**overrides) -> dict:
    spec = {
        "name": "digits-test",
        "model": {"type": "mlp", "hidden_sizes": [64]},
        "data": {"source": "digits"},
        "optimizer": {"name": "adam", "lr": 0.01},
        "batch_size": 64,
        "epochs": 5,
        "seed": 0,
        "scaling": {"num_workers": 2},
        "checkpoint": {"every_n_epochs": 1, "keep": 2},
    }
    spec.update(overrides)
    return spec
