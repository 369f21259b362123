"""Attacks on the HTTP server by anyone who reaches its port: half-sent requests held
open (slowloris), which once took every file descriptor so that the server answered
nothing, /healthz included."""

from __future__ import annotations

import json
import time
from contextlib import ExitStack

import httpx
import pytest
from sqlalchemy import select

from bench.harness import attacks, http_attacks
from bench.harness.attacks import SEARCH
from bench.harness.jobstore import job_service, set_columns, submit
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from service.db.models import JobRow

# Each test starts servers of its own and takes seconds: out of the fast command.
pytestmark = pytest.mark.slow


def test_healthz_answers_while_1100_half_sent_requests_are_held(tmp_path):
    # 1024 descriptors: the common default, and fewer than the attacker's connections.
    server = http_attacks.start_server(tmp_path, nofile=1024)
    try:
        # A liveness limit, not a speed bound: bench/abuse_http.py holds the answer to its 3 s.
        f = http_attacks.slowloris(server, connections=1100, healthz_timeout=60.0)
        print(f"\n/healthz under {f.connections} half-sent requests: {f.healthz_s:.2f} s; server fds: {f.server_fds}")
        assert f.healthz_answered
        assert f.server_fds < 1024
        assert httpx.get(server.url + "/healthz", timeout=60).status_code == 200  # and after the attackers have gone
    finally:
        server.stop()


def test_a_request_head_that_never_ends_is_answered_408_and_closed(tmp_path):
    server = http_attacks.start_server(tmp_path, RAYDOCK_HEADER_TIMEOUT_S="1")
    try:
        took, answer = http_attacks.head_timeout(server, wait=30.0)
        print(f"\nhalf-sent head closed after {took:.2f} s: {answer[:40]!r} (bound in bench/abuse_http.py)")
        assert answer.startswith(b"HTTP/1.1 408")
        assert b'"request_timeout"' in answer
    finally:
        server.stop()


def test_without_a_token_a_peer_off_loopback_is_refused_whatever_the_configured_host(tmp_path):
    address = http_attacks.own_address()
    if address is None:
        pytest.skip("this machine has no address besides loopback")
    server = http_attacks.start_on_every_interface(tmp_path)  # settings: 127.0.0.1, no token; socket: 0.0.0.0
    try:
        # The Host header names loopback, as a DNS-rebinding page or a hand-made request would.
        r = httpx.get(f"http://{address}:{server.port}/v1/jobs", headers={"Host": "127.0.0.1"}, timeout=10)
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "peer_not_allowed"
        assert "RAYDOCK_API_TOKEN" in r.json()["error"]["message"]
        assert httpx.get(f"{server.url}/v1/jobs", timeout=10).status_code == 200  # loopback still served
    finally:
        server.stop()


def test_the_api_document_needs_the_token(tmp_path):
    server = http_attacks.start_server(tmp_path, RAYDOCK_API_TOKEN="s3cret")
    try:
        for path in ("/openapi.json", "/docs", "/redoc"):
            r = httpx.get(server.url + path, timeout=10)
            assert r.status_code == 401, (path, r.status_code)
            assert r.json()["error"]["code"] == "unauthorized"
        r = httpx.get(server.url + "/openapi.json", headers={"Authorization": "Bearer s3cret"}, timeout=10)
        assert r.status_code == 200 and "/v1/jobs" in r.json()["paths"]
        assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
    finally:
        server.stop()


def test_open_docs_serves_the_api_document_without_the_token(tmp_path):
    server = http_attacks.start_server(tmp_path, RAYDOCK_API_TOKEN="s3cret", RAYDOCK_OPEN_DOCS="true")
    try:
        assert httpx.get(server.url + "/openapi.json", timeout=10).status_code == 200
        assert httpx.get(server.url + "/v1/jobs", timeout=10).status_code == 401
    finally:
        server.stop()


def test_a_request_without_the_token_is_refused_before_its_body_is_read(tmp_path):
    server = http_attacks.start_server(tmp_path, RAYDOCK_API_TOKEN="s3cret")
    try:
        took, answer = http_attacks.unauthenticated_post_answer(server, wait=30.0)
        print(f"\nPOST without the token, body never sent: answered after {took:.2f} s (bound in bench/abuse_http.py)")
        assert answer.startswith(b"HTTP/1.1 401"), answer[:100]  # an answer at all: the body never came
    finally:
        server.stop()


