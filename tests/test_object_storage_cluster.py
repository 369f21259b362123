"""A training job whose only storage is the suite's S3 endpoint (moto's server), on the
session's Ray cluster: its nodes hold credentials only, the server is started with the
endpoint, region and credentials as AWS's SDKs read them, and hands the driver the
endpoint and region. Checkpoints are written to the bucket, listed, downloaded and
resumed from; named datasets are read from the bucket by Ray Data; a PBT clone goes on
from its donor's checkpoint there."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pandas as pd
import pytest

from api import object_store
from api.client import Client
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from bench.harness.waiting import run_to_end, wait_for
from service.cluster.ray_backend import RayBackend
from service.files import storage
from tests.support.object_store import NODE_ENV
from tests.support.specs import search, user_spec

EPOCHS = 10_000  # never reached: each attempt is cancelled once it has shown what it wrote
REGRESSION = "userpkg.regression:train_func"  # Ray's documented loop over "train" and "validation"


def regression_table(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x1, x2 = rng.uniform(-1, 1, rows), rng.uniform(-1, 1, rows)
    return pd.DataFrame({"x1": x1, "x2": x2, "y": 2 * x1 - 3 * x2 + 1 + rng.normal(0, 0.01, rows)})


@pytest.fixture()
def s3_server_process(ray_head, s3_server, tmp_path):
    base = s3_server.fresh_prefix()
    env = {**s3_server.env(), "RAYDOCK_STORAGE_PATH": base}
    proc = ServerProcess(tmp_path / "server", ray_head.dashboard_url, extra_env=env).start(
        timeout=180
    )  # a busy machine
    yield proc, base
    proc.stop()


# Opt-in (RAYDOCK_LONG_TESTS=1) for time: two attempts, each to its cancel (3-5 minutes here).
# Its resumed attempt once showed no checkpoint in 240 s after a cancel that landed 80 epochs
# late: listing the job's checkpoints asked the endpoint about every one it ever reported
# (service/files/storage.py ``existing`` lists their folder once now).
@pytest.mark.long
def test_a_digits_job_checkpoints_to_s3_downloads_and_resumes_from_there(s3_server_process, s3_env, ray_head, tmp_path):
    server, base = s3_server_process
    with Client(server.url) as client:
        job = client.submit(digits_spec(name="on-s3", epochs=EPOCHS, checkpoint={"every_n_epochs": 1, "keep": 2}))
        try:
            wait_for(lambda: job.refresh().status.is_terminal() or len(job.checkpoints()) >= 2, 180, "two checkpoints")
            assert not job.status.is_terminal(), job.info.error  # a driver that cannot reach the bucket fails here
            job.cancel()
            wait_for(lambda: job.refresh().status.is_terminal(), 90, "the cancel")
            assert job.status.value == "CANCELLED", job.info.error
            first = job.checkpoints()
            print(f"cancelled at checkpoint epochs {[c.epoch for c in first]} of {EPOCHS}")
            prefix = storage.job_prefix(base, job.id)
            # Reported as URIs on the bucket, inside the job's own prefix, and there.
            assert first and all(c.path.startswith(prefix + "/") and storage.exists(c.path) for c in first)
            last = max(first, key=lambda c: c.epoch)
            restored = job.download_checkpoint(last, dest=tmp_path)
            assert json.loads((restored / "state.json").read_text())["epoch"] == last.epoch

            job.resume()
            wait_for(
                lambda: job.refresh().status.is_terminal() or any(c.epoch > last.epoch for c in job.checkpoints()),
                240,
                "the resumed attempt's first checkpoint",
            )
            assert not job.status.is_terminal(), job.info.error
            job.cancel()
            wait_for(lambda: job.refresh().status.is_terminal(), 90, "the second cancel")
            second = [p for p in job.metrics() if p.attempt == 2]
            assert second and second[0].epoch >= last.epoch + 1  # it went on from a checkpoint, not from the start
            assert all(c.path.startswith(prefix + "/") and storage.exists(c.path) for c in job.checkpoints())
            # The launch files were read and deleted; no credential reached a log or the job's record.
            assert not storage.exists(storage.join(prefix, storage.LAUNCH_DIR, "launch-1.json"))
            secret = NODE_ENV["AWS_SECRET_ACCESS_KEY"]
            assert secret not in job.logs()
            assert secret not in httpx.get(f"{server.url}/v1/jobs/{job.id}", timeout=30).text
            # What the driver was handed (Ray's job list shows it to every job): the endpoint, no credential.
            handed = [
                (j.runtime_env or {}).get("env_vars") or {}
                for j in RayBackend(ray_head.dashboard_url, auth_token=ray_head.auth_token()).jobs.list_jobs()
                if (j.submission_id or "").startswith(f"raydock-{job.id}-")
            ]
            assert len(handed) == 2, handed
            assert all(e.get("AWS_ENDPOINT_URL_S3") == s3_env["AWS_ENDPOINT_URL_S3"] for e in handed)
            assert not any("AWS_SECRET_ACCESS_KEY" in e or "AWS_ACCESS_KEY_ID" in e for e in handed)
        finally:
            if not job.refresh().status.is_terminal():
                job.cancel()


@pytest.mark.long  # a user-code job of Ray Data reads: RAYDOCK_LONG_TESTS=1
def test_named_datasets_are_read_by_ray_data_from_the_bucket(client: Client, s3_env, s3_server):
    # Tables on a bucket, checkpoints on the session server's local storage: the endpoint
    # reaches the job through its spec's env_vars (nothing secret), the credentials are the
    # nodes' own. (Code shipped from a server whose storage is on S3 is fetched by each node's
    # runtime-env agent in the node's environment, which the session's nodes lack: README.)
    tables = s3_server.fresh_prefix() + "-tables"
    fs, root = object_store.filesystem(tables)
    with fs.open_output_stream(f"{root}/train.parquet") as f:
        regression_table(400, 0).to_parquet(f)
    with fs.open_output_stream(f"{root}/validation.csv") as f:
        f.write(regression_table(100, 1).to_csv(index=False).encode())
    datasets = {
        "train": {"format": "parquet", "path": f"{tables}/train.parquet"},
        "validation": {"format": "csv", "path": f"{tables}/validation.csv"},
    }
    spec = user_spec(REGRESSION, name="tables-on-s3", datasets=datasets, config={"epochs": 3, "lr": 0.2})
    spec["scaling"] = {"num_workers": 2, "cpus_per_worker": 0.5}
    spec["runtime_env"] = {"env_vars": {k: s3_env[k] for k in ("AWS_ENDPOINT_URL_S3", "AWS_REGION")}}
    job = run_to_end(client.submit(spec), 300)
    assert job.status.value == "SUCCEEDED", job.info.error
    series = [p.metrics for p in job.metrics()]
    assert series[-1]["val_loss"] < series[0]["val_loss"] and series[-1]["val_loss"] < 0.1
    assert {m["val_rows"] for m in series} == {100}  # every row of the bucket's validation table


@pytest.mark.long  # a PBT search to its clones: about 2 minutes on 2 cores
def test_a_pbt_clone_on_s3_continues_from_its_donors_checkpoint(s3_server_process, s3_env, tmp_path):
    server, base = s3_server_process
    with Client(server.url) as client:
        job = client.submit(search(algorithm="pbt", pbt={"perturbation_interval": 2}))
        run_to_end(job, 480)
        assert job.status.value == "SUCCEEDED", job.info.error
        lineage = job.lineage()
        assert lineage, "PBT recorded no exploit"
        continued = 0
        for exploit in lineage:
            after = [p for p in job.trial_metrics(exploit.trial_id) if p.seq > exploit.seq]
            if after:  # else the clone ended with the search before its next report
                # The donor's checkpoint, copied on the bucket, is where the clone went on from.
                assert after[0].epoch == exploit.donor_time + 1
                continued += 1
        assert continued
        prefix = storage.job_prefix(base, job.id)
        best = job.best()
        assert best.checkpoint is not None and best.checkpoint.path.startswith(prefix + "/")
        restored = job.download_checkpoint(best.checkpoint.id, dest=tmp_path)
        assert json.loads((restored / "state.json").read_text())["epoch"] == best.metrics["epoch"]
