"""Training jobs end to end: REST, SDK and CLI on a real Ray cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
import torch
import yaml

from api.client import Client
from api.schemas import DigitsData, MLPModel
from api.schemas.events import PHASE_NAMES
from bench.harness.specs import digits_spec
from bench.harness.waiting import wait_for
from tests.support.phases_check import assert_phases
from tests.support.session import CLUSTER_CPUS
from tests.support.specs import user_spec
from trainers.data.tabular import load_arrays
from trainers.models import build_model


def test_rest_digits_job_learns_and_checkpoint_reproduces_accuracy(server, tmp_path):
    http = httpx.Client(base_url=server.url, timeout=30)
    r = http.post("/v1/jobs", json=digits_spec())
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert r.json()["status"] == "QUEUED"

    job = wait_for(
        lambda: (j := http.get(f"/v1/jobs/{job_id}").json())["status"] in ("SUCCEEDED", "FAILED") and j, 180, "job end"
    )
    assert job["status"] == "SUCCEEDED", job["error"]
    assert job["attempt"] == 1
    # Every phase, from the server, the driver, the Train controller and rank 0's first step.
    assert_phases(job["start_phases"], *PHASE_NAMES)

    series = http.get(f"/v1/jobs/{job_id}/metrics").json()
    assert [p["epoch"] for p in series] == [1, 2, 3, 4, 5]
    assert [p["seq"] for p in series] == [0, 1, 2, 3, 4]
    assert series[-1]["metrics"]["train_loss"] < series[0]["metrics"]["train_loss"]
    assert series[-1]["metrics"]["val_acc"] >= 0.9
    assert http.get(f"/v1/jobs/{job_id}/metrics", params={"since": 2}).json() == series[3:]

    checkpoints = http.get(f"/v1/jobs/{job_id}/checkpoints").json()
    assert [c["epoch"] for c in checkpoints] == [4, 5]  # checkpoint.keep = 2
    latest = checkpoints[-1]
    archive = http.get(f"/v1/jobs/{job_id}/checkpoints/{latest['id']}/download")
    assert archive.status_code == 200
    (tmp_path / "ckpt.tar.gz").write_bytes(archive.content)
    subprocess.run(["tar", "xzf", "ckpt.tar.gz"], cwd=tmp_path, check=True)

    state = json.loads((tmp_path / "state.json").read_text())
    assert state["epoch"] == 5
    model = build_model(MLPModel(type="mlp", hidden_sizes=[64]), state["n_features"], state["n_classes"])
    model.load_state_dict(torch.load(tmp_path / "model.pt"))
    data = load_arrays(DigitsData(source="digits"), seed=0)
    with torch.no_grad():
        acc = (model(data.x_val).argmax(1) == data.y_val).float().mean().item()
    assert acc == pytest.approx(latest["metrics"]["val_acc"], abs=1e-6)
    assert acc >= 0.9

    logs = http.get(f"/v1/jobs/{job_id}/logs").text
    assert "RAYDOCK_EVENT" in logs and "trainers.zygote.client train" in logs  # the entrypoint Ray ran


def test_sdk_submit_stream_and_wait(client: Client, tmp_path):
    job = client.submit(digits_spec(name="sdk", labels={"suite": "sdk"}, epochs=3))
    streamed = list(job.stream_metrics())
    job.wait(timeout=120)
    assert job.status.value == "SUCCEEDED"
    assert [p.epoch for p in streamed] == [1, 2, 3]
    assert [p.seq for p in job.metrics()] == [0, 1, 2]
    assert job.info.latest_metrics["epoch"] == 3
    listed = client.list(labels={"suite": "sdk"})
    assert [j.id for j in listed.items] == [job.id]
    assert client.list(labels={"suite": "nope"}).total == 0
    restored = job.download_checkpoint(dest=tmp_path)
    assert json.loads((restored / "state.json").read_text())["epoch"] == 3


def test_cli_submit_follow(server, tmp_path):
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(digits_spec(name="cli", epochs=2)))
    env = {**os.environ, "RAYDOCK_URL": server.url}
    run = subprocess.run(
        [sys.executable, "-m", "service.cli", "submit", str(spec_file), "--follow"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    job_id = run.stdout.split()[0]
    assert f"{job_id} SUCCEEDED" in run.stdout

    listed = subprocess.run(
        [sys.executable, "-m", "service.cli", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert job_id in listed.stdout
    ckpts = subprocess.run(
        [sys.executable, "-m", "service.cli", "checkpoints", job_id, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ckpts.returncode == 0, ckpts.stderr
    assert [c["epoch"] for c in json.loads(ckpts.stdout)] == [1, 2]
    status = subprocess.run(
        [sys.executable, "-m", "service.cli", "status", job_id],
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "SUCCEEDED" in status.stdout, status.stdout + status.stderr
    start_up = next(line for line in status.stdout.splitlines() if "start-up" in line)
    assert "queued 0.0s" in start_up and "first_metric" in start_up, start_up

    # Deleting a finished job removes its record and its checkpoint files.
    storage = server.data_dir / "storage" / job_id
    assert storage.is_dir()
    assert httpx.delete(f"{server.url}/v1/jobs/{job_id}").status_code == 204
    assert httpx.get(f"{server.url}/v1/jobs/{job_id}").status_code == 404
    assert not storage.exists()


def test_user_code_job_reports_reach_the_api(client: Client):
    job = client.submit(user_spec("userpkg.steps:train", config={"steps": 4, "lr": 0.3, "tag": "mine"}))
    job.wait(timeout=120)
    assert job.status.value == "SUCCEEDED", job.info.error
    # first_step: rank 0's first ray.train.report, as the user's loop marks no phase itself.
    assert_phases(job.info.start_phases, *PHASE_NAMES)
    points = job.metrics()
    assert [p.metrics["step"] for p in points] == [1, 2, 3, 4]
    assert all(p.metrics["tag"] == "mine" for p in points)
    assert points[-1].metrics["loss"] < points[0].metrics["loss"]


def test_user_code_error_is_visible(client: Client):
    job = client.submit(user_spec("userpkg.boom:train", config={"lr": 42}))
    job.wait(timeout=120)
    assert job.status.value == "FAILED"
    assert job.info.failure_cause.value == "USER_CODE"
    # The user's exception first, then the user's frames; no colour codes.
    assert job.info.error.splitlines()[0] == "ValueError: learning rate 42 is out of range for this model"
    assert "boom.py" in job.info.error and "\x1b" not in job.info.error


def test_cancel_running_job_releases_workers(client: Client):
    job = client.submit(user_spec("userpkg.steps:train", config={"steps": 10_000, "sleep_s": 0.2}))
    wait_for(lambda: job.metrics(), 120, "first report")
    # Ray's load report trails a fast start by a few seconds: wait for it to show the 2 CPUs held.
    wait_for(lambda: client.cluster().cpus_free <= CLUSTER_CPUS - 2, 60, "the job's CPUs to show as held")
    refused = httpx.delete(f"{client.url}/v1/jobs/{job.id}")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "job_not_finished"
    job.cancel()
    wait_for(lambda: job.refresh().status.is_terminal(), 60, "cancel to finish")
    assert job.status.value == "CANCELLED"
    wait_for(lambda: client.cluster().cpus_free == CLUSTER_CPUS, 60, "CPUs to be released")
    count = len(job.metrics())
    time.sleep(2)
    assert len(job.metrics()) == count  # nothing trains any more
