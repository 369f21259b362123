"""A job attacking the tracking export of a real server (bench/harness/tracking_attacks.py): trial
ids that are paths, links planted in its storage, another project's MLflow experiment.
What it may change is its own prefix and record; the server's exporter must write nothing
anywhere else, and what honest jobs export still reads back with each tool's own reader."""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from pathlib import Path

import httpx
import pytest
from sqlalchemy import delete

from api import object_store
from bench.harness import tracking_attacks as ta
from bench.harness.waiting import wait_for
from service.db.event_models import TrialMetricRow
from service.db.models import JobRow
from service.files import storage
from service.tracking.names import trial_folder

pytestmark = pytest.mark.slow  # a server of its own, importing torch's SummaryWriter and MLflow: seconds


@pytest.fixture()
def target(request, tmp_path):
    """A tracking server on local storage, or (``parametrize("target", ["s3"], indirect=True)``)
    on a fresh prefix of the suite's S3 endpoint."""
    if getattr(request, "param", "local") == "s3":
        env = request.getfixturevalue("s3_env")
        base = request.getfixturevalue("s3_server").fresh_prefix()
        t = ta.start_tracking_target(tmp_path / "data", tmp_path / "mlruns", base, **env)
    else:
        t = ta.start_tracking_target(tmp_path / "data", tmp_path / "mlruns")
    yield t
    t.stop()


def scalars(folder, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def trial_text(folder) -> str:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    (event,) = acc.Tensors("raydock/trial_id/text_summary")
    return event.tensor_proto.string_val[0].decode()


def wait_done(target, job_id: str):
    return wait_for(lambda: (row := ta.export_row(target, job_id)).done and row, 60, f"the end of {job_id}'s export")


@pytest.fixture()
def outside():
    """A short folder under /tmp: a trial id naming a path in it fits the 64 characters of an id."""
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="rd") as path:
        yield Path(path)


@pytest.mark.parametrize("target", ["local", "s3"], indirect=True)
def test_trial_ids_a_search_sends_never_name_a_folder(target, outside, tmp_path):
    job = ta.running(target, ta.tracked_search({"tensorboard": True}))
    on_s3 = not storage.is_local(target.service.settings.storage.resolved_storage_path)
    storage_root = ta.prefix(target, job).parent
    pushed = {str(outside / "pushed-abs"): 0, "../../pushed-up": 10}  # where the old export wrote
    stored = {str(outside / "stored-abs"): 20, "../../stored-up": 30}  # kept by a server from before the bound
    body = [e for trial, seq in pushed.items() for e in ta.trial_metrics(trial, seq, 2)]
    ta.push(target, job, body + ta.trial_metrics("t_00000", 40, 3))
    with target.service.sessions.begin() as s:
        for trial, seq in stored.items():
            for i in range(2):
                s.add(
                    TrialMetricRow(
                        job_id=job, attempt=1, src_seq=seq + i, trial_id=trial, ts=1.0, step=i, values={"loss": 0.5}
                    )
                )
    ta.wait_exported(target, job)

    for path in (
        outside / "pushed-abs",
        outside / "stored-abs",
        storage_root / "pushed-up",
        storage_root / "stored-up",
    ):
        assert not path.exists(), f"the exporter wrote {path}: {ta.files_below(path)}"
    if on_s3:  # every object the export wrote is in the job's TensorBoard folder, none beside it
        _, inside = object_store.filesystem(ta.tensorboard_uri(target, job))

        # The copy follows the cursor: wait for the three honest folders' files.
        def three_folders() -> list[str]:
            found = ta.stored_keys(target)
            return found if len({k.rsplit("/", 2)[-2] for k in found}) >= 3 else []

        keys = wait_for(three_folders, 30, "the three trials' event files on the bucket")
        assert all(k.startswith(inside + "/") for k in keys), keys
    count, reason = ta.dropped(target, job)
    assert count == 4 and "trial_id" in reason, (count, reason)  # the pushed ones, refused at ingest
    folder = ta.tensorboard_folder(target, job, tmp_path / "copied")
    # Every run folder is the server's name for the trial, inside the job's prefix.
    names = {trial_folder(t) for t in ("t_00000", *stored)}
    assert {p.name for p in folder.iterdir() if p.is_dir()} == names
    honest = folder / trial_folder("t_00000")
    assert scalars(honest, "loss") == [(k + 1, pytest.approx(1.0 / (41 + k))) for k in range(3)]
    assert trial_text(honest) == "t_00000"
    assert trial_text(folder / trial_folder(str(outside / "stored-abs"))) == str(outside / "stored-abs")

    ta.end(target, job)
    wait_done(target, job)
    assert not (target.server.data_dir / "tensorboard-staging" / job).exists()  # staging goes with the export
    honest = ta.tensorboard_folder(target, job, tmp_path / "copied") / trial_folder("t_00000")
    assert scalars(honest, "loss")[-1] == (3, pytest.approx(1.0 / 43))
    # What the user downloads is the same folders, read from either backend.
    answer = httpx.get(f"{target.url}/v1/jobs/{job}/tensorboard", timeout=60)
    assert answer.status_code == 200, answer.text
    with tarfile.open(fileobj=io.BytesIO(answer.content), mode="r:gz") as tar:
        folders = {m.name.split("/")[-2] for m in tar.getmembers() if m.isfile() and "events.out.tfevents" in m.name}
    assert folders == names


