"""The dataset cache's figures, beside their targets.

    .venv/bin/python -m bench.data_cache            # both parts
    .venv/bin/python -m bench.data_cache epochs     # no Ray: a few seconds
    .venv/bin/python -m bench.data_cache search     # a Ray head, a server and a 4-trial search

1. **A second epoch's data time against the first** (target <= 10%). A job's data time in
   an epoch: getting its data (the first epoch reads the source, or the node's cache) and
   walking every training batch of the epoch, without the model. For a generated
   dataset (synthetic rows), the grammar corpus and a csv table, through the cache: the
   first job's first epoch, its second epoch, and a later job's first epoch (a cache hit).
2. **A 4-trial search reads one dataset once per node** (bytes read from the source). A
   server with the cache on runs a 4-trial search (2 workers a trial) over synthetic
   rows on a one-node Ray head; the node's cache counters say how many reads went to the
   source and how many bytes they read, beside what a read per trial and per worker
   would have cost.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from api.cluster_contract import DATA_CACHE_BYTES_ENV, DATA_CACHE_DIR_ENV

CAP = 512 * 1024 * 1024
TARGET_SECOND_EPOCH = 0.10


def timed(fn):
    t = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t


def walk(batches) -> int:
    return sum(len(b[0]) for b in batches)


def epochs_figures(tmp: Path) -> list[dict]:
    """Part 1: per data source, the first epoch, the second, and a later job's first."""
    import numpy as np
    import pandas as pd
    import torch

    from api.schemas import TrainSpec
    from trainers.data.sources import node_cache
    from trainers.data.tables import cached_arrow
    from trainers.data.tabular import InMemoryData
    from trainers.data.text import batch_at, corpus_tokens, grammar_dataset

    torch.set_num_threads(1)  # as one worker of a shared node: no thread contention in the figures
    os.environ[DATA_CACHE_BYTES_ENV], os.environ[DATA_CACHE_DIR_ENV] = str(CAP), str(tmp / "cache")
    rows = []

    spec = TrainSpec.model_validate(
        {
            "name": "bench",
            "model": {"type": "mlp"},
            "data": {"source": "synthetic", "n_samples": 200_000, "n_features": 64},
            "batch_size": 256,
        }
    )

    def synthetic_job() -> tuple[float, float]:
        data, load = timed(lambda: InMemoryData(spec, 0, 1))
        _, first = timed(lambda: walk(data.train_batches(0)))
        _, second = timed(lambda: walk(data.train_batches(1)))
        return load + first, second

    rows.append(("synthetic rows 200k x 64", *synthetic_job(), synthetic_job()[0]))

    def text_job() -> tuple[float, float]:
        def load():
            tokens = corpus_tokens(4_000_000, 0, node_cache())
            return grammar_dataset(seq_len=64, tokens=tokens)

        ds, load_s = timed(load)
        per_epoch = len(ds) // 64

        def epoch(n: int) -> int:
            return sum(len(batch_at(ds, n * per_epoch + i, 64)[0]) for i in range(per_epoch))

        _, first = timed(lambda: epoch(0))
        _, second = timed(lambda: epoch(1))
        return load_s + first, second

    rows.append(("text corpus 4M chars", *text_job(), text_job()[0]))

    rng = np.random.default_rng(0)
    table = tmp / "table.csv"
    pd.DataFrame({f"f{i}": rng.uniform(size=200_000) for i in range(16)} | {"y": rng.integers(0, 4, 200_000)}).to_csv(
        table, index=False
    )

    def table_job() -> tuple[float, float]:
        arrow, load_s = timed(lambda: cached_arrow("csv", str(table), node_cache()))

        def epoch() -> int:
            x = torch.as_tensor(np.stack([arrow.column(f"f{i}").to_numpy() for i in range(16)], axis=1))
            return sum(len(x[i : i + 256]) for i in range(0, len(x), 256))

        _, first = timed(epoch)
        _, second = timed(epoch)
        return load_s + first, second

    rows.append((f"csv table {table.stat().st_size / 2**20:.0f} MiB", *table_job(), table_job()[0]))
    return [
        {"data": name, "first_epoch_s": f, "second_epoch_s": s, "later_job_first_epoch_s": later}
        for name, f, s, later in rows
    ]


