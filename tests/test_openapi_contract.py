"""The OpenAPI document is the contract: schemathesis walks the live server through it
(explicit examples, the coverage phase's boundary and negative values, random fuzzing,
and stateful sequences that follow the links from ``POST /v1/jobs`` to real job ids)
and every check must hold: no 5xx, every status and content type documented, every
body matching its schema, schema-invalid input refused with a 4xx, a deleted job gone,
``Allow`` on every 405.

The server's Ray address is a port where no dashboard answers, so the jobs the run
submits stay QUEUED and never load the session cluster; the tests below check first
that such a server still validates submissions and answers the cluster route with a
documented 503."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from service.cluster.local_cluster import free_ports

ROOT = Path(__file__).resolve().parent.parent
HOOKS = Path(__file__).parent / "support" / "openapi_hooks.py"

# Per operation, what the contract allows beyond schemathesis' defaults, and why.
CONFIG = textwrap.dedent(
    """
    # No Ray dashboard answers this server: the cluster route's documented 503 is the answer.
    [[operations]]
    include-operation-id = "get_cluster"
    checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "503"]

    # A list cursor is opaque: only the `next` of a page the server handed out is one, so a
    # schema-valid made-up cursor is refused (422 invalid_cursor).
    [[operations]]
    include-operation-id = "list_jobs"
    checks.positive_data_acceptance.expected-statuses = ["2xx", "422"]

    # A job spec can be valid JSON Schema and still be refused (422, with the field named):
    # rules across fields ("exactly one of model or entrypoint") and facts only the server
    # can check (the entrypoint's module exists in working_dir) are not JSON Schema.
    [[operations]]
    include-operation-id = "submit_job"
    checks.positive_data_acceptance.expected-statuses = ["2xx", "409", "422"]

    # A schedule valid to the schema can still be refused: a cron that never fires or an
    # unknown time zone (422), a made-up project (404), past the project's cap (429).
    [[operations]]
    include-operation-id = "create_schedule"
    checks.positive_data_acceptance.expected-statuses = ["2xx", "404", "409", "422", "429"]

    # A pipeline valid to the schema can still be refused (422): its steps' job specs are
    # checked as POST /v1/jobs checks them, and an init_from names a job or a step, not both.
    [[operations]]
    include-operation-id = "submit_pipeline"
    checks.positive_data_acceptance.expected-statuses = ["2xx", "404", "409", "422", "429"]

    # Stateful sequences stay on the jobs' links (a pipeline's steps are jobs, and a
    # schema-valid pipeline is mostly refused, so its links rarely reach a real id).
    [[operations]]
    include-operation-id-regex = "^(submit_pipeline|get_pipeline|cancel_pipeline|resume_pipeline)$"
    phases.stateful.enabled = false

    # Any bytes are a valid body to the schema; the server refuses those that are not a
    # package named by their sha256 (422), or too large (413); a made-up project is a 404.
    [[operations]]
    include-operation-id = "put_code"
    checks.positive_data_acceptance.expected-statuses = ["2xx", "404", "413", "422"]

    # A user made here would end local mode (then every request needs a token): the users
    # routes are walked by tests/test_tenancy_matrix.py instead.
    [[operations]]
    include-operation-id = "create_user"
    enabled = false

    # Names are valid to the schema and still taken (409) or unknown (404), or the last admin.
    [[operations]]
    include-operation-id-regex = "^(create_project|delete_user|list_tokens|revoke_token|set_member|remove_member)$"
    checks.positive_data_acceptance.expected-statuses = ["2xx", "404", "409"]

    # The same, and a lifetime the schema allows can be longer than this server's
    # RAYDOCK_MAX_TOKEN_TTL_DAYS (422 token_lifetime_too_long).
    [[operations]]
    include-operation-id = "create_token"
    checks.positive_data_acceptance.expected-statuses = ["2xx", "404", "409", "422"]
    """
)


@pytest.fixture(scope="module")
def contract_server(tmp_path_factory):
    dead_ray = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens: jobs stay QUEUED
    server = ServerProcess(tmp_path_factory.mktemp("contract"), dead_ray).start()
    yield server
    server.stop()


def test_server_without_cluster_validates_and_queues(contract_server):
    http = httpx.Client(base_url=contract_server.url, timeout=30)
    bad = http.post("/v1/jobs", json=digits_spec(batch_size="large"))
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_spec"
    ok = http.post("/v1/jobs", json=digits_spec(name="contract-queued"))
    assert ok.status_code == 202, ok.text
    assert ok.json()["status"] == "QUEUED"
    cluster = http.get("/v1/cluster")
    assert cluster.status_code == 503
    assert cluster.json()["error"]["code"] == "cluster_unavailable"
    assert http.post(f"/v1/jobs/{ok.json()['id']}/cancel").json()["status"] == "CANCELLED"


@pytest.mark.slow
def test_schemathesis_finds_no_mismatch(contract_server, tmp_path):
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    cmd = [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file",
        str(config),
        "run",
        f"{contract_server.url}/openapi.json",
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        "12",
        "--workers",
        "1",
        "--seed",
        "20",
        "--request-timeout",
        "20",
        "--no-color",
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS), "NO_COLOR": "1"}
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=480)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-12000:]
    for phase in ("Coverage", "Fuzzing", "Stateful"):  # each phase ran and passed (none skipped)
        assert re.search(rf"✅ {phase}\b", report), report[-4000:]
    assert re.search(r"API Links:\s+[1-9]\d* covered", report), report[-4000:]  # sequences reached real job ids
