"""The classifiers' data: built-in datasets that need no download, and user tables.

Every worker loads the (small) in-memory dataset and takes its own shard of the
training split, so no rank sees another's rows and the split depends only on the seed
(:class:`InMemoryData`). Tables given by path are read with Ray Data in the driver and
sharded by Ray Train (:class:`RayDataShards`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from api.schemas import DigitsData, SyntheticData, TabularData, TrainSpec
from trainers.data.sources import arrays_bytes, arrays_key, arrays_of, cached, node_cache

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class ArrayData:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    n_features: int
    n_classes: int


def read_xy(spec: DigitsData | SyntheticData, seed: int) -> tuple[tuple[np.ndarray, np.ndarray], int]:
    """The rows and labels of a built-in dataset, and the bytes read from its source."""
    if isinstance(spec, DigitsData):
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        return (x / 16.0, y), digits_file()[1]  # pixel intensities are 0..16
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=spec.n_samples,
        n_features=spec.n_features,
        n_informative=max(2, spec.n_features // 2),
        n_classes=spec.n_classes,
        random_state=seed,
    )
    return (x, y), x.nbytes + y.nbytes


def digits_file() -> tuple[str, int, float]:
    """scikit-learn's bundled digits file: (path, size, mtime), the source's listing."""
    import sklearn.datasets

    path = os.path.join(os.path.dirname(sklearn.datasets.__file__), "data", "digits.csv.gz")
    st = os.stat(path)
    return path, st.st_size, st.st_mtime


def load_xy(spec: DigitsData | SyntheticData, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``read_xy``'s arrays, through the node's data cache (``trainers.data.sources``)."""
    import sklearn

    if isinstance(spec, DigitsData):
        key = arrays_key("digits", listing=digits_file())
    else:
        shape = spec.model_dump(include={"n_samples", "n_features", "n_classes"})
        key = arrays_key("synthetic", sklearn=sklearn.__version__, seed=seed, **shape)
    return cached(
        node_cache(spec.cache),
        key,
        lambda: read_xy(spec, seed),
        lambda xy: arrays_bytes({"x": xy[0], "y": xy[1]}),
        lambda b: tuple(arrays_of(b, ("x", "y")).values()),
    )


def load_arrays(spec: DigitsData | SyntheticData, seed: int) -> ArrayData:
    x, y = load_xy(spec, seed)
    n_classes = 10 if isinstance(spec, DigitsData) else spec.n_classes
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


class InMemoryData:
    """A built-in dataset: each worker holds its own shard of the training split."""

    def __init__(self, spec: TrainSpec, rank: int, world: int):
        arrays = load_arrays(spec.data, spec.seed)
        self.n_features, self.n_classes = arrays.n_features, arrays.n_classes
        self.x, self.y = shard(arrays.x_train, rank, world), shard(arrays.y_train, rank, world)
        # Validation needs no equal shards (one all-reduce at the end), so no row is dropped.
        self.x_val, self.y_val = arrays.x_val[rank::world], arrays.y_val[rank::world]
        self.batch_size, self.seed, self.rank = spec.batch_size, spec.seed, rank

    def train_batches(self, epoch: int) -> Iterator[Batch]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch * 101 + self.rank)
        return batches(self.x, self.y, min(self.batch_size, len(self.x)), g)

    def val_batches(self) -> Iterator[Batch]:
        for i in range(0, len(self.x_val), 1024):
            yield self.x_val[i : i + 1024], self.y_val[i : i + 1024]


class RayDataShards:
    """A user table, sharded across workers by Ray Train (equal-sized splits)."""

    def __init__(self, spec: TrainSpec, meta: dict):
        import ray.train

        data: TabularData = spec.data
        self.features, self.label = meta["feature_columns"], data.label_column
        self.n_features, self.n_classes = len(self.features), meta["num_classes"]
        self.batch_size = spec.batch_size
        self.train = ray.train.get_dataset_shard("train")
        self.val = ray.train.get_dataset_shard("val")

    def _iter(self, shard, batch_size: int) -> Iterator[Batch]:
        for b in shard.iter_torch_batches(batch_size=batch_size, drop_last=False):
            x = torch.stack([b[c].to(torch.float32) for c in self.features], dim=1)
            yield x, b[self.label].to(torch.long)

    def train_batches(self, epoch: int) -> Iterator[Batch]:
        return self._iter(self.train, self.batch_size)

    def val_batches(self) -> Iterator[Batch]:
        return self._iter(self.val, 1024)


def classifier_data(spec: TrainSpec, data_meta: dict, rank: int, world: int) -> InMemoryData | RayDataShards:
    """This worker's view of a classifier job's data (``rank`` of ``world`` data replicas)."""
    if isinstance(spec.data, TabularData):
        return RayDataShards(spec, data_meta)
    return InMemoryData(spec, rank, world)
