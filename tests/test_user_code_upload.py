"""User code travels with the job: the CLI and SDK upload a local directory, the server
stores the package, Ray runs it. The server has a working directory and data dir of its
own and no code root, and the user's directory is removed as soon as the submit
returns: the job can only be running what was uploaded.

The user's code holds packages named like raydock's own (``api/``, ``service/``): the
job's driver and Train controller import raydock's, the user's loop imports the user's.
A second submit of the same code uploads nothing (the server's answer to HEAD is 200),
and a package no job references is collected after the retention period.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from api.client import Client
from api.errors import NotFound
from bench.harness.servers import ServerProcess
from tests.support.user_code import write_user_code

RETENTION_S = 2


@pytest.fixture(scope="module")
def upload_server(ray_head, tmp_path_factory):
    base = tmp_path_factory.mktemp("upload-server")
    (base / "cwd").mkdir()
    env = {"RAYDOCK_CODE_ROOT": "", "RAYDOCK_CODE_RETENTION_S": str(RETENTION_S)}
    server = ServerProcess(base / "data", ray_head.dashboard_url, extra_env=env, cwd=base / "cwd").start()
    yield server
    server.stop()


def test_uploaded_code_runs_from_cli_and_sdk_and_shadows_nothing(upload_server, tmp_path):
    spec_file = write_user_code(tmp_path / "cli-project")
    env = {**os.environ, "RAYDOCK_URL": upload_server.url}
    run = subprocess.run(
        [sys.executable, "-m", "service.cli", "submit", "job.yaml"],
        cwd=spec_file.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    shutil.rmtree(spec_file.parent)  # the server cannot be reading it from here
    assert run.returncode == 0, run.stdout + run.stderr
    cli_job_id = run.stdout.split()[0]
    assert "4 files" in run.stderr and "uploaded" in run.stderr, run.stderr  # __pycache__ left out

    with Client(upload_server.url) as client:
        again = write_user_code(tmp_path / "sdk-project")
        spec = yaml.safe_load(again.read_text())
        sdk_job = client.submit(spec, base_dir=again.parent)
        shutil.rmtree(again.parent)
        upload = client.last_upload
        assert upload is not None and (upload.status, upload.sent_bytes) == (200, 0)  # the server had it: nothing sent
        assert sdk_job.info.spec["code"] == upload.ref and sdk_job.info.spec["working_dir"] is None
        assert client.code_package(upload.sha256).jobs == 2

        cli_job = client.job(cli_job_id)
        for job in (cli_job, sdk_job):
            job.wait(timeout=240)
            assert job.status.value == "SUCCEEDED", job.info.error
            points = job.metrics()
            assert [p.metrics["step"] for p in points] == [1, 2, 3]
            assert [p.metrics["scaled"] for p in points] == [10, 20, 30]
            assert {p.metrics["who"] for p in points} == {"the user's api"}
            assert "working_dir_files" in points[0].metrics["api_file"]  # Ray's copy of the package, not a checkout

        # A package no job references goes after the retention period; the jobs' stays.
        (tmp_path / "orphan").mkdir()
        (tmp_path / "orphan" / "x.py").write_text("x = 1\n")
        orphan = client.upload_code(tmp_path / "orphan")
        assert orphan.status == 201
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                client.code_package(orphan.sha256)
            except NotFound:
                break
            time.sleep(0.5)
        with pytest.raises(NotFound):
            client.code_package(orphan.sha256)
        assert not (upload_server.data_dir / "storage" / "_code" / f"{orphan.sha256}.zip").exists()
        assert client.code_package(upload.sha256).jobs == 2
