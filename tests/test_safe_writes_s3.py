"""tests/test_safe_writes.py's rules on the suite's S3 endpoint: what the server writes
under a job's prefix (a resumed attempt's launch file, a preemption marker) and a code
package are the server's own, whatever a job put at that key before (an object of its
own there, or objects below the key, as a folder would be); nothing lands outside the
job's prefix. A bucket has no links: what a job can plant there is objects, at any key
its credentials may write (a bucket policy, not raydock, holds a job to its prefix).

A real server (real HTTP, SQLite, no Ray) and the same store opened in this process, as
in tests/test_safe_writes.py."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import select

from bench.harness import code_attacks
from bench.harness.attacks import Target
from bench.harness.jobstore import dead_ray, job_service, set_columns, submit
from bench.harness.servers import ServerProcess
from service.db.models import JobRow, utcnow
from service.events.tokens import token_hash
from service.files import storage

FORGED = json.dumps({"job_id": "someone-else", "attempt": 2, "events_token": "the-planters-token"}).encode()
PLANTS = ("object", "below")  # an object of the job's at the server's key; objects below it (a "folder")


@pytest.fixture(scope="module")
def target(s3_server, tmp_path_factory):
    """One server for the module (a start costs seconds on a busy machine), each test a job of its own."""
    base = s3_server.fresh_prefix()
    data = tmp_path_factory.mktemp("safe-writes-s3") / "data"
    url = f"sqlite:///{data / 'raydock.db'}"
    with pytest.MonkeyPatch.context() as mp:  # this process's pyarrow reaches the endpoint too
        for k, v in s3_server.env().items():
            mp.setenv(k, v)
        mp.delenv("AWS_ENDPOINT_URL", raising=False)
        service = job_service(url, data, storage_path=base)  # migrates the store before the server opens it
        env = {"RAYDOCK_DATABASE_URL": url, "RAYDOCK_STORAGE_PATH": base, "RAYDOCK_CODE_ROOT": "", **s3_server.env()}
        target = Target(ServerProcess(data, dead_ray(), extra_env=env).start(timeout=180), service)
        yield target, base
        target.server.stop()
        service.sessions.kw["bind"].dispose()


def put(uri: str, data: bytes) -> None:
    fs, path = storage._resolve(uri)
    with fs.open_output_stream(path) as f:
        f.write(data)


def read(uri: str) -> bytes:
    fs, path = storage._resolve(uri)
    with fs.open_input_stream(path) as f:
        return f.read()


def keys_below(uri: str) -> list[str]:
    import pyarrow.fs as pafs

    fs, path = storage._resolve(uri)
    return sorted(
        i.path for i in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if i.type == pafs.FileType.File
    )


def plant(prefix: str, relative: str, how: str) -> None:
    put(storage.join(prefix, relative) if how == "object" else storage.join(prefix, relative, "planted"), FORGED)


def only_inside_prefixes(target: Target, base: str) -> None:
    """Every object under ``base`` is in a job's prefix or the code packages' folder."""
    with target.service.sessions() as s:
        jobs = s.scalars(select(JobRow.id)).all()
    allowed = [storage._resolve(p)[1] + "/" for p in [*map(target.service.reads.prefix, jobs), f"{base}/_code"]]
    stray = [k for k in keys_below(base) if not any(k.startswith(a) for a in allowed)]
    assert stray == [], f"written outside the jobs' prefixes: {stray}"


@pytest.mark.parametrize("how", PLANTS)
def test_a_resumed_jobs_launch_file_on_s3_is_the_servers_whatever_the_job_put_there(target, how):
    target, base = target
    job_id = submit(target.service, name="planter")
    set_columns(target.service, job_id, status="FAILED", attempt=1, finished_at=utcnow())
    prefix = target.service.reads.prefix(job_id)
    plant(prefix, "_raydock/launch-2.json", how)

    r = httpx.post(f"{target.url}/v1/jobs/{job_id}/resume", timeout=30)
    assert r.status_code == 200, r.text
    prepared = target.service.monitor.attempts.prepare(job_id)  # what the monitor runs next

    data = read(storage.join(prefix, "_raydock/launch-2.json"))
    launch = json.loads(data)
    with target.service.sessions() as s:
        row = s.get(JobRow, job_id)
        assert launch["job_id"] == job_id and launch["attempt"] == 2 == prepared.attempt
        assert token_hash(launch["events_token"]) == row.events_token_hash
        assert hashlib.sha256(data).hexdigest() == row.launch_sha256
    only_inside_prefixes(target, base)


@pytest.mark.parametrize("how", PLANTS)
def test_a_preemption_marker_on_s3_is_the_servers_whatever_the_job_put_there(target, how):
    target, base = target
    job_id = submit(target.service, name="borrower")
    set_columns(target.service, job_id, status="RUNNING", attempt=3, started_at=utcnow() - timedelta(seconds=5))
    prefix = target.service.reads.prefix(job_id)
    plant(prefix, "_raydock/preempt-3", how)

    moved = target.service.monitor.preemptions.preempt([job_id], "owners-job", "owners")

    assert moved == [job_id]
    assert read(storage.join(prefix, "_raydock/preempt-3")) == b"preempted\n"
    assert httpx.get(f"{target.url}/v1/jobs/{job_id}", timeout=30).json()["status"] == "PREEMPTED"
    only_inside_prefixes(target, base)


@pytest.mark.parametrize("how", PLANTS)
def test_a_code_package_on_s3_is_the_uploaded_one_whatever_was_at_its_key(target, how):
    target, base = target
    body = code_attacks.package({"main.py": f"# {how}\ndef train(config):\n    pass\n".encode()})
    sha = hashlib.sha256(body).hexdigest()
    plant(base, f"_code/{sha}.zip", how)  # a job's credentials may write anywhere in the bucket

    sha, r = code_attacks.upload(target.url, body)

    assert r.status_code == 201, r.text
    assert read(storage.join(base, "_code", f"{sha}.zip")) == body
    assert target.service.code.verify(sha)
    only_inside_prefixes(target, base)
