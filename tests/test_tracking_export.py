"""The tracking exporter on a real store, read back by each tool's own reader:
TensorBoard's event accumulator and MLflow's client on a file store. No Ray: the
reports are put in the store as ingestion stores them, and the exporter is run pass by
pass, as its loop does, with a restart between two passes. Slow: importing torch's
SummaryWriter and MLflow takes seconds; the live run is in tests/test_metrics_live.py."""

from __future__ import annotations

import os
import tarfile
import time

import pytest
from sqlalchemy import create_engine, insert, update
from sqlalchemy.pool import StaticPool

from service.db.engine import make_sessionmaker
from service.db.event_models import CheckpointRow, MetricRow, SearchResultRow, TrialMetricRow, TrialRow
from service.db.models import Base, JobRow, utcnow
from service.db.tracking_models import TrackingExportRow
from service.files import storage
from service.settings import Settings
from service.tracking.exporter import Exporter
from service.tracking.names import trial_folder

pytestmark = pytest.mark.slow


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a file store is what a test can read without a server
    engine = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
    Base.metadata.create_all(engine)
    settings = Settings(
        storage={"data_dir": tmp_path / "data", "storage_path": str(tmp_path / "storage")},
        tracking={"mlflow_tracking_uri": f"file:{tmp_path}/mlruns"},
    )
    return make_sessionmaker(engine), settings


def job(sessions, job_id: str, kind: str, spec: dict) -> None:
    with sessions.begin() as s:
        s.add(JobRow(id=job_id, name=f"{kind}-run", kind=kind, status="RUNNING", spec=spec, labels={}, attempt=1))
        s.flush()
        s.add(TrackingExportRow(job_id=job_id, tensorboard=True, mlflow_experiment="exp/one", trial_runs={}))


def reports(sessions, job_id: str, first: int, n: int) -> list[tuple[int, dict]]:
    rows = [
        {"step": 10 * i, "loss": 1.0 / (i + 1), "val/acc@1": 0.1 * i, "note": "text is not a scalar"}
        for i in range(first, first + n)
    ]
    with sessions.begin() as s:
        s.execute(
            insert(MetricRow),
            [
                dict(
                    job_id=job_id, attempt=1, src_seq=first + k, seq=first + k, ts=time.time(), step=r["step"], values=r
                )
                for k, r in enumerate(rows)
            ],
        )
    return [(r["step"], r) for r in rows]


def end(sessions, job_id: str, status: str = "SUCCEEDED") -> None:
    with sessions.begin() as s:
        s.execute(update(JobRow).where(JobRow.id == job_id).values(status=status, finished_at=utcnow()))


