"""Bad input gets a 4xx with a machine-readable code and a message that says what to
change, and nothing is stored."""

from __future__ import annotations

import httpx
import pytest

from api.client import Client
from api.errors import CapacityExceeded, InvalidSpec, NotFound
from bench.harness.specs import digits_spec
from service.runtime import build_runtime
from service.settings import Settings
from tests.support.session import CLUSTER_CPUS
from tests.support.specs import user_spec


def bad(**changes) -> dict:
    spec = digits_spec()
    for key, value in changes.items():
        spec[key] = value
    return spec


CASES = [
    ("unknown field", bad(learning_rate=0.1), 422, "invalid_spec", "learning_rate"),
    ("wrong type", bad(batch_size="large"), 422, "invalid_spec", "batch_size"),
    ("negative workers", bad(scaling={"num_workers": -2}), 422, "invalid_spec", "scaling.num_workers"),
    (
        "nested typo",
        bad(optimizer={"name": "adam", "learning_rate": 1}),
        422,
        "invalid_spec",
        "optimizer.learning_rate",
    ),
    ("both model and entrypoint", bad(entrypoint="a.b:c"), 422, "invalid_spec", "exactly one of"),
    ("entrypoint form", user_spec("not a module"), 422, "invalid_spec", "package.module:function"),
    ("missing module", user_spec("userpkg.nothere:train"), 422, "entrypoint_not_found", "userpkg.nothere"),
    (
        "missing working_dir",
        user_spec("userpkg.steps:train", working_dir="/no/such/dir"),
        422,
        "working_dir_not_found",
        "/no/such/dir",
    ),
    (
        "more workers than the cluster",
        bad(scaling={"num_workers": CLUSTER_CPUS + 1}),
        422,
        "exceeds_cluster_capacity",
        "scaling.num_workers",
    ),
    (
        "a GPU the cluster lacks",
        bad(scaling={"num_workers": 1, "use_gpu": True}),
        422,
        "exceeds_cluster_capacity",
        "GPU",
    ),
]


@pytest.mark.parametrize("what,body,status,code,hint", CASES, ids=[c[0] for c in CASES])
def test_bad_spec_is_refused_and_not_stored(server, what, body, status, code, hint):
    http = httpx.Client(base_url=server.url, timeout=30)
    before = http.get("/v1/jobs").json()["total"]
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code
    assert hint in err["message"]
    assert http.get("/v1/jobs").json()["total"] == before


def test_malformed_json_is_refused(server):
    r = httpx.post(server.url + "/v1/jobs", content=b'{"name": "x", ', headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "invalid_json"
    assert "not valid JSON" in r.json()["error"]["message"]


def test_sdk_raises_typed_errors(client: Client):
    with pytest.raises(CapacityExceeded) as excinfo:
        client.submit(bad(scaling={"num_workers": 64}))
    assert excinfo.value.status == 422
    assert "Lower scaling.num_workers" in excinfo.value.message
    with pytest.raises(NotFound) as missing:
        client.job("j-does-not-exist")
    assert missing.value.code == "job_not_found"
    with pytest.raises(InvalidSpec) as invalid:
        client.submit(user_spec("userpkg.nothere:train"))
    assert invalid.value.code == "entrypoint_not_found"


def test_unknown_job_routes_are_404(server):
    http = httpx.Client(base_url=server.url)
    for method, path in [
        ("GET", "/v1/jobs/nope"),
        ("POST", "/v1/jobs/nope/cancel"),
        ("DELETE", "/v1/jobs/nope"),
        ("GET", "/v1/jobs/nope/metrics"),
        ("GET", "/v1/jobs/nope/checkpoints"),
    ]:
        r = http.request(method, path)
        assert r.status_code == 404, (method, path)
        assert r.json()["error"]["code"] == "job_not_found"


def test_server_refuses_public_address_without_token(tmp_path):
    with pytest.raises(SystemExit) as excinfo:
        build_runtime(
            Settings(
                http={"host": "0.0.0.0"}, storage={"data_dir": tmp_path}, cluster={"ray_address": "http://127.0.0.1:1"}
            )
        )
    assert "RAYDOCK_API_TOKEN" in str(excinfo.value)
