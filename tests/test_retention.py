"""History retention on SQLite and on a real PostgreSQL: the policy deletes exactly the
finished jobs it names, with their rows and their storage prefix, never a job that is
not finished; ``raydock gc --dry-run`` lists them and ``raydock gc`` deletes them."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from bench.harness.jobstore import dead_ray, job_service, set_columns, submit
from service.cluster.ray_backend import RayBackend
from service.db.event_models import CheckpointRow
from service.db.models import JobLabelRow, JobRow, TransitionRow, store_id, utcnow
from service.files import storage
from service.retention import Policy, RayRecords, Retention


@pytest.fixture()
def service(database_url, tmp_path):
    svc = job_service(database_url, tmp_path)
    yield svc
    svc.sessions.kw["bind"].dispose()


def history(service) -> dict[str, str]:
    """Jobs in every state, each with a file under its storage prefix and rows of its own."""
    now = utcnow()
    finished_days_ago = {
        "old_ok": ("SUCCEEDED", 10),
        "old_failed": ("FAILED", 8),
        "old_cancelled": ("CANCELLED", 30),
        "recent_ok": ("SUCCEEDED", 1),
        "recent_failed": ("FAILED", 2),
    }
    jobs = {
        name: submit(service, name=name, labels={"who": name})
        for name in [*finished_days_ago, "running", "queued", "resumed"]
    }
    for name, (status, days) in finished_days_ago.items():
        set_columns(service, jobs[name], status=status, finished_at=now - timedelta(days=days))
    # Not finished, whatever their finished_at says (a resumed job keeps its old one until it ends again).
    set_columns(service, jobs["running"], status="RUNNING", finished_at=now - timedelta(days=40))
    set_columns(service, jobs["resumed"], status="QUEUED", finished_at=now - timedelta(days=40))
    with service.sessions.begin() as s:
        for job_id in jobs.values():
            storage.write_private(service.reads.prefix(job_id), "ckpt/model.pt", b"weights")
            s.add(CheckpointRow(job_id=job_id, attempt=1, path=storage.join(service.reads.prefix(job_id), "ckpt")))
            s.add(TransitionRow(job_id=job_id, from_status="QUEUED", to_status="STARTING"))
    return jobs


def remaining(service) -> set[str]:
    with service.sessions() as s:
        return set(s.scalars(select(JobRow.id)))


def rows_of(service, job_ids: list[str]) -> int:
    with service.sessions() as s:
        return sum(
            s.scalar(select(func.count()).select_from(t).where(t.job_id.in_(job_ids)))
            for t in (CheckpointRow, TransitionRow, JobLabelRow)
        )


def test_retention_by_age_deletes_exactly_the_old_finished_jobs_with_their_rows_and_files(service):
    jobs = history(service)
    retention = Retention(service.sessions, service.settings.storage.resolved_storage_path, Policy(days=7))
    doomed, total = retention.due()
    names = ["old_cancelled", "old_ok", "old_failed"]  # oldest first
    assert [d.id for d in doomed] == [jobs[n] for n in names] and total == 3
    assert remaining(service) == set(jobs.values())  # listing deletes nothing

    assert retention.sweep() == 3
    gone = [jobs[n] for n in names]
    assert remaining(service) == set(jobs.values()) - set(gone)
    assert rows_of(service, gone) == 0 and rows_of(service, [jobs["running"]]) == 3
    for name, job_id in jobs.items():
        assert Path(service.reads.prefix(job_id)).exists() == (name not in names), name
    assert retention.sweep() == 0


def test_retention_by_count_keeps_the_newest_finished_and_never_touches_active_jobs(service):
    jobs = history(service)
    same = utcnow() - timedelta(days=3)
    set_columns(service, [jobs["recent_ok"], jobs["recent_failed"]], finished_at=same)  # a tie: the id decides
    keep_two = Retention(service.sessions, service.settings.storage.resolved_storage_path, Policy(max_finished=2))
    newest_two = sorted([jobs["recent_ok"], jobs["recent_failed"]])
    doomed, total = keep_two.due()
    assert total == 3 and {d.id for d in doomed} == {jobs["old_ok"], jobs["old_failed"], jobs["old_cancelled"]}

    keep_one = Retention(service.sessions, service.settings.storage.resolved_storage_path, Policy(max_finished=1))
    assert keep_one.sweep() == 4
    assert remaining(service) == {newest_two[1], jobs["running"], jobs["queued"], jobs["resumed"]}
    assert (
        Retention(
            service.sessions, service.settings.storage.resolved_storage_path, Policy(max_finished=0, days=1)
        ).sweep()
        == 1
    )
    assert remaining(service) == {jobs["running"], jobs["queued"], jobs["resumed"]}


def test_a_job_resumed_after_it_was_picked_is_not_deleted(service):
    jobs = history(service)
    retention = Retention(service.sessions, service.settings.storage.resolved_storage_path, Policy(days=7))
    picked = [d.id for d in retention.due()[0]]
    set_columns(service, jobs["old_ok"], status="QUEUED")  # resumed between the pick and the delete
    assert set(retention.delete_batch(picked)) == {jobs["old_failed"], jobs["old_cancelled"]}
    assert jobs["old_ok"] in remaining(service) and Path(service.reads.prefix(jobs["old_ok"])).exists()


def test_gc_command_lists_with_dry_run_and_deletes_without(tmp_path):
    service = job_service(f"sqlite:///{tmp_path / 'raydock.db'}", tmp_path)
    jobs = history(service)
    env = {"RAYDOCK_DATA_DIR": str(tmp_path), "RAYDOCK_RETENTION_DAYS": "7", "COLUMNS": "200"}
    env |= {"RAYDOCK_DATABASE_URL": None, "RAYDOCK_STORAGE_PATH": None}  # unset: the data dir's own

    def gc(*args: str) -> str:
        # In this process (Typer's runner): the command reads its settings afresh on each run.
        from service.cli.main import app

        done = CliRunner().invoke(app, ["gc", *args], env=env)
        assert done.exit_code == 0, done.output
        return done.output

    out = gc("--dry-run")
    assert "would delete 3 finished job(s)" in out
    assert all(jobs[n] in out for n in ("old_ok", "old_failed", "old_cancelled")) and jobs["recent_ok"] not in out
    assert remaining(service) == set(jobs.values())
    assert "deleted 1 finished job(s)" in gc("--days", "100", "--max-finished", "4")  # flags win over the settings
    assert jobs["old_cancelled"] not in remaining(service)
    assert "deleted 2 finished job(s)" in gc()
    assert remaining(service) == {jobs[n] for n in ("recent_ok", "recent_failed", "running", "queued", "resumed")}
    service.sessions.kw["bind"].dispose()


def test_ray_records_of_deleted_jobs_go_once_the_cluster_answers_and_never_hold_up_the_rows(ray_head, tmp_path):
    """Every attempt's Ray job of a deleted job is deleted from Ray; the records of jobs
    kept, and of another store's jobs, stay. A cluster that does not answer: the rows go
    anyway, and the next sweep that reaches it deletes the records."""
    service = job_service(f"sqlite:///{tmp_path / 'raydock.db'}", tmp_path)
    ray = RayBackend(ray_head.dashboard_url, auth_token=ray_head.auth_token())
    ours = store_id(service.sessions)
    old, recent = submit(service, name="old"), submit(service, name="recent")
    set_columns(service, old, status="FAILED", attempt=2, finished_at=utcnow() - timedelta(days=9))
    set_columns(service, recent, status="SUCCEEDED", attempt=1, finished_at=utcnow())

    def ray_job(job_id: str, attempt: int, store: str = ours) -> str:
        meta = {"raydock_job": job_id, "raydock_attempt": str(attempt), "raydock_store": store}
        return ray.jobs.submit_job(entrypoint="python -c 'print(1)'", metadata=meta)

    old_attempts = [ray_job(old, 1), ray_job(old, 2)]
    kept = [ray_job(recent, 1), ray_job(old, 1, store="rd-another-store")]
    deadline = time.monotonic() + 120
    while (
        any(ray.state(sid).status in ("PENDING", "RUNNING") for sid in old_attempts + kept)
        and time.monotonic() < deadline
    ):
        time.sleep(0.5)

    cut_off = Retention(
        service.sessions,
        service.settings.storage.resolved_storage_path,
        Policy(days=7),
        ray=RayBackend(dead_ray(), timeout_s=2),
    )
    assert cut_off.sweep() == 1  # the rows go although Ray never answered
    assert remaining(service) == {recent} and cut_off.ray_records == RayRecords(unreachable=True)
    assert all(ray.state(sid) is not None for sid in old_attempts)  # kept for a sweep that reaches the cluster

    retention = Retention(service.sessions, service.settings.storage.resolved_storage_path, Policy(days=7), ray=ray)
    assert retention.sweep() == 0  # nothing more to delete in the store; Ray's records of the deleted job go
    assert retention.ray_records == RayRecords(deleted=2)
    assert [ray.state(sid) for sid in old_attempts] == [None, None]
    assert all(ray.state(sid).status == "SUCCEEDED" for sid in kept)
    assert retention.sweep() == 0 and retention.ray_records == RayRecords()
    for sid in kept:
        ray.delete(sid)
    service.sessions.kw["bind"].dispose()
