"""The HTTP surface refuses what it cannot serve, with a 4xx in raydock's error body and
nothing stored: one test per attack, over real HTTP against real server processes.

The servers here point at a port where no Ray dashboard answers: nothing in these
tests needs a job to run, and their jobs stay QUEUED. Only ``raydock run`` uses the
session's Ray head, since following a job to its end is what it is for."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
import yaml

from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from service.cluster.local_cluster import free_ports

TOKEN = "s3cret-token"
SMALL_LIMIT = 4096
INT64_MAX = 2**63 - 1


def dead_ray() -> str:
    return f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there


@pytest.fixture(scope="module")
def open_server(tmp_path_factory):
    """Loopback, no API token, the default body limit."""
    server = ServerProcess(tmp_path_factory.mktemp("open"), dead_ray()).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    """An API token, and a small body limit set through the environment."""
    env = {"RAYDOCK_MAX_REQUEST_BYTES": str(SMALL_LIMIT)}
    server = ServerProcess(tmp_path_factory.mktemp("token"), dead_ray(), token=TOKEN, extra_env=env).start()
    yield server
    server.stop()


def http(server: ServerProcess, token: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def total(server: ServerProcess, token: str | None = None) -> int:
    return http(server, token).get("/v1/jobs").json()["total"]


def assert_error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["code"] == code and err["message"]
    return err


def test_foreign_host_is_refused_on_loopback_without_token(open_server):
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1."""
    client = http(open_server)
    before = total(open_server)
    for host in ("evil.example", f"evil.example:{open_server.port}", "127.0.0.1.nip.io", ""):
        err = assert_error(client.get("/v1/jobs", headers={"Host": host}), 400, "host_not_allowed")
        assert "RAYDOCK_API_TOKEN" in err["message"]
    assert_error(client.post("/v1/jobs", json=digits_spec(), headers={"Host": "evil.example"}), 400, "host_not_allowed")
    assert_error(client.get("/docs", headers={"Host": "evil.example"}), 400, "host_not_allowed")
    assert total(open_server) == before
    for host in (
        "localhost",
        f"LOCALHOST:{open_server.port}",
        "127.0.0.1",
        f"127.0.0.1:{open_server.port}",
        "[::1]:8000",
    ):
        assert client.get("/v1/jobs", headers={"Host": host}).status_code == 200, host


