"""A server that starts its own Ray head with its storage on the suite's S3 endpoint: the
head's nodes get the endpoint's ``AWS_*`` variables (a job's driver and workers read and
write checkpoints there), and the secret key reaches no launch file, no log and no record.

The bucket keeps every version of every object (versioning on), so the launch file the
driver read and deleted is still there to be searched, with everything else the job wrote.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import boto3
import httpx
import pytest

from api.client import Client
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from bench.harness.waiting import run_to_end
from service.cluster.local_cluster import LocalHead, _session_pids, find_head
from service.files import storage
from tests.support.object_store import NODE_ENV
from tests.support.processes import environ

pytestmark = pytest.mark.long  # a Ray head of its own and a whole job: a minute or two

SECRET = NODE_ENV["AWS_SECRET_ACCESS_KEY"]


def files_holding(root: Path, needle: bytes) -> list[str]:
    found = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                found.append(str(path))
        except OSError:
            continue
    return found


@pytest.fixture()
def versioned_bucket(s3_server, s3_env):
    bucket = f"raydock-versions-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    return s3, bucket


def test_a_local_head_on_s3_gives_its_nodes_the_endpoint_and_writes_the_secret_nowhere(
    versioned_bucket, s3_env, tmp_path
):
    s3, bucket = versioned_bucket
    base = f"s3://{bucket}/jobs"
    data = tmp_path / "data"
    server = ServerProcess(
        data,
        None,
        # The run's own Ray token is not this server's: it makes one.
        unset_env=("RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN"),
        extra_env={**s3_env, "RAYDOCK_STORAGE_PATH": base, "RAYDOCK_LOCAL_NUM_CPUS": "2"},
    )
    head: LocalHead | None = None
    try:
        server.start(timeout=240)
        head = find_head(data / "ray")
        assert head is not None, "the server started no head of its own"
        # Every process of the head (raylet, workers to come) holds the endpoint's variables.
        raylets = [p for p in _session_pids(head.pid) if Path(f"/proc/{p}/comm").read_text().strip() == "raylet"]
        assert raylets
        node_env = environ(raylets[0])
        assert node_env.get("AWS_ENDPOINT_URL_S3") == s3_env["AWS_ENDPOINT_URL_S3"]
        assert node_env.get("AWS_SECRET_ACCESS_KEY") == SECRET  # the node's own credential, as on a real cluster
        assert not [k for k in node_env if k.startswith("RAYDOCK_")]

        with Client(server.url) as client:
            job = client.submit(digits_spec(name="local-head-s3", epochs=2, scaling={"num_workers": 1}))
            run_to_end(job, 300)
            assert job.status.value == "SUCCEEDED", job.info.error
            prefix = storage.job_prefix(base, job.id)
            checkpoints = job.checkpoints()
            assert checkpoints and all(c.path.startswith(prefix + "/") for c in checkpoints)
            assert max(c.epoch for c in checkpoints) == 2
            record = httpx.get(f"{server.url}/v1/jobs/{job.id}", timeout=30).text
            logs = job.logs()
            events = httpx.get(f"{server.url}/v1/events", params={"job": job.id}, timeout=30).text
        assert SECRET not in record and SECRET not in logs and SECRET not in events

        # Every version of every object the job and the server wrote, the deleted launch file too.
        versions = s3.list_object_versions(Bucket=bucket, Prefix=f"jobs/{job.id}/")
        keys = [(v["Key"], v["VersionId"]) for v in versions.get("Versions", [])]
        assert any(k.startswith(f"jobs/{job.id}/{storage.LAUNCH_DIR}/launch-") for k, _ in keys), keys
        assert any(k.endswith("/state.json") for k, _ in keys), keys
        holding = [
            k for k, v in keys if SECRET.encode() in s3.get_object(Bucket=bucket, Key=k, VersionId=v)["Body"].read()
        ]
        assert holding == []
        # The server's data dir (database, logs, cluster.json) and the head's logs.
        assert files_holding(data, SECRET.encode()) == []
        assert files_holding(Path(head.temp_dir), SECRET.encode()) == []
    finally:
        server.stop()
        head = head or find_head(data / "ray")
        if head is not None:
            head.stop()
