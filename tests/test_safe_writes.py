"""The server writes and deletes in storage that jobs write too, and never through what a
job planted there: a real server (real HTTP, SQLite, no Ray) and the same store opened in
this process, where an attempt is prepared and a job preempted exactly as the server's
monitor does (their Ray calls are the only part left out: no Ray here).

Every plant (bench/harness/write_attacks.py) aims at a stand-in for the server's database outside
the storage path; it must keep its bytes, and the server must still write its own file."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from api.cluster_contract import LAUNCH_SHA256_ENV, LAUNCH_URI_ENV
from bench.harness import attacks, code_attacks, write_attacks
from bench.harness.jobstore import set_columns, submit
from bench.harness.write_attacks import DB_BYTES, PLANTS, job_prefix, plant, tree, written_whole
from service.db.models import JobRow, utcnow
from service.events.tokens import token_hash
from service.retention import Policy, Retention
from trainers import launch as driver_launch

DEEP = 3000  # folders in a chain: deeper than a path may be long, and than Python recurses


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    target = attacks.start_target(tmp_path_factory.mktemp("safe-writes"), RAYDOCK_CODE_ROOT="")
    yield target
    target.stop()


def finished_job(target, attempt: int = 1) -> str:
    job_id = submit(target.service, name="planter")
    set_columns(target.service, job_id, status="FAILED", attempt=attempt, finished_at=utcnow())
    return job_id


@pytest.mark.parametrize("how", PLANTS)
def test_a_resumed_jobs_launch_file_is_never_written_through_a_plant(target, tmp_path, how):
    job_id = finished_job(target)
    prefix = job_prefix(target.service, job_id)
    victim = plant(prefix, "_raydock/launch-2.json", how, tmp_path / "outside")
    before = tree(tmp_path / "outside")

    r = httpx.post(f"{target.url}/v1/jobs/{job_id}/resume", timeout=30)
    assert r.status_code == 200, r.text
    prepared = target.service.monitor.attempts.prepare(job_id)  # what the monitor runs next

    assert victim.read_bytes() == DB_BYTES and tree(tmp_path / "outside") == before
    data = written_whole(prefix, "_raydock/launch-2.json")
    launch = json.loads(data)
    with target.service.sessions() as s:
        row = s.get(JobRow, job_id)
        assert launch["job_id"] == job_id and launch["attempt"] == 2 == prepared.attempt
        assert launch["submission_id"] == prepared.submission_id == row.submission_id
        assert token_hash(launch["events_token"]) == row.events_token_hash
        assert hashlib.sha256(data).hexdigest() == row.launch_sha256
    env = prepared.runtime_env["env_vars"]
    assert env[LAUNCH_SHA256_ENV] == row.launch_sha256 and env[LAUNCH_URI_ENV] == prepared.launch_uri
    # A retried submit of the same attempt (its id fixed) reads the file back, and hands the same digest.
    again = target.service.monitor.attempts.prepare(job_id)
    assert again.submission_id == prepared.submission_id
    assert again.runtime_env["env_vars"][LAUNCH_SHA256_ENV] == row.launch_sha256


@pytest.mark.parametrize("how", PLANTS)
def test_a_preemption_marker_is_never_written_through_a_plant(target, tmp_path, how):
    job_id = submit(target.service, name="borrower")
    set_columns(target.service, job_id, status="RUNNING", attempt=3, started_at=utcnow() - timedelta(seconds=5))
    prefix = job_prefix(target.service, job_id)
    victim = plant(prefix, "_raydock/preempt-3", how, tmp_path / "outside")
    before = tree(tmp_path / "outside")

    moved = target.service.monitor.preemptions.preempt([job_id], "owners-job", "owners")

    assert moved == [job_id]
    assert victim.read_bytes() == DB_BYTES and tree(tmp_path / "outside") == before
    assert written_whole(prefix, "_raydock/preempt-3") == b"preempted\n"
    job = httpx.get(f"{target.url}/v1/jobs/{job_id}", timeout=30).json()
    assert job["status"] == "PREEMPTED"


@pytest.mark.parametrize("how", ["folder", "file"])
def test_a_code_upload_is_never_written_through_a_plant(target, tmp_path, how):
    body = code_attacks.package({"main.py": f"# {how}\ndef train(config):\n    pass\n".encode()})
    sha = hashlib.sha256(body).hexdigest()
    storage_root = Path(target.service.settings.storage.resolved_storage_path)
    victim = plant(storage_root, f"_code/{sha}.zip", how, tmp_path / "outside")
    before = tree(tmp_path / "outside")

    sha, r = code_attacks.upload(target.url, body)

    assert r.status_code == 201, r.text
    assert victim.read_bytes() == DB_BYTES and tree(tmp_path / "outside") == before
    assert written_whole(storage_root, f"_code/{sha}.zip") == body
    assert target.service.code.verify(sha)


@pytest.mark.parametrize("by", ["http", "retention"])
def test_deleting_a_job_never_follows_a_link_out_of_its_prefix(target, tmp_path, request, by):
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "dir" / "raydock.db").write_bytes(DB_BYTES)
    (outside / "raydock.db").write_bytes(DB_BYTES)
    inside, whole, deep = finished_job(target), finished_job(target), finished_job(target)
    prefix = job_prefix(target.service, inside)
    (prefix / "ckpt").mkdir(parents=True)
    (prefix / "ckpt" / "model.pt").write_bytes(b"weights")
    (prefix / "ckpt" / "sub").symlink_to(outside / "dir", target_is_directory=True)
    (prefix / "_raydock").symlink_to(outside, target_is_directory=True)
    (prefix / "db").symlink_to(outside / "raydock.db")
    os.link(outside / "raydock.db", prefix / "hard")
    whole_prefix = job_prefix(target.service, whole)
    whole_prefix.symlink_to(outside / "dir", target_is_directory=True)
    deep_prefix = job_prefix(target.service, deep)
    write_attacks.deep_chain(deep_prefix, DEEP, leaf_link=outside / "raydock.db")
    # Left by a failure, the chain would break pytest's own cleanup of its temp dirs (it recurses).
    request.addfinalizer(lambda: subprocess.run(["rm", "-rf", "--", str(deep_prefix)], check=False))
    before = tree(outside)

    if by == "http":
        for job_id in (inside, whole, deep):
            r = httpx.delete(f"{target.url}/v1/jobs/{job_id}", timeout=30)
            assert r.status_code == 204, r.text
    else:
        storage_path = target.service.settings.storage.resolved_storage_path
        retention = Retention(target.service.sessions, storage_path, Policy(days=7))
        assert sorted(retention.delete_batch([inside, whole, deep])) == sorted([inside, whole, deep])

    assert tree(outside) == before
    assert not any(os.path.lexists(p) for p in (prefix, whole_prefix, deep_prefix))


def test_a_driver_refuses_a_launch_file_rewritten_after_the_server_wrote_it(tmp_path, monkeypatch):
    launch = {
        "job_id": "j1",
        "attempt": 1,
        "submission_id": "raydock-j1-1-abc",
        "storage_path": str(tmp_path),
        "spec": {"kind": "train"},
    }
    data = json.dumps(launch).encode()
    path = tmp_path / "launch-1.json"
    monkeypatch.setenv(LAUNCH_URI_ENV, str(path))
    monkeypatch.setenv(LAUNCH_SHA256_ENV, hashlib.sha256(data).hexdigest())
    path.write_bytes(data)
    assert driver_launch.read_launch.__wrapped__().job_id == "j1"  # as written: taken

    rewritten = {**launch, "spec": {"kind": "train", "entrypoint": "theirs:train"}, "events_url": "http://x"}
    path.write_text(json.dumps(rewritten))
    with pytest.raises(driver_launch.LaunchAltered) as refused:
        driver_launch.read_launch.__wrapped__()
    assert LAUNCH_SHA256_ENV in str(refused.value) and str(path) in str(refused.value)


def test_the_plants_reach_their_victims_when_followed(tmp_path):
    """The attack is real: writing by name, as a careless server would, lands on the stand-in."""
    for how in ("prefix", "folder", "file", "hard_link"):
        victim = plant(tmp_path / how / "job", "_raydock/launch-2.json", how, tmp_path / how / "outside")
        (tmp_path / how / "job" / "_raydock" / "launch-2.json").write_bytes(b"{}")
        assert victim.read_bytes() == b"{}", how
    assert write_attacks.PLANTS[-1] == "directory"
