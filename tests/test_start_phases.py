"""Start-up phases on the store, with no Ray behind it: what a job may mark (its own
phases, once each, in its current attempt, at a time inside it), what the server marks
itself (queued, the first metric, a trial's first report), and how the API answers them.
The jobs that mark them for real are tests/test_jobs.py, tests/test_user_code.py and
tests/test_tune.py (phases asserted on jobs those tests run anyway)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

from api.schemas import JobStatus
from api.schemas.jobs import phase_seconds
from service import lifecycle
from service.db.engine import make_sessionmaker
from service.db.event_models import TrialRow
from service.db.models import Base, JobRow, utcnow
from service.events.ingest import Ingest
from trainers import phases

SID = "raydock-jp-1-abc"


@pytest.fixture()
def store():
    engine = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
    Base.metadata.create_all(engine)
    return make_sessionmaker(engine)


def running_job(store, queued: float, kind: str = "train", job_id: str = "jp") -> str:
    with store.begin() as s:
        s.add(
            JobRow(
                id=job_id,
                name="t",
                kind=kind,
                status=JobStatus.RUNNING.value,
                spec={"kind": kind, "metric": "loss", "mode": "min"},
                labels={},
                created_at=utcnow(),
                queued_at=utcnow(),
                attempt=1,
                ray_job_id=SID,
                start_phases={"queued": queued, "admitted": queued + 0.01, "submitted": queued + 0.02},
            )
        )
    return job_id


def phase(name: str, ts: float, seq: int | None = None) -> dict:
    return {"type": "phase", "seq": phases.PHASES.index(name) if seq is None else seq, "ts": ts, "phase": name}


def stored(store, job_id: str = "jp") -> JobRow:
    with store() as s:
        return s.get(JobRow, job_id)


def test_a_job_marks_its_own_phases_and_the_api_answers_seconds_in_order(store, tmp_path):
    t0 = time.time() - 10
    running_job(store, t0)
    events = [phase("first_step", t0 + 4), phase("driver_started", t0 + 1), phase("workers_placed", t0 + 2.5)]
    assert Ingest(store, str(tmp_path)).take("jp", events, push=True, attempt_of=SID)
    job = stored(store)
    assert job.dropped_events == 0
    assert list(phase_seconds(job.start_phases).items()) == [
        ("queued", 0.0),
        ("admitted", 0.01),
        ("submitted", 0.02),
        ("driver_started", 1.0),
        ("workers_placed", 2.5),
        ("first_step", 4.0),
    ]


@pytest.mark.parametrize(
    "event, why",
    [
        ({"type": "phase", "seq": 3, "ts": 1.0, "phase": "warm_pool"}, "invalid event"),  # unknown name
        (phase("first_metric", 0), "the server's to mark"),  # a server phase
        (phase("queued", 0), "the server's to mark"),
        (phase("first_step", 0, seq=3), "not its place"),  # a seq that is not the phase's
        (phase("driver_started", -5), "outside this attempt"),  # before the attempt was queued
        (phase("driver_started", 3600), "outside this attempt"),  # an hour ahead of the server
        ({"type": "phase", "seq": 3, "ts": -1.0, "phase": "driver_started"}, "invalid event"),  # negative time
    ],
)
def test_a_phase_the_job_may_not_set_is_dropped_and_counted(store, tmp_path, event, why):
    t0 = time.time() - 10
    running_job(store, t0)
    if event["ts"] not in (-1.0, 1.0):
        event = {**event, "ts": t0 + event["ts"]}
    Ingest(store, str(tmp_path)).take("jp", [event], push=True, attempt_of=SID)
    job = stored(store)
    assert set(job.start_phases) == {"queued", "admitted", "submitted"}
    assert job.dropped_events == 1 and why in job.last_dropped_reason


def test_a_phase_marked_twice_keeps_the_first(store, tmp_path):
    t0 = time.time() - 10
    running_job(store, t0)
    ingest = Ingest(store, str(tmp_path))
    ingest.take("jp", [phase("process_group_ready", t0 + 3)], push=True, attempt_of=SID)
    ingest.take("jp", [phase("process_group_ready", t0 + 7)], push=True, attempt_of=SID)
    ingest.take("jp", [phase("process_group_ready", t0 + 5)])  # the log channel brings it again
    job = stored(store)
    assert job.start_phases["process_group_ready"] == t0 + 3 and job.dropped_events == 0


def test_phases_of_another_attempt_or_a_job_not_running_are_not_stored(store, tmp_path):
    t0 = time.time() - 10
    running_job(store, t0)
    ingest = Ingest(store, str(tmp_path))
    ingest.take("jp", [phase("driver_started", t0 + 1)], push=True, attempt_of="raydock-jp-0-old")
    assert "driver_started" not in stored(store).start_phases
    with store.begin() as s:  # the attempt failed and was resumed: queued again, phases afresh
        job = s.get(JobRow, "jp")
        lifecycle.fail(s, job, lifecycle.C.USER_CODE, "boom")
        lifecycle.transition(s, job, JobStatus.QUEUED, reason="resumed")
    requeued = stored(store).start_phases
    assert list(requeued) == ["queued"] and requeued["queued"] > t0 + 5
    ingest.take("jp", [phase("driver_started", time.time())])  # QUEUED: no attempt runs
    assert list(stored(store).start_phases) == ["queued"]


def test_the_first_metric_of_an_attempt_is_stamped_once_by_the_server(store, tmp_path):
    t0 = time.time() - 10
    running_job(store, t0)
    ingest = Ingest(store, str(tmp_path))
    before = time.time()
    metric = {"type": "metric", "seq": 0, "ts": t0 + 1, "metrics": {"loss": 1.0}}
    ingest.take("jp", [metric], push=True, attempt_of=SID)
    first = stored(store).start_phases["first_metric"]
    assert before <= first <= time.time()  # the server's clock, not the report's
    ingest.take("jp", [{**metric, "seq": 1}], push=True, attempt_of=SID)
    assert stored(store).start_phases["first_metric"] == first


def test_a_trial_records_the_seconds_from_its_start_to_its_first_report(store, tmp_path):
    t0 = time.time() - 10
    running_job(store, t0, kind="tune")
    ingest = Ingest(store, str(tmp_path))
    started = time.time() - 2
    ingest.take("jp", [{"type": "trial", "seq": 0, "ts": started, "trial_id": "t1", "status": "RUNNING"}])
    report = {"type": "trial_metric", "seq": 0, "ts": time.time(), "trial_id": "t1", "metrics": {"loss": 1.0}}
    ingest.take("jp", [report, {**report, "seq": 1}])
    taken = time.time()
    with store() as s:
        trial = s.query(TrialRow).one()
    assert 2.0 <= trial.first_metric_s <= taken - started
    assert "first_metric" in stored(store).start_phases  # the search's own: its first trial report


def test_a_job_stored_before_phases_answers_none():
    assert phase_seconds(None) is None and phase_seconds({"driver_started": 5.0}) is None


# ----------------------------------------------------------------------------- mark()


def _mark_in_child(code: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(
        [sys.executable, "-c", f"from trainers import phases\n{code}"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
        check=True,
    )
    return out.stdout


def test_mark_writes_one_event_line_per_phase_on_rank_0_only():
    out = _mark_in_child("phases.mark('first_step', 123.5); phases.mark('first_step')", {"RANK": "0"})
    assert out.splitlines() == ['RAYDOCK_EVENT {"seq":6,"ts":123.5,"type":"phase","phase":"first_step"}']
    assert _mark_in_child("phases.mark('first_step')", {"RANK": "1"}) == ""


def test_mark_refuses_a_phase_that_is_not_the_jobs():
    with pytest.raises(ValueError) as refused:
        phases.mark("first_metric")
    assert "driver_started, workers_placed, process_group_ready, first_step" in str(refused.value)


def test_the_process_start_is_the_processs_own_not_now():
    code = "import time; from trainers.phases import process_started_at as p; time.sleep(1.5); print(time.time() - p())"
    before = time.time()
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    # The child's start came before its imports and its sleep: it is older than the sleep,
    # and no older than this call.
    assert 1.5 <= age <= time.time() - before + 0.05
