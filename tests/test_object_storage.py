"""What lives on storage, on a local directory and on a real S3 endpoint (moto's server,
tests/support/object_store.py), with no Ray: the server's writes under a job's prefix and their
key rules, launch files, preemption markers, code packages, checkpoint listing and
download through the API, job deletion and retention."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from datetime import timedelta

import httpx
import pytest
from pydantic import ValidationError

from api import object_store
from api.cluster_contract import LAUNCH_SHA256_ENV, LAUNCH_URI_ENV
from api.schemas.launch import LaunchFile
from bench.harness.attacks import start_target
from bench.harness.download_attacks import download_path
from bench.harness.jobstore import job_service, set_columns, submit
from service.cluster.local_cluster import head_env, storage_env
from service.db.event_models import CheckpointRow
from service.db.models import utcnow
from service.files import storage
from service.retention import Policy, Retention
from service.scheduling.preemption import marker_name, marker_uri
from service.settings import Settings
from trainers import launch as driver_launch
from trainers.preemption import marker_exists


@pytest.fixture()
def service(storage_base, tmp_path):
    svc = job_service(f"sqlite:///{tmp_path / 'store.db'}", tmp_path / "data", storage_path=storage_base)
    yield svc
    svc.sessions.kw["bind"].dispose()


def test_the_driver_is_handed_the_endpoint_and_region_only_for_an_object_store(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://10.0.0.5:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "never-handed-on")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    on_s3 = Settings(storage={"storage_path": "s3://bucket/prefix"}).storage.object_store_env
    local = Settings(storage={"storage_path": "/srv/storage"}).storage.object_store_env
    assert on_s3 == {"AWS_ENDPOINT_URL_S3": "http://10.0.0.5:9000", "AWS_REGION": "eu-west-1"}
    assert local == {}
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://user:secret@10.0.0.5:9000")  # would show in Ray's job list
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert "AWS_ENDPOINT_URL_S3" in str(refused.value)


def test_a_local_head_gets_the_stores_variables_only_when_storage_is_that_store(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "node-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "node-secret")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/etc/gcs.json")
    monkeypatch.setenv("RAYDOCK_API_TOKEN", "stays-with-the-server")
    on_s3 = storage_env("s3://bucket/prefix")
    assert on_s3["AWS_ACCESS_KEY_ID"] == "node-key" and on_s3["AWS_SECRET_ACCESS_KEY"] == "node-secret"
    assert all(k.startswith("AWS_") for k in on_s3)
    assert storage_env("gs://bucket/prefix")["GOOGLE_APPLICATION_CREDENTIALS"] == "/etc/gcs.json"
    assert not [k for k in storage_env("gs://bucket/prefix") if k.startswith("AWS_")]
    assert storage_env("/srv/storage") == storage_env("file:///srv/storage") == storage_env(None) == {}
    # What the head is started with: the allowlist, and the store's variables on top.
    head = head_env(storage_env("s3://bucket/prefix"))
    assert head["AWS_SECRET_ACCESS_KEY"] == "node-secret" and "RAYDOCK_API_TOKEN" not in head
    assert "AWS_SECRET_ACCESS_KEY" not in head_env(storage_env("/srv/storage"))


def read(uri: str) -> bytes:
    with storage.open_random_access(uri) as f:
        return f.read()


def test_writes_under_a_prefix_are_read_back_replaced_and_removed(storage_base, tmp_path):
    prefix = storage.job_prefix(storage_base, "j1")
    storage.write_private(prefix, "a/b.bin", b"one")
    storage.write_private(prefix, "a/b.bin", b"two")  # replaced whole
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * (3 << 20))  # more than one chunk of put_file
    storage.put_file(str(src), prefix, "c/big.bin")
    assert read(storage.join(prefix, "a/b.bin")) == b"two"
    assert read(storage.join(prefix, "c/big.bin")) == src.read_bytes()

    storage.remove(prefix, "a")
    assert not storage.exists(storage.join(prefix, "a/b.bin")) and storage.exists(storage.join(prefix, "c/big.bin"))
    storage.remove(prefix)
    assert not storage.exists(prefix)


@pytest.mark.parametrize("key", ["../j2/x", "a/../../j2/x", "a/\x00/x", "/", "k" * 1100])
def test_a_key_that_leaves_its_prefix_is_refused_and_nothing_is_written(storage_base, tmp_path, key):
    prefix, sibling = storage.job_prefix(storage_base, "j1"), storage.job_prefix(storage_base, "j2")
    storage.write_private(sibling, "x", b"theirs")
    src = tmp_path / "src.bin"
    src.write_bytes(b"mine")
    outcomes = []
    for attempt in (
        lambda: storage.write_private(prefix, key, b"mine"),
        lambda: storage.put_file(str(src), prefix, key),
        lambda: storage.remove(prefix, key),
    ):
        try:
            attempt()
            outcomes.append("done")
        except (PermissionError, OSError, ValueError):
            outcomes.append("refused")
    assert outcomes == ["refused"] * 3
    assert read(storage.join(sibling, "x")) == b"theirs"


def test_a_job_prefix_is_inside_its_storage_and_a_sibling_or_other_bucket_is_not(storage_base):
    prefix = storage.job_prefix(storage_base, "j1")
    assert storage.owned(storage.join(prefix, "checkpoint_1"), prefix)
    for outside in (
        storage.join(storage.job_prefix(storage_base, "j10"), "c"),
        storage.join(prefix, "..", "j2", "c"),
        storage.join(prefix, storage.LAUNCH_DIR, "launch-1.json"),
        "s3://another-bucket/j1/c",
        # A URI is read percent-decoded: %2e%2e is a ``..`` there (a local path's is a name).
        *([storage.join(prefix, "%2e%2e", "j2", "c")] if not storage.is_local(storage_base) else []),
    ):
        assert not storage.owned(outside, prefix), outside


def test_a_launch_file_is_read_by_the_driver_once_and_deleted(storage_base, monkeypatch):
    prefix = storage.job_prefix(storage_base, "j1")
    name = f"{storage.LAUNCH_DIR}/launch-1.json"
    data = LaunchFile(
        job_id="j1", attempt=1, submission_id="raydock-j1-1", storage_path=storage_base, spec={"name": "x"}
    ).model_dump_json()
    storage.write_private(prefix, name, data.encode())
    uri = storage.join(prefix, name)
    monkeypatch.setenv(LAUNCH_URI_ENV, uri)
    monkeypatch.setenv(LAUNCH_SHA256_ENV, hashlib.sha256(data.encode()).hexdigest())
    driver_launch.read_launch.cache_clear()
    try:
        launch = driver_launch.take_launch()
    finally:
        driver_launch.read_launch.cache_clear()
    assert (launch.job_id, launch.storage_path, launch.spec) == ("j1", storage_base, {"name": "x"})
    assert not storage.exists(uri)


def test_a_preemption_marker_the_server_writes_is_seen_by_the_loop(storage_base):
    prefix = storage.job_prefix(storage_base, "j1")
    uri = marker_uri(prefix, 2)
    assert not marker_exists(uri)
    storage.write_private(prefix, marker_name(2), b"preempted\n")
    assert marker_exists(uri) and not marker_exists(marker_uri(prefix, 3))


def test_deleting_a_job_removes_its_prefix_and_only_its_own(service):
    mine, theirs = submit(service, name="mine"), submit(service, name="theirs")
    for job_id in (mine, theirs):
        storage.write_private(service.reads.prefix(job_id), "ckpt/model.pt", b"weights")
    set_columns(service, mine, status="SUCCEEDED", finished_at=utcnow())
    service.jobs.delete(mine)
    assert not storage.exists(service.reads.prefix(mine))
    assert storage.exists(storage.join(service.reads.prefix(theirs), "ckpt/model.pt"))


def test_retention_deletes_old_jobs_files_on_the_store(service):
    old, recent = submit(service, name="old"), submit(service, name="recent")
    set_columns(service, old, status="SUCCEEDED", finished_at=utcnow() - timedelta(days=10))
    set_columns(service, recent, status="SUCCEEDED", finished_at=utcnow() - timedelta(days=1))
    for job_id in (old, recent):
        storage.write_private(service.reads.prefix(job_id), "ckpt/model.pt", b"weights")
    retention = Retention(service.sessions, service.settings.storage.resolved_storage_path, Policy(days=7))
    assert retention.sweep() == 1
    assert not storage.exists(service.reads.prefix(old)) and storage.exists(service.reads.prefix(recent))


def test_checkpoints_are_listed_and_downloaded_through_the_api(storage_base, request, tmp_path):
    env = request.getfixturevalue("s3_env") if storage_base.startswith("s3://") else {}
    target = start_target(tmp_path / "data", RAYDOCK_STORAGE_PATH=storage_base, **env)
    try:
        job_id = submit(target.service, name="ckpt")
        prefix = storage.job_prefix(storage_base, job_id)
        files = {"model.pt": b"w" * 1000, "nested/meta.json": b'{"epoch": 1}'}
        for rel, data in files.items():
            storage.write_private(prefix, f"checkpoint_000001/{rel}", data)
        with target.service.sessions.begin() as s:
            kept = CheckpointRow(job_id=job_id, attempt=1, path=storage.join(prefix, "checkpoint_000001"), step=1)
            gone = CheckpointRow(job_id=job_id, attempt=1, path=storage.join(prefix, "checkpoint_000000"), step=0)
            s.add_all([kept, gone])
            s.flush()
            kept_id = kept.id
        listed = httpx.get(f"{target.url}/v1/jobs/{job_id}/checkpoints", timeout=30)
        got = httpx.get(target.url + download_path(job_id, kept_id), timeout=60)
    finally:
        target.server.stop()
        target.service.sessions.kw["bind"].dispose()
    assert listed.status_code == 200, listed.text
    assert [c["id"] for c in listed.json()] == [kept_id]  # the one no longer stored is not listed
    assert got.status_code == 200, got.text
    with tarfile.open(fileobj=io.BytesIO(got.content), mode="r:gz") as tar:
        assert {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()} == files


def test_listing_a_jobs_checkpoints_costs_what_is_stored_not_what_it_reported(service, storage_base, request):
    """A job lists every checkpoint it ever reported, most deleted by ``checkpoint.keep``: on
    an object store one listing of their folder answers which are left, not a lookup each
    (those starved a job's own uploads to the endpoint while a client polled the list); then
    one look into each checkpoint still stored tells whether it is complete."""
    job_id = submit(service, name="many")
    run = storage.join(service.reads.prefix(job_id), job_id)
    kept = {9, 10, 100}  # checkpoint_9 next to checkpoint_90 .. _99: a name that starts another's is not it
    for n in kept:
        storage.write_private(service.reads.prefix(job_id), f"{job_id}/checkpoint_{n}/state.json", b"{}")
    with service.sessions.begin() as s:
        s.add_all(
            CheckpointRow(job_id=job_id, attempt=1, path=storage.join(run, f"checkpoint_{n}"), step=n, epoch=n)
            for n in range(1, 201)
        )
    served = request.getfixturevalue("s3_server").requests_served if not storage.is_local(storage_base) else None
    before = served() if served else 0
    listed = service.reads.checkpoints(job_id)
    assert [c.step for c in listed] == [9, 10, 100]
    if served:
        cost = served() - before
        assert cost <= 2 + len(kept), f"{cost} requests to list 200 checkpoint rows, {len(kept)} of them stored"


def test_a_code_package_is_stored_and_read_back(storage_base, request, tmp_path):
    env = request.getfixturevalue("s3_env") if storage_base.startswith("s3://") else {}
    target = start_target(tmp_path / "data", RAYDOCK_STORAGE_PATH=storage_base, RAYDOCK_CODE_ROOT="", **env)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("code/main.py", "def train(config):\n    pass\n")
    body = buf.getvalue()
    sha = hashlib.sha256(body).hexdigest()
    try:
        put = httpx.put(f"{target.url}/v1/code/{sha}", content=body, timeout=30)
        head = httpx.head(f"{target.url}/v1/code/{sha}", timeout=30)
    finally:
        target.server.stop()
        target.service.sessions.kw["bind"].dispose()
    assert (put.status_code, head.status_code) == (201, 200), put.text
    uri = storage.join(storage_base, "_code", f"{sha}.zip")
    assert read(uri) == body


def test_a_path_on_an_object_store_gets_its_scheme_back(storage_base):
    fs, path = object_store.filesystem(storage.join(storage_base, "j1", "checkpoint_1"))
    uri = object_store.uri_of(fs, path)
    assert storage.owned(uri, storage.job_prefix(storage_base, "j1"))