def nested(depth: int) -> dict:
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value  # type: ignore[return-value]


def test_free_form_json_too_deep_or_too_large_is_refused_at_validation(tmp_path):
    server = http_attacks.start_server(tmp_path)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for field, value in (("config", nested(900)), ("config", {"xs": [0] * 100_001})):
                r = client.post("/v1/jobs", json=digits_spec(**{field: value}))
                assert r.status_code == 422, r.text[:300]
                err = r.json()["error"]
                assert err["code"] == "invalid_spec"
                assert err["details"][0]["loc"] == field, err
                assert "levels deep" in err["message"] or "values" in err["message"]
            search = {
                **SEARCH,
                "search_space": {"optimizer.lr": {"type": "choice", "values": [0.01, nested(900)]}},
            }
            r = client.post("/v1/jobs", json=search)
            assert r.status_code == 422 and "levels deep" in r.json()["error"]["message"], r.text[:300]
            assert client.post("/v1/jobs", json=digits_spec(config=nested(31))).status_code == 202
            assert client.get("/healthz").status_code == 200
    finally:
        server.stop()


def test_streams_past_the_servers_cap_get_429(tmp_path):
    target = attacks.start_target(tmp_path, RAYDOCK_MAX_STREAMS="3")
    try:
        job_id = target.running_job()  # RUNNING: its streams stay open until it ends
        base = f"{target.url}/v1/jobs/{job_id}"
        with ExitStack() as stack:
            client = stack.enter_context(httpx.Client(timeout=30))
            opened = []
            for url in (f"{base}/logs?follow=true", f"{base}/metrics/stream", f"{base}/logs?follow=1"):
                r = stack.enter_context(client.stream("GET", url))
                opened.append(r.status_code)
            refused = []
            for url in (f"{base}/metrics/stream", f"{base}/logs?follow=TRUE"):
                r = stack.enter_context(client.stream("GET", url))  # the answer's head, not a body that never ends
                refused.append(r)
            print(f"\nstreams open: {opened}; past the cap: {[r.status_code for r in refused]}")
            assert opened == [200, 200, 200]
            for r in refused:
                assert r.status_code == 429
                assert json.loads(r.read())["error"]["code"] == "too_many_streams"
                assert r.headers["Retry-After"]
            assert client.get(f"{base}/logs").status_code == 200  # a plain read is no stream
        # Slots come back once the server sees the streams closed (at its next poll of each).
        deadline, status = time.monotonic() + 10, None
        while status != 200 and time.monotonic() < deadline:
            with httpx.stream("GET", f"{base}/metrics/stream", timeout=30) as r:
                status = r.status_code
            time.sleep(0.2)
        assert status == 200
    finally:
        target.stop()


def test_bulk_cancel_returns_at_once_while_the_ray_dashboard_hangs(tmp_path):
    with ExitStack() as stack:
        hung = http_attacks.hung_dashboard(stack)
        url = f"sqlite:///{tmp_path / 'raydock.db'}"
        service = job_service(url, tmp_path)
        ids = [submit(service) for _ in range(40)]
        for i, job_id in enumerate(ids):  # running on the cluster, each with its Ray job
            set_columns(service, job_id, status="RUNNING", attempt=1, ray_job_id=f"raysubmit_{i}")
        server = ServerProcess(tmp_path, hung, extra_env={"RAYDOCK_DATABASE_URL": url}).start()
        stack.callback(server.stop)
        took, r = http_attacks.bulk_cancel_s(server.url, ids, timeout=60.0)
        print(f"\nPOST /v1/jobs:cancel of 40 running jobs, dashboard hung: {took:.2f} s (bound in bench/abuse_http.py)")
        # Answered before the client's 60 s: a cancel that waited on the hung dashboard
        # (10 s a call) for 40 jobs would not be.
        assert r is not None and r.status_code == 200, r and r.text
        assert sorted(r.json()["cancelled"]) == sorted(ids)
        with service.sessions() as s:
            statuses = set(s.scalars(select(JobRow.status).where(JobRow.id.in_(ids))))
        assert statuses == {"CANCELLING"}  # the monitor stops each Ray job; it stays tracked until it has
        assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