def search_figures(tmp: Path) -> dict:
    """Part 2: a 4-trial search on one node through a server with the cache on."""
    import httpx

    from bench.harness.servers import ServerProcess
    from bench.harness.waiting import wait_for
    from service.cluster.local_cluster import start_head
    from trainers.data.cache import DataCache

    cache_dir = tmp / "search-cache"
    n_samples, n_features, trials, workers = 100_000, 64, 4, 2
    spec = {
        "kind": "tune",
        "name": "cache-search",
        "base": {
            "model": {"type": "mlp", "hidden_sizes": [32]},
            "data": {"source": "synthetic", "n_samples": n_samples, "n_features": n_features},
            "batch_size": 256,
            "max_steps": 3,
            "scaling": {"num_workers": workers, "cpus_per_worker": 0.25},
        },
        "search_space": {"optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.5}},
        "algorithm": "random",
        "metric": "val_acc",
        "mode": "max",
        "num_trials": trials,
        "max_concurrent_trials": trials,
        "driver_cpus_per_trial": 0.25,
        "seed": 1,
    }
    head = start_head(tmp / "ray", num_cpus=4)
    server = ServerProcess(
        tmp / "server",
        head.dashboard_url,
        extra_env={"RAYDOCK_DATA_CACHE_BYTES": str(CAP), "RAYDOCK_DATA_CACHE_DIR": str(cache_dir)},
    )
    try:
        with httpx.Client(base_url=server.start().url, timeout=30) as http:
            job = http.post("/v1/jobs", json=spec).json()
            done = wait_for(
                lambda: (
                    (j := http.get(f"/v1/jobs/{job['id']}").json())["status"] in ("SUCCEEDED", "FAILED", "CANCELLED")
                    and j
                ),
                timeout=900,
                what="the search to end",
                poll=2,
            )
    finally:
        server.stop()
        head.stop()
    counters = DataCache(str(cache_dir), CAP).counters()
    one_read = n_samples * n_features * 8 + n_samples * 8  # float64 rows and int64 labels
    return {
        "status": done["status"],
        "trials": trials,
        "workers_per_trial": workers,
        "reads_from_source": counters["misses"],
        "reads_from_cache": counters["hits"],
        "source_bytes": counters["source_bytes"],
        "one_read_bytes": one_read,
        "without_cache_bytes": one_read * trials * workers,
    }


def main(argv: list[str]) -> int:
    parts = argv or ["epochs", "search"]
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        if "epochs" in parts:
            out["epochs"] = epochs_figures(Path(tmp))
            print(
                f"{'data':26} {'1st epoch s':>11} {'2nd epoch s':>11} {'2nd/1st':>8} {'target':>7} {'later job 1st s':>15}"
            )
            for r in out["epochs"]:
                ratio = r["second_epoch_s"] / r["first_epoch_s"]
                print(
                    f"{r['data']:26} {r['first_epoch_s']:11.3f} {r['second_epoch_s']:11.3f} {ratio:8.1%} "
                    f"{'<= 10%':>7} {r['later_job_first_epoch_s']:15.3f}"
                )
        if "search" in parts:
            s = out["search"] = search_figures(Path(tmp))
            print(
                f"search of {s['trials']} trials x {s['workers_per_trial']} workers ({s['status']}): "
                f"{s['reads_from_source']} read(s) from the source, {s['reads_from_cache']} from the node's cache; "
                f"{s['source_bytes']:,} bytes read from the source (target: one read, {s['one_read_bytes']:,}; "
                f"a read per trial and worker: {s['without_cache_bytes']:,})"
            )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
