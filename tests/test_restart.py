"""The API process dies mid-job: the job trains on, and a restarted server reattaches
with every metric and log line exactly once."""

from __future__ import annotations

import time

import httpx

from api.client import Client
from bench.harness.servers import ServerProcess
from bench.harness.waiting import wait_for
from tests.support.specs import user_spec

STEPS = 12


def test_api_killed_mid_job_reattaches(ray_head, tmp_path):
    token = "t0ken-for-tests"
    srv = ServerProcess(tmp_path / "srv", ray_head.dashboard_url, token=token).start()
    try:
        assert httpx.get(srv.url + "/v1/jobs").status_code == 401  # the token is enforced
        client = Client(srv.url, token=token)
        job = client.submit(user_spec("userpkg.steps:train", config={"steps": STEPS, "sleep_s": 0.5}))
        wait_for(lambda: len(job.metrics()) >= 2, 120, "two reports")

        srv.kill()
        time.sleep(3)  # the job keeps training with no API to talk to
        srv.start()

        job.wait(timeout=120)
        assert job.status.value == "SUCCEEDED", job.info.error
        points = job.metrics()
        assert [p.metrics["step"] for p in points] == list(range(1, STEPS + 1))
        assert [p.seq for p in points] == list(range(STEPS))
        logs = job.logs()
        assert logs.count('"type":"metric"') == STEPS  # no line stored twice
        assert logs.count('"type":"result"') == 1
    finally:
        srv.stop()