def test_links_a_job_plants_in_its_storage_are_not_followed(target, tmp_path):
    # Links at <prefix>/tensorboard, at a trial's folder below it, and at the prefix itself:
    # each is replaced by a real folder of the job's, never written through.
    outside, jobs = ta.plant_links(target, tmp_path)
    for name, path in outside.items():
        assert ta.files_below(path) == [], f"the export followed the link at {name}"
    for job in jobs:
        ta.end(target, job)
    for job in jobs:
        row = wait_done(target, job)
        assert row.error is None, row.error
        assert not (target.server.data_dir / "tensorboard-staging" / job).exists()
        folder = ta.prefix(target, job) / "tensorboard"
        assert not folder.is_symlink() and not ta.prefix(target, job).is_symlink()
        run = folder / trial_folder("t_00000") if job == jobs[1] else folder  # jobs[1] is the search
        assert not run.is_symlink()
        assert [v for _, v in scalars(run, "loss")] == [pytest.approx(1.0 / (1 + k)) for k in range(3)]
    for name, path in outside.items():
        assert ta.files_below(path) == [], f"the export followed the link at {name}"
    # What the user downloads is the job's own files, from the folder that replaced the link.
    answer = httpx.get(f"{target.url}/v1/jobs/{jobs[0]}/tensorboard", timeout=60)
    assert answer.status_code == 200, answer.text
    with tarfile.open(fileobj=io.BytesIO(answer.content), mode="r:gz") as tar:
        names = [m.name for m in tar.getmembers() if m.isfile()]
    assert names and all("events.out.tfevents" in n for n in names), names


def test_two_projects_asking_for_one_experiment_name_get_one_experiment_each(target, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    ta.make_projects(target, "nlp", "vision")
    jobs = {
        p: ta.running(target, ta.tracked_train({"mlflow": {"experiment": "shared"}}, p), p) for p in ("nlp", "vision")
    }
    for job in jobs.values():
        ta.push(target, job, ta.metrics(0, 3))
    for job in jobs.values():
        ta.wait_exported(target, job, reports=3, tool="mlflow")
        ta.end(target, job)
    for job in jobs.values():
        assert wait_done(target, job).error is None

    client = MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    assert client.get_experiment_by_name("shared") is None  # no experiment is every project's
    for project, job in jobs.items():
        experiment = client.get_experiment_by_name(f"{project}/shared")
        runs = client.search_runs([experiment.experiment_id])
        assert [(r.data.tags["raydock.job_id"], r.data.tags["raydock.project"]) for r in runs] == [(job, project)]
        assert runs[0].info.status == "FINISHED"
        history = client.get_metric_history(runs[0].info.run_id, "loss")
        assert [(m.step, m.value) for m in history] == [(i, pytest.approx(1.0 / (1 + i))) for i in range(3)]


def test_a_link_swapped_in_for_a_copied_event_file_is_replaced_not_written_through(target, tmp_path):
    server_file = tmp_path / "server-file"
    server_file.write_bytes(b"the server's")
    jobs = {how: ta.running(target, ta.tracked_train({"tensorboard": True}, how)) for how in ("symlink", "hardlink")}
    for job in jobs.values():
        ta.push(target, job, ta.metrics(0, 2))
    for how, job in jobs.items():
        ta.wait_exported(target, job, reports=2)
        folder = ta.prefix(target, job) / "tensorboard"
        (event_file,) = wait_for(lambda: list(folder.glob("events.out.tfevents.*")), 30, "the copied event file")
        event_file.unlink()
        (os.symlink if how == "symlink" else os.link)(server_file, event_file)
        ta.push(target, job, ta.metrics(2, 2))
    for how, job in jobs.items():
        ta.wait_exported(target, job, reports=4)
        folder = ta.prefix(target, job) / "tensorboard"
        wait_for(lambda: len(scalars(folder, "loss")) == 4, 30, f"the {how} replaced by the event file")
        assert not any(p.is_symlink() for p in folder.iterdir())
    assert server_file.read_bytes() == b"the server's"


def test_a_job_deleted_before_its_export_ended_leaves_no_staging(target):
    job = ta.running(target, ta.tracked_train({"tensorboard": True}, "deleted"))
    ta.push(target, job, ta.metrics(0, 2))
    ta.wait_exported(target, job, reports=2)
    staged = target.server.data_dir / "tensorboard-staging" / job
    assert staged.is_dir()
    with target.service.sessions.begin() as s:  # as a delete does between the job's end and its export's
        s.execute(delete(JobRow).where(JobRow.id == job))
    wait_for(lambda: not staged.exists(), 30, "the deleted job's staging to go")
