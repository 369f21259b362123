"""Built-in datasets that need no download, split the same way on every worker.

Every worker loads the (small) in-memory dataset and takes its own shard of the
training split, so no rank sees another's rows and the split depends only on the seed.
Tables given by path are read with Ray Data in the driver and sharded by Ray Train.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from api.schemas import DigitsData, SyntheticData


@dataclass
class ArrayData:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    n_features: int
    n_classes: int


def load_arrays(spec: DigitsData | SyntheticData, seed: int) -> ArrayData:
    if isinstance(spec, DigitsData):
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x = x / 16.0  # pixel intensities are 0..16
        n_classes = 10
    else:
        from sklearn.datasets import make_classification

        x, y = make_classification(
            n_samples=spec.n_samples,
            n_features=spec.n_features,
            n_informative=max(2, spec.n_features // 2),
            n_classes=spec.n_classes,
            random_state=seed,
        )
        n_classes = spec.n_classes
    order = np.random.default_rng(seed).permutation(len(x))
    n_val = max(1, int(round(len(x) * spec.val_fraction)))
    val, train = order[:n_val], order[n_val:]
    as_x = lambda idx: torch.as_tensor(x[idx], dtype=torch.float32)  # noqa: E731
    as_y = lambda idx: torch.as_tensor(y[idx], dtype=torch.long)  # noqa: E731
    return ArrayData(as_x(train), as_y(train), as_x(val), as_y(val), x.shape[1], n_classes)


def shard(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rows rank, rank+world, ...: equal-sized shards (the tail is dropped) so every
    rank runs the same number of steps and collectives never wait on a missing peer."""
    n = (len(x) // world) * world
    return x[rank:n:world]


def batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, generator: torch.Generator):
    order = torch.randperm(len(x), generator=generator)
    for i in range(0, len(x) - batch_size + 1 if len(x) >= batch_size else 1, batch_size):
        idx = order[i : i + batch_size]
        yield x[idx], y[idx]
