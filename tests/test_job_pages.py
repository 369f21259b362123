"""GET /v1/jobs over real HTTP: keyset pages through the SDK and the CLI, bad cursors
and limits refused with a code, the stored queue position, and the background retention
sweep of a running server. The server points at a port where no Ray dashboard answers,
so its jobs stay QUEUED (cancelled ones are finished)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from api.client import Client
from api.errors import InvalidSpec, NotFound
from bench.harness.jobstore import dead_ray
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from bench.harness.waiting import wait_for


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {"RAYDOCK_RETENTION_MAX_FINISHED": "2", "RAYDOCK_RETENTION_INTERVAL_S": "0.3"}
    proc = ServerProcess(tmp_path_factory.mktemp("pages"), dead_ray(), extra_env=env).start()
    yield proc
    proc.stop()


def test_sdk_and_cli_follow_the_cursor_through_every_page(server):
    with Client(server.url) as client:
        mine = [client.submit(digits_spec(name=f"page{i}", labels={"suite": "a=b"})).id for i in range(7)]
        first = client.list(labels={"suite": "a=b"}, limit=3)
        assert [j.id for j in first.items] == mine[::-1][:3] and first.total == 7 and first.next
        assert [j.id for j in client.iter_jobs(labels={"suite": "a=b"}, page_size=2)] == mine[::-1]
    env = {**os.environ, "RAYDOCK_URL": server.url, "COLUMNS": "200"}
    out = subprocess.run(
        [sys.executable, "-m", "service.cli", "list", "--label", "suite=a=b", "--limit", "5", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert [j["id"] for j in json.loads(out.stdout)["items"]] == mine[::-1][:5]


def test_bad_cursors_and_limits_are_request_errors(server):
    http = httpx.Client(base_url=server.url)
    for params, code in (
        ({"cursor": "not-a-cursor"}, "invalid_cursor"),
        ({"cursor": "WyJ4Il0"}, "invalid_cursor"),  # valid base64 of the wrong JSON
        ({"cursor": "x" * 201}, "invalid_request"),
        ({"limit": 0}, "invalid_request"),
        ({"limit": 1001}, "invalid_request"),
        ({"limit": "ten"}, "invalid_request"),
    ):
        r = http.get("/v1/jobs", params=params)
        assert r.status_code == 422, (params, r.text)
        assert r.json()["error"]["code"] == code, params
    with Client(server.url) as client, pytest.raises(InvalidSpec) as err:
        client.list(cursor="bad")
    assert err.value.code == "invalid_cursor"
    # NUL cannot be stored in PostgreSQL text: refused in a label and in a label filter.
    r = http.post("/v1/jobs", json=digits_spec(name="nul", labels={"k": "a\x00b"}))
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_spec", r.text
    r = http.get("/v1/jobs", params={"label": "k=a\x00b"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text


def test_many_jobs_cancel_in_one_request_with_bounds(server):
    with Client(server.url) as client:
        ids = [client.submit(digits_spec(name=f"many{i}")).id for i in range(3)]
        result = client.cancel_many([*ids, "jnosuchjob"])
        assert result.cancelled == ids and [r.code for r in result.refused] == ["job_not_found"]
        assert {client.job(i).status.value for i in ids} == {"CANCELLED"}
    http = httpx.Client(base_url=server.url)
    for body in ({"ids": []}, {"ids": ["j1"] * 1001}, {"ids": ["../etc"]}, {"ids": ["j1"], "all": True}):
        r = http.post("/v1/jobs:cancel", json=body)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text


def test_a_queued_job_shows_its_stored_place_and_the_queue_moves_up_on_cancel(server):
    with Client(server.url) as client:
        low = client.submit(digits_spec(name="low"))
        high = client.submit(digits_spec(name="high", priority=9))
        wait_for(lambda: high.refresh().info.queue_position == 1, 10, "the monitor to store positions")
        before = low.refresh().info.queue_position
        high.cancel()
        assert high.info.queue_position is None
        # Within a tick or two, or at the latest the monitor's full pass (queue_keeper.FULL_PASS_S): a job
        # cancelled and swept by retention before a tick sees it leaves no trace for the
        # incremental pass (known; see the issue notes).
        wait_for(lambda: low.refresh().info.queue_position == before - 1, 45, "the queue to move up")
        assert "waiting for the Ray cluster" in low.info.status_reason


def test_the_server_sweeps_finished_jobs_past_its_policy_in_the_background(server):
    with Client(server.url) as client:
        jobs = [client.submit(digits_spec(name=f"old{i}")) for i in range(3)]
        for job in jobs:
            job.cancel()  # CANCELLED: finished, in this order
        wait_for(lambda: _gone(client, jobs[0].id), 20, "the oldest finished job to be deleted")
        assert [j.refresh().status.value for j in jobs[1:]] == ["CANCELLED", "CANCELLED"]  # the newest 2 stay
        queued = client.submit(digits_spec(name="still-queued"))
        time.sleep(1.0)  # several sweeps
        assert queued.refresh().status.value == "QUEUED"


def _gone(client: Client, job_id: str) -> bool:
    try:
        client.job(job_id)
    except NotFound:
        return True
    return False
