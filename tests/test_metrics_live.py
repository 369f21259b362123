"""GET /metrics and the tracking export on a real server and the session's Ray cluster:
three tiny jobs (one succeeds with tracking on, one fails in user code, one is
cancelled) move the counters and histograms; the /metrics text parses with
prometheus-client's own parser; the succeeded job's reports are read back from the
TensorBoard files the API serves and from MLflow's file store, equal to what raydock stored."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.client import Client
from api.errors import Conflict, NotFound
from bench.harness.servers import ServerProcess
from tests.support.specs import user_spec

TOKEN, METRICS_TOKEN = "api-token-for-metrics-tests", "scrape-token-for-metrics-tests"
ONE = {"num_workers": 1}


@pytest.fixture(scope="module")
def tracked(ray_head, tmp_path_factory):
    root = tmp_path_factory.mktemp("metrics")
    env = {
        "RAYDOCK_METRICS_TOKEN": METRICS_TOKEN,
        "RAYDOCK_MLFLOW_TRACKING_URI": f"file:{root}/mlruns",
        "MLFLOW_ALLOW_FILE_STORE": "true",  # MLflow's file store, readable by the test without a server
        "RAYDOCK_TRACKING_INTERVAL_S": "0.5",
    }
    server = ServerProcess(root / "server", ray_head.dashboard_url, token=TOKEN, extra_env=env).start()
    yield server
    server.stop()


def scrape(url: str, token: str | None = METRICS_TOKEN) -> httpx.Response:
    return httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=30)


def samples(url: str) -> dict[tuple[str, tuple], float]:
    text = scrape(url).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(table: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in table.items() if n == name and labels.items() <= dict(ls).items())


def wait_for(check, timeout: float = 90.0, what: str = "it"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (got := check()) is not None:
            return got
        time.sleep(0.5)
    raise TimeoutError(f"waited {timeout:g}s for {what}")


def test_metrics_move_with_real_jobs_and_tracking_reads_back_equal(tracked, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    url = tracked.url
    assert scrape(url, None).status_code == 401
    assert scrape(url, TOKEN).status_code == 401  # a metrics token is set: it, not the API token, opens /metrics
    assert scrape(url).headers["content-type"].startswith("text/plain")
    before = samples(url)

    tracking = {"tensorboard": True, "mlflow": {"experiment": "live"}}
    with Client(url, token=TOKEN) as client:
        ok = client.submit(
            {
                **user_spec("userpkg.ckpt_steps:train", name="m-ok", config={"steps": 4, "every": 2, "sleep_s": 0}),
                "scaling": ONE,
                "tracking": tracking,
            }
        )
        bad = client.submit({**user_spec("userpkg.boom:train", name="m-fail"), "scaling": ONE})
        cut = client.submit({**user_spec("userpkg.steps:train", name="m-cut", config={"steps": 500}), "scaling": ONE})
        cut.cancel()
        for job in (ok, bad, cut):
            job.wait(timeout=240)
        assert (ok.status.value, bad.status.value, cut.status.value) == ("SUCCEEDED", "FAILED", "CANCELLED")
        for _ in range(3):
            client.job(ok.id)  # GET /v1/jobs/{job_id}
        stored = ok.metrics()
    after = samples(url)

    def moved(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("raydock_jobs_submitted_total", kind="train") == 3
    assert moved("raydock_jobs_finished_total", kind="train", status="SUCCEEDED") == 1
    assert moved("raydock_jobs_finished_total", kind="train", status="CANCELLED") == 1
    assert moved("raydock_job_failures_total", kind="train", cause="USER_CODE") == 1
    assert moved("raydock_admission_wait_seconds_count", kind="train") >= 2
    assert moved("raydock_startup_seconds_count", kind="train") >= 1
    assert moved("raydock_events_ingested_total") >= len(stored)
    assert moved("raydock_monitor_tick_seconds_count") > 0
    assert moved("raydock_http_request_duration_seconds_count", route="/v1/jobs/{job_id}", status="2xx") >= 3
    assert moved("raydock_http_request_duration_seconds_count", route="/v1/jobs", method="POST", status="2xx") == 3
    assert not [k for k in after if ok.id in str(k)]  # no job id on any counter once the job stopped running
    assert value(after, "raydock_jobs", status="SUCCEEDED", kind="train") >= 1
    assert value(after, "raydock_cluster_cpus", state="total") == 4  # the session cluster's CPUs (CLUSTER_CPUS)

    # TensorBoard: the files the API serves, read by TensorBoard's own reader.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    auth = {"Authorization": f"Bearer {TOKEN}"}

    def exported():
        try:
            with Client(url, token=TOKEN) as client:
                folder = client.job(ok.id).download_tensorboard(tmp_path)  # the SDK's way
        except (Conflict, NotFound):  # 409 until the first export
            return None
        acc = EventAccumulator(str(folder))
        acc.Reload()
        points = acc.Scalars("loss") if "loss" in acc.Tags()["scalars"] else []
        return points if len(points) == len(stored) else None

    points = wait_for(exported, what="the TensorBoard export")
    assert [(p.step, p.value) for p in points] == [(m.step, pytest.approx(m.metrics["loss"])) for m in stored]
    assert httpx.get(f"{url}/v1/jobs/{bad.id}/tensorboard", headers=auth).json()["error"]["code"] == "no_tensorboard"
    # The CLI's way: the same files, and where to point tensorboard.
    from typer.testing import CliRunner

    from service.cli import app

    cli = CliRunner().invoke(
        app, ["tensorboard", ok.id, "--dest", str(tmp_path / "cli"), "--url", url, "--token", TOKEN]
    )
    assert cli.exit_code == 0, cli.output
    assert "tensorboard --logdir" in cli.output and any((tmp_path / "cli").rglob("events.out.tfevents.*"))

    # MLflow: the run, its metrics by step and the final checkpoint, read by MLflow's own client.
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(tracking_uri=f"file:{tracked.data_dir.parent}/mlruns")

    def finished():
        experiment = mlflow.get_experiment_by_name("default/live")  # the job's project's experiment
        runs = (
            mlflow.search_runs([experiment.experiment_id], f"tags.`raydock.job_id` = '{ok.id}'") if experiment else []
        )
        return runs[0] if runs and runs[0].info.status == "FINISHED" else None

    run = wait_for(finished, what="the MLflow run to finish")
    history = mlflow.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(m.step, pytest.approx(m.metrics["loss"])) for m in stored]
    assert run.data.params["config.steps"] == "4"
    assert [a.path for a in mlflow.list_artifacts(run.info.run_id, "checkpoint")] == ["checkpoint/checkpoint.tar.gz"]


def test_a_server_without_mlflow_refuses_a_spec_asking_for_it(server):
    spec = {**user_spec("userpkg.steps:train", name="m-refused"), "tracking": {"mlflow": {"experiment": "x"}}}
    r = httpx.post(f"{server.url}/v1/jobs", json=spec, timeout=30)
    assert r.status_code == 422 and r.json()["error"]["code"] == "mlflow_not_configured"
    # No token of either kind: like the API, /metrics answers loopback clients (the guard refuses others).
    assert scrape(server.url, None).status_code == 200
