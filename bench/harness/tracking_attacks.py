"""Attacks on the tracking export, as a job's code could make them, against a real server
(real HTTP, SQLite, a real MLflow file store, no Ray: jobs are put RUNNING in the store
with an events token the attacker holds, and the server's own exporter runs). Shared by
tests/test_tracking_attacks.py and ``python -m bench.abuse_tracking``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
from sqlalchemy import func, select

from api import object_store
from api.schemas import parse_job_spec
from bench.harness.attacks import SEARCH, SID, TOKEN, Target
from bench.harness.jobstore import dead_ray, set_columns
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from bench.harness.waiting import wait_for
from service.cluster.ray_backend import RayBackend
from service.db.engine import make_engine, make_sessionmaker
from service.db.event_models import TrialMetricRow
from service.db.models import JobRow
from service.db.tracking_models import TrackingExportRow
from service.events.tokens import token_hash
from service.files import storage
from service.runtime import compose
from service.settings import Settings
from service.tracking.names import trial_folder

INTERVAL_S = "0.2"  # the exporter's pass, short so a test waits little


def start_tracking_target(data_dir: Path, mlruns: Path, storage_path: str | None = None, **env: str) -> Target:
    """A server whose exporter runs every 0.2 s, with an MLflow file store at ``mlruns``;
    its storage in ``data_dir`` unless ``storage_path`` names another (an S3 prefix, with
    the endpoint's variables in ``env``)."""
    url = f"sqlite:///{data_dir / 'raydock.db'}"
    mlflow_uri = f"file:{mlruns}"
    address = dead_ray()
    settings = Settings(
        storage={"data_dir": data_dir, "database_url": url, "storage_path": storage_path},
        cluster={"ray_address": address},
        tracking={"mlflow_tracking_uri": mlflow_uri},
    )
    service = compose(settings, make_sessionmaker(make_engine(url)), RayBackend(address, timeout_s=2))
    env = {
        "RAYDOCK_DATABASE_URL": url,
        "RAYDOCK_MLFLOW_TRACKING_URI": mlflow_uri,
        "RAYDOCK_TRACKING_INTERVAL_S": INTERVAL_S,
        "MLFLOW_ALLOW_FILE_STORE": "true",
        **({"RAYDOCK_STORAGE_PATH": storage_path} if storage_path else {}),
        **env,
    }
    return Target(ServerProcess(data_dir, dead_ray(), extra_env=env).start(), service)


def make_projects(target: Target, *names: str) -> None:
    admin = (target.server.data_dir / "admin-token").read_text().strip()
    with httpx.Client(base_url=target.url, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as http:
        for name in names:
            http.post("/v1/projects", json={"name": name}).raise_for_status()


def running(target: Target, spec: dict, project: str | None = None) -> str:
    """A job of ``spec`` RUNNING on attempt 1, whose events token the attacker holds."""
    job, _ = target.service.jobs.submit(parse_job_spec(spec), project=project)
    set_columns(
        target.service, job.id, status="RUNNING", attempt=1, ray_job_id=SID, events_token_hash=token_hash(TOKEN)
    )
    return job.id


def tracked_train(tracking: dict, name: str = "tracked") -> dict:
    return {**digits_spec(name=name), "tracking": tracking}


def tracked_search(tracking: dict) -> dict:
    return {**SEARCH, "tracking": tracking}


def prefix(target: Target, job_id: str) -> Path:
    return Path(storage.local_path(storage.job_prefix(target.service.settings.storage.resolved_storage_path, job_id)))


def tensorboard_uri(target: Target, job_id: str) -> str:
    return storage.join(
        storage.job_prefix(target.service.settings.storage.resolved_storage_path, job_id), "tensorboard"
    )


def tensorboard_folder(target: Target, job_id: str, copy_to: Path) -> Path:
    """The job's TensorBoard folder as a local folder, for TensorBoard's reader: the folder
    itself on local storage, a fresh copy of it (in ``copy_to``) from an object store."""
    uri = tensorboard_uri(target, job_id)
    if storage.is_local(uri):
        return Path(storage.local_path(uri))
    import pyarrow.fs as pafs

    shutil.rmtree(copy_to, ignore_errors=True)
    copy_to.mkdir(parents=True)
    fs, path = object_store.filesystem(uri)
    pafs.copy_files(path, str(copy_to), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    return copy_to


def stored_keys(target: Target) -> list[str]:
    """Every object under an object store's storage path (its bucket/key paths)."""
    import pyarrow.fs as pafs

    fs, root = object_store.filesystem(target.service.settings.storage.resolved_storage_path)
    found = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return sorted(i.path for i in found if i.type == pafs.FileType.File)


def metrics(first: int, n: int) -> list[dict]:
    return [
        {"type": "metric", "seq": i, "ts": 1.0 + i, "metrics": {"step": i, "loss": 1.0 / (1 + i)}}
        for i in range(first, first + n)
    ]


def trial_metrics(trial_id: str, first: int, n: int) -> list[dict]:
    return [
        {
            "type": "trial_metric",
            "seq": i,
            "ts": 1.0 + i,
            "trial_id": trial_id,
            "metrics": {"training_iteration": i - first + 1, "loss": 1.0 / (1 + i)},
            "config": {"optimizer.lr": 0.01},
        }
        for i in range(first, first + n)
    ]


def push(target: Target, job_id: str, body: list[dict]) -> None:
    r = target.push(job_id, body)
    assert r.status_code == 204, r.text


def export_row(target: Target, job_id: str) -> TrackingExportRow:
    with target.service.sessions() as s:
        row = s.get(TrackingExportRow, job_id)
        s.expunge(row)
        return row


def wait_exported(target: Target, job_id: str, reports: int = 0, tool: str = "tensorboard", timeout: float = 60):
    """Until the exporter's cursor for ``tool`` has passed ``reports`` of the job's own
    series and every trial report stored for it."""

    def caught_up():
        with target.service.sessions() as s:
            last_trial = s.scalar(select(func.max(TrialMetricRow.id)).where(TrialMetricRow.job_id == job_id)) or 0
        row = export_row(target, job_id)
        seq, trial = getattr(row, f"{tool}_seq"), getattr(row, f"{tool}_trial_id")
        return row if seq >= reports and trial >= last_trial else None

    return wait_for(caught_up, timeout, f"{tool} export of job {job_id}")


def end(target: Target, job_id: str) -> None:
    set_columns(target.service, job_id, status="SUCCEEDED")


def dropped(target: Target, job_id: str) -> tuple[int, str | None]:
    with target.service.sessions() as s:
        job = s.get(JobRow, job_id)
        return job.dropped_events or 0, job.last_dropped_reason


def files_below(path: Path) -> list[str]:
    """Everything below ``path`` (an empty list when it is missing), links not followed."""
    if not path.exists() and not path.is_symlink():
        return []
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, dirs, files in os.walk(path) for f in files + dirs)


def plant_links(target: Target, root: Path) -> tuple[dict[str, Path], list[str]]:
    """Three jobs that planted a link to an empty folder under ``root`` where their export
    goes: at ``<prefix>/tensorboard``, at a trial's folder below it (at the name the server
    gives it and at the trial id), and at the prefix itself. Each has pushed 3 reports
    (the search: of trial ``t_00000``) and been exported once. Returns the folders and jobs."""
    outside = {k: root / f"outside-{k}" for k in ("tensorboard", "trial", "prefix")}
    for path in outside.values():
        path.mkdir()
    linked = running(target, tracked_train({"tensorboard": True}, "linked-folder"))
    prefix(target, linked).mkdir(parents=True)
    os.symlink(outside["tensorboard"], prefix(target, linked) / "tensorboard")
    search = running(target, tracked_search({"tensorboard": True}))
    (prefix(target, search) / "tensorboard").mkdir(parents=True)
    for name in (trial_folder("t_00000"), "t_00000"):
        os.symlink(outside["trial"], prefix(target, search) / "tensorboard" / name)
    relinked = running(target, tracked_train({"tensorboard": True}, "linked-prefix"))
    os.symlink(outside["prefix"], prefix(target, relinked))
    push(target, linked, metrics(0, 3))
    push(target, search, trial_metrics("t_00000", 0, 3))
    push(target, relinked, metrics(0, 3))
    for job in (linked, relinked):
        wait_exported(target, job, reports=3)
    wait_exported(target, search)
    return outside, [linked, search, relinked]
