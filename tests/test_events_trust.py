"""One job's code forging another job's events, as a hostile job on the same Ray cluster
can (same OS user, same storage): what the forged push may still reach, over real HTTP on
real SQLite and PostgreSQL (``bench/harness/attacks.py``), and the launch file the token travels
in, read and deleted by the driver's own code (``trainers.launch``)."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from api.schemas.events import SUBMISSION_HEADER
from bench.harness import attacks
from bench.harness.jobstore import set_columns
from service.db.event_models import CheckpointRow, MetricRow
from service.files import storage
from trainers import launch as launch_mod

# Each test starts servers of its own and takes seconds: out of the fast command.
pytestmark = pytest.mark.slow

METRIC = {"type": "metric", "seq": 0, "ts": 1.0, "metrics": {"loss": 0.5}}


@pytest.fixture()
def target(tmp_path, database_url):
    t = attacks.start_target(tmp_path, database_url)
    yield t
    t.stop()


def count(target, table, job_id: str) -> int:
    with target.service.sessions() as s:
        return int(s.scalar(select(func.count()).select_from(table).where(table.job_id == job_id)))


def forge(target, job_id: str, body, sid: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {attacks.TOKEN}", **({SUBMISSION_HEADER: sid} if sid else {})}
    return httpx.post(f"{target.url}/v1/internal/jobs/{job_id}/events", json=body, headers=headers, timeout=30)


def test_a_push_that_names_no_attempt_or_another_is_refused(target):
    """The attacker holds the token read from the job's launch file, but not the
    submission id the server recorded for the attempt now running."""
    job_id = target.running_job()
    for sid in (None, "raydock-other-1-000000", attacks.SID + "x"):
        r = forge(target, job_id, METRIC, sid)
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "not_current_attempt"
        assert SUBMISSION_HEADER in r.json()["error"]["message"]
    assert count(target, MetricRow, job_id) == 0
    assert forge(target, job_id, METRIC, attacks.SID).status_code == 204  # the attempt's own push goes in
    assert count(target, MetricRow, job_id) == 1


def test_a_token_of_an_earlier_attempt_stores_nothing_in_the_next(target):
    """Attempt 2 started after the push of attempt 1 was let in: its events go nowhere."""
    job_id = target.running_job()
    set_columns(target.service, job_id, attempt=2, ray_job_id="raydock-attacked-2-fedcba")
    r = forge(target, job_id, METRIC, attacks.SID)
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_current_attempt", r.text
    target.service.ingest.take(job_id, [METRIC], push=True, attempt_of=attacks.SID)  # past the check, in a race
    assert count(target, MetricRow, job_id) == 0


def test_checkpoints_naming_the_launch_folder_or_the_prefix_are_dropped(target):
    job_id = target.running_job()
    prefix = Path(target.service.reads.prefix(job_id))
    launch = prefix / storage.LAUNCH_DIR / "launch-1.json"
    launch.parent.mkdir(parents=True)
    launch.write_text(json.dumps({"events_token": attacks.TOKEN}))
    paths = [str(launch.parent), str(launch), str(prefix), f"{prefix}/", f"{prefix}/{storage.LAUNCH_DIR}/../"]
    body = [{"type": "checkpoint", "seq": i, "path": p, "metrics": {}} for i, p in enumerate(paths)]
    body.append({"type": "result", "seq": 0, "path": str(launch.parent), "metrics": {}})
    body.append({"type": "result", "seq": 1, "path": str(prefix), "metrics": {}})  # a run's own directory: taken
    assert forge(target, job_id, body, attacks.SID).status_code == 204
    job = httpx.get(f"{target.url}/v1/jobs/{job_id}").json()
    assert job["dropped_events"] == len(body) - 1, job
    assert count(target, CheckpointRow, job_id) == 0


def test_a_checkpoint_is_downloaded_without_the_launch_file(target):
    """A row naming the launch folder (an older server stored it) is not downloadable, and a
    checkpoint directory holding a link to the launch file is packed without it."""
    job_id = target.running_job()
    prefix = Path(target.service.reads.prefix(job_id))
    launch = prefix / storage.LAUNCH_DIR / "launch-1.json"
    launch.parent.mkdir(parents=True)
    launch.write_text(json.dumps({"events_token": attacks.TOKEN}))
    ckpt = prefix / "checkpoint_000000"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(b"weights")
    os.symlink(launch, ckpt / "launch.json")
    os.symlink(launch.parent, ckpt / "dir")
    with target.service.sessions.begin() as s:
        rows = [CheckpointRow(job_id=job_id, attempt=1, path=p, values={}) for p in (str(launch.parent), str(ckpt))]
        s.add_all(rows)
    ids = [r.id for r in rows]
    listed = httpx.get(f"{target.url}/v1/jobs/{job_id}/checkpoints").json()
    assert [c["id"] for c in listed] == [ids[1]]
    r = httpx.get(f"{target.url}/v1/jobs/{job_id}/checkpoints/{ids[0]}/download")
    assert r.status_code == 404, r.text
    r = httpx.get(f"{target.url}/v1/jobs/{job_id}/checkpoints/{ids[1]}/download")
    assert r.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as tar:
        names = tar.getnames()
    assert names == ["model.pt"], names
    assert attacks.TOKEN.encode() not in r.content


def test_the_driver_deletes_its_launch_file_once_read(tmp_path, monkeypatch):
    """The token is readable by other jobs only until the driver starts; the processes
    the driver starts get the channel from it, not from the file."""
    uri = tmp_path / "_raydock" / "launch-1.json"
    uri.parent.mkdir()
    data = {"job_id": "j1", "attempt": 1, "submission_id": "raydock-j1-1-abc", "events_url": "http://x/e"}
    uri.write_text(json.dumps({**data, "events_token": "secret", "spec": {}, "storage_path": str(tmp_path)}))
    monkeypatch.setenv(launch_mod.LAUNCH_URI_ENV, str(uri))
    launch_mod.read_launch.cache_clear()
    try:
        got = launch_mod.take_launch()
        assert not uri.exists()
        assert got.channel == launch_mod.EventsChannel("http://x/e", "secret", "raydock-j1-1-abc")
        assert launch_mod.read_launch() == got  # the driver's later reads: from memory
    finally:
        launch_mod.read_launch.cache_clear()


# ------------------------------------------------------------------ replay of a forged lineage


@pytest.mark.slow
def test_a_replay_of_a_3000_clone_lineage_answers_without_recursion(target):
    job_id = target.running_search()
    r = attacks.replay_of_a_lineage(target, job_id, 3000)
    assert r.status_code == 200, r.text[:500]
    intervals = r.json()["schedule"]["intervals"]
    print(f"\nreplay of a 3000-clone lineage: {len(intervals)} intervals in {r.elapsed.total_seconds():.2f} s")
    assert [i["at"] for i in intervals] == list(range(3001))
