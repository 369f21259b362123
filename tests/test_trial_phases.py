"""A search trial's start-up phases and its worker groups, from the events a search sends
(no Ray: the events are taken in as its driver, its trials' Train controllers and
workers send them): on the store (SQLite and PostgreSQL), over real HTTP, and as
``raydock trials`` prints them."""

from __future__ import annotations

import time

import httpx
import pytest
from typer.testing import CliRunner

from api.client import Client
from api.schemas import event_line, parse_event, parse_job_spec
from api.schemas.events import SUBMISSION_HEADER
from bench.harness.attacks import SEARCH
from bench.harness.jobstore import dead_ray, job_service, set_columns
from bench.harness.servers import ServerProcess
from service.cli import app
from service.cli.common import console
from service.db.models import JobRow
from service.events.reads.trials import TrialService
from service.events.reads.worker_groups import worker_groups
from service.events.tokens import token_hash
from trainers.callbacks import run_seq

TOKEN = "trial-phases-token"
SID = "raydock-trial-phases-1"
NODE = {"ip": "10.0.0.7", "node_id": "n" * 56}


def trial_events(t0: float) -> list[dict]:
    """Trial t_00000 as a PBT search reports it: queued, started, its Train run placed and
    stepping, a report; cloned at t0+10, paused, restarted from its donor, placed, a
    report, and the first step of the restarted run last (it travels through the log)."""
    run1, run2 = "t_00000-aaaaaa", "t_00000-bbbbbb"
    return [
        {"type": "trial", "seq": 0, "ts": t0, "trial_id": "t_00000", "status": "PENDING"},
        {"type": "trial", "seq": 1, "ts": t0 + 1, "trial_id": "t_00000", "status": "RUNNING"},
        {"type": "worker_group", "seq": run_seq(run1, 0), "ts": t0 + 4, "world_size": 1, "nodes": [NODE]}
        | {"trial_id": "t_00000"},
        {"type": "phase", "seq": 6, "ts": t0 + 6, "phase": "first_step", "trial_id": "t_00000"},
        {"type": "trial_metric", "seq": 2, "ts": t0 + 8, "trial_id": "t_00000", "metrics": {"val_acc": 0.5}},
        {"type": "exploit", "seq": 3, "ts": t0 + 10, "trial_id": "t_00000", "donor_trial_id": "t_00001"},
        {"type": "trial", "seq": 4, "ts": t0 + 10.5, "trial_id": "t_00000", "status": "PAUSED"},
        {"type": "trial", "seq": 5, "ts": t0 + 11, "trial_id": "t_00000", "status": "RUNNING"},
        {"type": "worker_group", "seq": run_seq(run2, 0), "ts": t0 + 13, "world_size": 1, "nodes": [NODE]}
        | {"trial_id": "t_00000"},
        {"type": "trial_metric", "seq": 6, "ts": t0 + 16, "trial_id": "t_00000", "metrics": {"val_acc": 0.7}},
        {"type": "phase", "seq": 6, "ts": t0 + 15, "phase": "first_step", "trial_id": "t_00000"},
    ]


START = {"queued": 0.0, "placed": 4.0, "first_step": 6.0, "first_metric": 8.0}
RESTART = {"paused": 0.5, "restored": 3.0, "first_step": 5.0, "first_metric": 6.0}


def search_job(service) -> str:
    job, _ = service.jobs.submit(parse_job_spec(SEARCH))
    set_columns(service, job.id, status="RUNNING", attempt=1, ray_job_id=SID, events_token_hash=token_hash(TOKEN))
    return job.id


def test_a_trials_phases_come_from_its_events_whichever_channel_brings_them(database_url, tmp_path):
    service = job_service(database_url, tmp_path)
    job_id = search_job(service)
    events = trial_events(time.time())
    marks = [e for e in events if e["type"] == "phase"]
    # The driver's and the controllers' events are pushed in order; the workers' first
    # steps come through the log, after the reports that followed them; the log brings
    # every other event a second time.
    service.ingest.take(job_id, [e for e in events if e not in marks], push=True)
    service.ingest.take(job_id, marks + events)
    (trial,) = TrialService(service.sessions).trials(job_id)
    assert trial.start_phases == START
    assert [e.model_dump(exclude={"at"}) for e in trial.exploit_phases] == [RESTART]
    groups = worker_groups(service.sessions, job_id)
    assert [(g.seq, g.trial_id, g.world_size) for g in groups] == [(0, "t_00000", 1), (1, "t_00000", 1)]
    with service.sessions() as s:
        assert s.get(JobRow, job_id).dropped_events == 0