def test_any_host_is_served_when_the_token_guards_the_api(token_server):
    r = http(token_server, TOKEN).get("/v1/jobs", headers={"Host": "raydock.internal:8000"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "authorization",
    [
        b"Bearer \xc3\xa9",
        b"Bearer " + TOKEN.encode() + b"\xc3\xa9",
        "Bearer",
        "Basic " + TOKEN,
        "Bearer wrong",
        TOKEN,
        "Bearer  " + TOKEN + " x",
    ],
    ids=["non-ascii", "token-plus-non-ascii", "no-token", "basic", "wrong", "no-scheme", "trailing-junk"],
)
def test_malformed_or_wrong_authorization_is_401(token_server, authorization):
    r = httpx.get(token_server.url + "/v1/jobs", headers={"Authorization": authorization})
    assert_error(r, 401, "unauthorized")


def test_right_token_is_accepted(token_server):
    assert http(token_server, TOKEN).get("/v1/jobs").status_code == 200
    assert httpx.get(token_server.url + "/v1/jobs").status_code == 401


def test_events_push_with_non_ascii_token_is_401(open_server):
    job = http(open_server).post("/v1/jobs", json=digits_spec(name="push-target")).json()
    url = f"{open_server.url}/v1/internal/jobs/{job['id']}/events"
    event = {"type": "metric", "seq": 0, "ts": 1.0, "metrics": {"loss": 1.0}}
    for authorization in (b"Bearer \xc3\xa9", "Bearer", "Basic abc", "Bearer wrong"):
        assert_error(httpx.post(url, json=event, headers={"Authorization": authorization}), 401, "unauthorized")
    assert http(open_server).get(f"/v1/jobs/{job['id']}/metrics").json() == []


def test_integers_beyond_int64_are_refused_as_request_errors(open_server):
    client = http(open_server)
    job_id = client.post("/v1/jobs", json=digits_spec(name="ints")).json()["id"]
    big = 2**70
    for path in (
        f"/v1/jobs/{job_id}/metrics?since={big}",
        f"/v1/jobs/{job_id}/metrics?since={-big}",
        f"/v1/jobs/{job_id}/checkpoints/{big}/download",
        f"/v1/jobs/{job_id}/logs?offset={big}",
        f"/v1/jobs?offset={big}",
        f"/v1/jobs/{job_id}/trials/t1/metrics?since={big}",
    ):
        err = assert_error(client.get(path), 422, "invalid_request")
        assert err["message"].startswith("The request is invalid.") and "job spec" not in err["message"], path
        assert err["details"][0]["loc"].split(".")[0] in ("query", "path"), err
    assert client.get(f"/v1/jobs/{job_id}/metrics?since={INT64_MAX}").json() == []
    assert_error(client.get(f"/v1/jobs/{job_id}/checkpoints/{INT64_MAX}/download"), 404, "not_found")


def test_query_and_header_errors_name_the_request(open_server):
    client = http(open_server)
    err = assert_error(client.get("/v1/jobs?limit=abc"), 422, "invalid_request")
    assert "query.limit" in err["message"]
    assert_error(client.get("/v1/jobs", params={"label": "no-equals-sign"}), 422, "invalid_request")
    err = assert_error(
        client.post("/v1/jobs", json=digits_spec(), headers={"Idempotency-Key": "k" * 201}), 422, "invalid_request"
    )
    assert "header.idempotency-key" in err["message"]
    assert_error(client.get("/v1/jobs/bad id!"), 422, "invalid_request")
    body = assert_error(client.post("/v1/jobs", json=digits_spec(batch_size="large")), 422, "invalid_spec")
    assert body["message"].startswith("The job spec is invalid.")


def test_body_over_the_limit_is_413_without_reading_it(open_server, token_server):
    big = {"name": "big", "config": {"blob": "x" * (2 << 20)}}  # 2 MiB: over the default 1 MiB
    before = total(open_server)
    err = assert_error(http(open_server).post("/v1/jobs", json=big), 413, "request_too_large")
    assert "RAYDOCK_MAX_REQUEST_BYTES" in err["message"]

    def chunks():  # no Content-Length: the limit holds on the bytes as they arrive
        for _ in range(40):
            yield b"x" * 65536

    r = http(open_server).post("/v1/jobs", content=chunks(), headers={"Content-Type": "application/json"})
    assert_error(r, 413, "request_too_large")
    assert total(open_server) == before

    small = http(token_server, TOKEN)
    assert_error(
        small.post("/v1/jobs", json={"name": "x", "config": {"blob": "x" * SMALL_LIMIT}}), 413, "request_too_large"
    )
    assert small.post("/v1/jobs", json=digits_spec(name="fits")).status_code == 202


def test_framework_refusals_come_in_raydock_format(open_server):
    client = http(open_server)
    err = assert_error(client.get("/v1/no-such-route"), 404, "not_found")
    assert "/docs" in err["message"]
    r = client.put("/v1/jobs/j123")
    assert_error(r, 405, "method_not_allowed")
    assert r.headers["allow"] == "DELETE, GET"
    r = client.patch("/v1/jobs")
    assert_error(r, 405, "method_not_allowed")
    assert r.headers["allow"] == "GET, POST"
    r = client.post("/v1/jobs", content=b'{"name": "\xff\xfe"}', headers={"Content-Type": "application/json"})
    assert_error(r, 400, "bad_request")
    r = client.post("/v1/jobs", content=b'{"name": "x", ', headers={"Content-Type": "application/json"})
    assert_error(r, 422, "invalid_json")


def test_raydock_run_works_with_an_api_token(ray_head, tmp_path):
    spec = digits_spec(name="run-with-token", epochs=1, scaling={"num_workers": 1})
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    env = {
        **os.environ,
        "RAY_ADDRESS": ray_head.dashboard_url,
        "RAYDOCK_DATA_DIR": str(tmp_path / "data"),
        "RAYDOCK_API_TOKEN": TOKEN,
    }
    run = subprocess.run(
        [sys.executable, "-m", "service.cli", "run", str(spec_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "latest checkpoint" in run.stdout


def test_streams_of_a_deleted_job_are_404_and_a_train_job_has_no_trials(open_server):
    c = http(open_server)
    job_id = c.post("/v1/jobs", json=digits_spec(name="stream-then-delete")).json()["id"]
    assert_error(c.get(f"/v1/jobs/{job_id}/lineage"), 409, "not_a_search")
    assert c.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "CANCELLED"
    assert c.delete(f"/v1/jobs/{job_id}").status_code == 204
    # A streaming route answers before its stream opens: 404, not an empty 200.
    assert_error(c.get(f"/v1/jobs/{job_id}/metrics/stream"), 404, "job_not_found")
    assert_error(c.get(f"/v1/jobs/{job_id}/logs", params={"follow": "true"}), 404, "job_not_found")
