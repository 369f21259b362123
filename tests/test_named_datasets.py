"""Named datasets for user code (``datasets:``): a Ray Train loop written as Ray's
documentation writes one reads "train" and "validation" from tables the test makes, in
parquet and CSV, unchanged; a search over its lr gets the same datasets in every trial."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from api.client import Client
from api.schemas import TrainSpec
from tests.support.specs import search, user_spec

LOOP = "userpkg.regression:train_func"


def table(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x1, x2 = rng.uniform(-1, 1, rows), rng.uniform(-1, 1, rows)
    return pd.DataFrame({"x1": x1, "x2": x2, "y": 2 * x1 - 3 * x2 + 1 + rng.normal(0, 0.01, rows)})


def regression(datasets: dict, **overrides) -> dict:
    spec = user_spec(LOOP, name="regression", datasets=datasets, config={"epochs": 3, "lr": 0.2})
    spec["scaling"] = {"num_workers": 2, "cpus_per_worker": 0.5}
    spec.update(overrides)
    return spec


@pytest.mark.parametrize(
    "datasets, extra, words",
    [
        ({"train": {"split": {"from": "raw", "fraction": 0.2}}}, {}, "'raw' is not a table"),
        (
            {
                "raw": {"format": "csv", "path": "/d"},
                "a": {"split": {"from": "raw", "fraction": 0.6}},
                "b": {"split": {"from": "raw", "fraction": 0.5}},
            },
            {},
            "add up to 1 or more",
        ),
        ({"train": {"format": "csv", "path": "/d"}}, {"datasets_to_split": ["val"]}, "not datasets of this job"),
        ({"train": {"format": "xlsx", "path": "/d"}}, {}, "format"),
        ({"train": {"format": "csv", "path": "/d\n"}}, {}, "path"),
        ({"bad name!": {"format": "csv", "path": "/d"}}, {}, "bad name!"),
        ({f"d{i}": {"format": "csv", "path": "/d"} for i in range(17)}, {}, "at most 16"),
    ],
)
def test_a_datasets_section_that_cannot_work_is_refused_saying_why(datasets, extra, words):
    with pytest.raises(ValidationError) as refused:
        TrainSpec.model_validate(regression(datasets, **extra))
    assert words in str(refused.value)


def test_datasets_are_for_user_code_and_not_beside_data():
    built_in = {"name": "b", "model": {"type": "mlp"}, "datasets": {"train": {"format": "csv", "path": "/d"}}}
    with pytest.raises(ValidationError, match="for user code"):
        TrainSpec.model_validate(built_in)
    both = regression({"train": {"format": "csv", "path": "/d"}}, data={"source": "digits"})
    with pytest.raises(ValidationError, match="not both"):
        TrainSpec.model_validate(both)


@pytest.mark.slow
def test_rays_documented_loop_reads_train_and_validation_unchanged(client: Client, tmp_path):
    table(400, 0).to_parquet(tmp_path / "train.parquet")
    table(100, 1).to_csv(tmp_path / "validation.csv", index=False)
    job = client.submit(
        regression(
            {
                "train": {"format": "parquet", "path": str(tmp_path / "train.parquet")},
                "validation": {"format": "csv", "path": str(tmp_path / "validation.csv")},
            }
        )
    )
    job.wait(timeout=300)
    assert job.status.value == "SUCCEEDED", job.info.error
    series = [p.metrics for p in job.metrics()]
    assert [m["epoch"] for m in series] == [0, 1, 2]
    assert series[-1]["val_loss"] < series[0]["val_loss"] and series[-1]["val_loss"] < 0.1
    # Validation is not split across the workers: each reads all 100 rows.
    assert {m["val_rows"] for m in series} == {100}
    assert len(job.checkpoints()) >= 1


@pytest.mark.long  # a search of Train runs: opt-in for time
def test_a_search_over_the_loops_lr_gives_every_trial_the_same_split_datasets(client: Client, tmp_path):
    table(500, 2).to_csv(tmp_path / "rows.csv", index=False)
    base = regression(
        {
            "train": {"format": "csv", "path": str(tmp_path / "rows.csv")},
            "validation": {"split": {"from": "train", "fraction": 0.2}},
        }
    )
    base.pop("name")
    base["scaling"] = {"num_workers": 1, "cpus_per_worker": 0.25}
    spec = search(
        base=base,
        search_space={"config.lr": {"type": "grid", "values": [0.2, 0.0001]}},
        algorithm="grid",
        metric="val_loss",
        mode="min",
        num_trials=2,
        max_concurrent_trials=2,
    )
    spec.pop("budget")
    job = client.submit(spec)
    job.wait(timeout=300)
    assert job.status.value == "SUCCEEDED", job.info.error
    finals = {t.config["config.lr"]: t.last_metrics for t in job.trials()}
    assert {m["val_rows"] for m in finals.values()} == {100}  # 20% of 500, in each trial
    assert finals[0.2]["val_loss"] < finals[0.0001]["val_loss"]