def test_a_training_job_cannot_name_a_trial_on_its_worker_groups(database_url, tmp_path):
    from bench.harness.jobstore import submit

    service = job_service(database_url, tmp_path)
    job_id = submit(service)
    set_columns(service, job_id, status="RUNNING", attempt=1)
    event = {"type": "worker_group", "seq": 0, "ts": time.time(), "world_size": 1, "nodes": [NODE]}
    service.ingest.take(job_id, [event | {"trial_id": "t_00000"}])
    (group,) = worker_groups(service.sessions, job_id)
    assert group.trial_id is None


def test_event_lines_run_together_by_a_drivers_threads_are_each_taken(database_url, tmp_path):
    service = job_service(database_url, tmp_path)
    job_id = search_job(service)
    t0 = time.time()
    queued, running = trial_events(t0)[:2]
    step = {"type": "phase", "seq": 6, "ts": t0 + 2, "phase": "first_step", "trial_id": "t_00000"}
    lines = [
        # print() writes a line and its newline apart: the search's event, then Ray's
        # forwarded worker line, then both newlines.
        f"{event_line(parse_event(queued))}\x1b[36m(RayTrainWorker pid=4242)\x1b[0m {event_line(parse_event(step))}",
        "",
        f"(run_trial pid=77) {event_line(parse_event(running))} [repeated 2x across cluster]",
        "RAYDOCK_EVENT {not json",
    ]
    service.ingest.log(job_id, "\n".join(lines) + "\n", 0)
    (trial,) = TrialService(service.sessions).trials(job_id)
    assert trial.status == "RUNNING" and trial.start_phases == {"queued": 0.0, "first_step": 2.0}
    with service.sessions() as s:
        job = s.get(JobRow, job_id)
        assert "first_step" in job.start_phases
        assert job.dropped_events == 1 and "valid dictionary" in job.last_dropped_reason  # the broken one alone


@pytest.fixture()
def server(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    url = f"sqlite:///{data / 'raydock.db'}"
    service = job_service(url, data)
    proc = ServerProcess(data, dead_ray(), extra_env={"RAYDOCK_DATABASE_URL": url}).start()
    yield proc, service
    proc.stop()
    service.sessions.kw["bind"].dispose()


def test_a_clean_search_shows_its_trials_worker_groups_and_phases_over_http(server):
    proc, service = server
    job_id = search_job(service)
    events = trial_events(time.time())
    pushed = httpx.post(
        f"{proc.url}/v1/internal/jobs/{job_id}/events",
        json=events[:-1],
        headers={"Authorization": f"Bearer {TOKEN}", SUBMISSION_HEADER: SID},
    )
    assert pushed.status_code == 204, pushed.text
    # The restarted worker's first step reaches the driver's log with Ray's prefix on it,
    # run into one of the driver's own lines by its two threads writing at once.
    with service.sessions.begin() as s:
        s.get(JobRow, job_id).log_offset = 0
    own, worker = event_line(parse_event(events[1])), event_line(parse_event(events[-1]))
    line = f"{own}(RayTrainWorker pid=4242) {worker}\n"
    assert service.ingest.log(job_id, line, 0) == len(line)

    with Client(proc.url) as client:
        job = client.job(job_id)
        assert job.info.dropped_events == 0, job.info.last_dropped_reason
        groups = httpx.get(f"{proc.url}/v1/jobs/{job_id}/worker-groups").json()
        assert [g["trial_id"] for g in groups] == ["t_00000", "t_00000"]
        (trial,) = job.trials()
        assert trial.start_phases == START
        assert [e.model_dump(exclude={"at"}) for e in trial.exploit_phases] == [RESTART]

    console.width = 80
    out = CliRunner().invoke(app, ["trials", job_id], env={"RAYDOCK_URL": proc.url, "RAYDOCK_API_TOKEN": None})
    assert out.exit_code == 0, out.output
    rows = [line.split() for line in out.stdout.splitlines() if line.lstrip().startswith("trial 0 ")]
    assert rows == [["trial", "0", "queued", "4", "6", "8"], ["trial", "0", "exploit", "1", "0.5", "3", "5", "6"]]
    assert max(len(line.rstrip()) for line in out.stdout.splitlines()) <= 80