def scalars(folder: str, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(folder)
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_a_jobs_reports_reach_tensorboard_and_mlflow_once_each_across_a_restart(setup, tmp_path):
    from mlflow.tracking import MlflowClient

    sessions, settings = setup
    spec = {"kind": "train", "optimizer": {"name": "adam", "lr": 0.01}, "tracking": {"tensorboard": True}}
    job(sessions, "jt1", "train", spec)
    stored = reports(sessions, "jt1", 0, 3)
    Exporter(sessions, settings).export_once()
    stored += reports(sessions, "jt1", 3, 2)
    # The final checkpoint, with a link the job planted to a file of the server's host.
    prefix = storage.job_prefix(settings.storage.resolved_storage_path, "jt1")
    ckpt = os.path.join(storage.local_path(prefix), "checkpoint_000001")
    os.makedirs(ckpt)
    open(os.path.join(ckpt, "state.pt"), "wb").write(b"weights")
    secret = tmp_path / "server-secret"
    secret.write_text("not the job's")
    os.symlink(secret, os.path.join(ckpt, "stolen"))
    with sessions.begin() as s:
        s.add(CheckpointRow(job_id="jt1", attempt=1, path=ckpt, step=40, values={}))
    end(sessions, "jt1")
    restarted = Exporter(sessions, settings)  # a new server: resumes from the stored cursors
    restarted.export_once()

    folder = storage.local_path(storage.join(prefix, "tensorboard"))
    assert scalars(folder, "loss") == [(step, pytest.approx(r["loss"])) for step, r in stored]
    assert scalars(folder, "val/acc_1") == [(step, pytest.approx(r["val/acc@1"])) for step, r in stored]

    client = MlflowClient(tracking_uri=settings.tracking.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name("default/exp/one")  # the job's project's experiment
    (run,) = client.search_runs([experiment.experiment_id], "tags.`raydock.job_id` = 'jt1'")
    assert run.info.status == "FINISHED" and run.info.run_name == "train-run"
    assert run.data.params["optimizer.lr"] == "0.01" and run.data.params["tracking.tensorboard"] == "true"
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(step, pytest.approx(r["loss"])) for step, r in stored]
    assert client.get_metric_history(run.info.run_id, "note") == []
    local = client.download_artifacts(run.info.run_id, "checkpoint/checkpoint.tar.gz", str(tmp_path / "dl"))
    with tarfile.open(local) as tar:
        assert tar.getnames() == ["state.pt"]  # the link is left out, never followed
        assert tar.extractfile("state.pt").read() == b"weights"
    with sessions() as s:
        row = s.get(TrackingExportRow, "jt1")
        assert row.done and row.error is None and row.tensorboard_seq == row.mlflow_seq == 5


def test_a_search_logs_one_nested_run_per_trial_and_one_tensorboard_run_each(setup):
    from mlflow.tracking import MlflowClient

    sessions, settings = setup
    job(sessions, "js1", "tune", {"kind": "tune", "search_space": {"lr": [0.1, 0.01]}})
    with sessions.begin() as s:
        for n, trial in enumerate(("t_00000", "t_00001")):
            s.add(TrialRow(job_id="js1", trial_id=trial, status="TERMINATED", config={"lr": 0.1 / (n + 1)}, reports=2))
            for i in range(2):
                s.add(
                    TrialMetricRow(
                        job_id="js1",
                        attempt=1,
                        src_seq=10 * n + i,
                        trial_id=trial,
                        ts=time.time(),
                        step=i,
                        values={"training_iteration": i + 1, "loss": n + i / 10},
                        config={},
                    )
                )
        s.add(SearchResultRow(job_id="js1", attempt=1, trial_id="t_00000", value=0.0, config={}, values={}))
    end(sessions, "js1")
    Exporter(sessions, settings).export_once()

    client = MlflowClient(tracking_uri=settings.tracking.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name("default/exp/one")  # the job's project's experiment
    runs = client.search_runs([experiment.experiment_id], "tags.`raydock.job_id` = 'js1'")
    (parent,) = [r for r in runs if "raydock.trial_id" not in r.data.tags]
    trials = {r.data.tags["raydock.trial_id"]: r for r in runs if "raydock.trial_id" in r.data.tags}
    assert set(trials) == {"t_00000", "t_00001"}
    for n, (trial, run) in enumerate(sorted(trials.items())):
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id and run.info.status == "FINISHED"
        assert run.data.params["lr"] == str(0.1 / (n + 1))
        assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [
            (0, pytest.approx(n)),
            (1, pytest.approx(n + 0.1)),
        ]
    folder = storage.local_path(
        storage.join(storage.job_prefix(settings.storage.resolved_storage_path, "js1"), "tensorboard")
    )
    assert scalars(os.path.join(folder, trial_folder("t_00001")), "loss") == [
        (0, pytest.approx(1.0)),
        (1, pytest.approx(1.1)),
    ]


def test_an_mlflow_server_that_does_not_answer_holds_up_neither_tensorboard_nor_the_other_jobs(setup, monkeypatch):
    from service.cluster.local_cluster import free_ports

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # refused at once: the test's time is not the point

    sessions, settings = setup
    tracking = settings.tracking.model_copy(update={"mlflow_tracking_uri": f"http://127.0.0.1:{free_ports(1)[0]}"})
    settings = settings.model_copy(update={"tracking": tracking})
    jobs = [f"jd{i}" for i in range(4)]
    for job_id in jobs:
        job(sessions, job_id, "train", {"kind": "train"})
        reports(sessions, job_id, 0, 2)
    exporter = Exporter(sessions, settings)
    started = time.monotonic()
    exporter.export_once()
    took = time.monotonic() - started
    with sessions() as s:
        rows = [s.get(TrackingExportRow, job_id) for job_id in jobs]
    assert [r.tensorboard_seq for r in rows] == [2, 2, 2, 2]  # TensorBoard went on for every job
    assert [r.mlflow_seq for r in rows] == [0, 0, 0, 0]
    # The first job found the server down; the others waited for it to come back instead of each timing out.
    failed = [r.job_id for r in rows if r.error]
    assert len(failed) == 1 and "mlflow" in rows[jobs.index(failed[0])].error, [r.error for r in rows]
    print(f"\none pass over 4 jobs with MLflow down: {took:.1f}s")
