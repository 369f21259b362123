"""The object store storage tests run against: moto's standalone S3 server (``moto[server]``,
the dev extra), started once per test session on a loopback port of its own and stopped
by its pid at the end. It speaks S3's HTTP API, so pyarrow and boto reach it as they reach
any S3 endpoint: through ``AWS_ENDPOINT_URL_S3`` and the ``AWS_*`` credentials.

``storage_base`` is parametrized over a local directory and a fresh prefix in the
endpoint's bucket, so a test that takes it runs on both, as ``database_url`` runs a test
on SQLite and PostgreSQL. For the S3 half it sets the endpoint and credentials in this
process's environment (read by pyarrow here); ``s3_env`` is the same for a server started
by a test. The session's Ray nodes hold ``NODE_ENV`` (credentials only): the endpoint
reaches a job's driver from the server, as it would on a real cluster.

What moto does not emulate: it keeps objects in memory with no real durability or
consistency window, checks no signature against a real account (any key works), answers
in milliseconds (a real store's multipart upload of a big checkpoint needs a longer
request timeout), and has no per-prefix IAM policy: a real S3/MinIO/GCS bucket policy is
where a job's credentials would be held to its own prefix.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import httpx
import pytest

from service.cluster.local_cluster import free_ports

BUCKET = "raydock-test"
# Credentials of the suite's endpoint only (moto checks none): what every Ray node of the
# session holds in its environment, as a real cluster's nodes hold theirs.
NODE_ENV = {
    "AWS_ACCESS_KEY_ID": "raydock-test",
    "AWS_SECRET_ACCESS_KEY": "raydock-test-secret",
    "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata lookups on a machine without one
}


class S3Server:
    """moto's S3 server on 127.0.0.1 (or ``host``: an address other hosts reach), one bucket made in it."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host, self.port = host, free_ports(1)[0]
        self.endpoint = f"http://{host}:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="raydock-moto-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        return {**NODE_ENV, "AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_REGION": "us-east-1"}

    def start(self, timeout: float = 60.0) -> "S3Server":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto's server exited with {self.proc.returncode}: {self._tail()}")
            try:
                httpx.get(self.endpoint, timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"moto's server did not answer within {timeout:g}s: {self._tail()}")
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=NODE_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=NODE_ENV["AWS_SECRET_ACCESS_KEY"],
        ).create_bucket(Bucket=BUCKET)
        return self

    def requests_served(self) -> int:
        """How many requests the endpoint has answered so far (its access log's lines)."""
        with open(self.log.name, errors="replace") as f:
            return sum(1 for line in f if re.search(r'"(GET|HEAD|PUT|POST|DELETE) /', line))

    def fresh_prefix(self) -> str:
        return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"

    def _tail(self) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()[-2000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture(scope="session")
def s3_server():
    """The session's S3 endpoint; a test that needs it fails, saying why, if it cannot start."""
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError:
        pytest.fail("moto[server] is not installed: install the dev extra (`pip install -e '.[dev]'`)", pytrace=False)
    server = S3Server()
    try:
        server.start()
    except (RuntimeError, OSError) as exc:
        server.stop()
        pytest.fail(f"the S3 endpoint could not be started: {exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture()
def s3_env(s3_server, monkeypatch) -> dict[str, str]:
    """The endpoint and credentials, set in this process (its pyarrow reads them) and
    returned for a server process a test starts."""
    env = s3_server.env()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return env


@pytest.fixture(params=["local", "s3"])
def storage_base(request, tmp_path) -> str:
    """Where a test's jobs keep their storage: a local directory, or a fresh prefix on S3."""
    if request.param == "local":
        return str(tmp_path / "storage")
    request.getfixturevalue("s3_env")
    return request.getfixturevalue("s3_server").fresh_prefix()
