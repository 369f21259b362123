"""Schedules over real HTTP (bench/harness/tenancy_world.py: a real server on SQLite, no
Ray, projects alpha and beta and every kind of caller): the SDK and the CLI create, list,
pause, resume and delete them; a caller sees only their projects' schedules and a viewer
cannot change them; bad input gets a 4xx with a code (the per-project cap: tests/test_schedules.py); and the server's own schedules unit
fires a due tick into a QUEUED job labelled with its schedule, logged as fired."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import yaml
from sqlalchemy import update

from api.client import Client
from api.schemas.schedules import MAX_CRON_CHARS, SCHEDULE_LABEL
from bench.harness.specs import digits_spec
from bench.harness.tenancy_world import schedule_body
from service.db.models import utcnow
from service.db.schedule_models import ScheduleRow
from tests.support.cli_runner import cli

pytestmark = pytest.mark.slow  # starts a server (no Ray)


@pytest.fixture(scope="module")
def world(tenancy_world):
    return tenancy_world  # shared with tests/test_tenancy_matrix.py (one server start)


def test_the_sdk_and_cli_manage_schedules_within_the_callers_projects(world, tmp_path):
    with Client(world.url, token=world.tokens["mate"]) as mate:
        made = mate.create_schedule(schedule_body(cron="30 6 * * MON-FRI", timezone="Europe/Berlin"))
        assert made.project == "alpha" and made.owner == "mate" and made.concurrency == "forbid"
        assert len(made.next_runs) == 3 and made.next_runs == sorted(made.next_runs)
        assert all(t.weekday() < 5 for t in made.next_runs)
        assert made.id in {s.id for s in mate.schedules()}
        assert len(mate.schedule(made.id, next_runs=10).next_runs) == 10
    with world.http("other") as other:
        assert made.id not in other.get("/v1/schedules").text and world.schedule not in other.get("/v1/schedules").text
        hidden = other.get(f"/v1/schedules/{made.id}")
        assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "schedule_not_found"
    with world.http("viewer") as viewer:
        assert viewer.get(f"/v1/schedules/{made.id}").status_code == 200
        refused = viewer.patch(f"/v1/schedules/{made.id}", json={"paused": True})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden_role"

    owner = world.tokens["owner"]
    listed = cli(world.url, owner, "schedule", "list")
    assert listed.exit_code == 0 and made.id in listed.output and "Europe/Berlin" in listed.output
    paused = cli(world.url, owner, "schedule", "pause", made.id)
    assert paused.exit_code == 0 and "paused" in paused.output
    assert "paused" in cli(world.url, owner, "schedule", "list").output
    assert cli(world.url, owner, "schedule", "resume", made.id).exit_code == 0
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(digits_spec(name="from-cli", project="alpha")))
    created = cli(world.url, owner, "schedule", "create", str(job_file), "--cron", "@daily", "--concurrency", "allow")
    assert created.exit_code == 0, created.output
    new_id = created.output.split()[0]
    with Client(world.url, token=owner) as sdk:
        assert sdk.schedule(new_id).concurrency == "allow" and sdk.schedule(new_id).cron == "@daily"
    assert cli(world.url, owner, "schedule", "delete", made.id).exit_code == 0
    assert cli(world.url, owner, "schedule", "delete", new_id).exit_code == 0
    gone = cli(world.url, owner, "schedule", "pause", made.id)
    assert gone.exit_code == 1 and "No schedule" in gone.output
    assert cli(world.url, owner, "schedule", "create", str(job_file)).exit_code == 2  # a job spec needs --cron


@pytest.mark.parametrize(
    "overrides, code",
    [
        ({"cron": "1 " * (MAX_CRON_CHARS // 2 + 1)}, "invalid_request"),
        ({"cron": "*/5 * * * * *"}, "invalid_cron"),
        ({"cron": "0 0 31 2 *"}, "invalid_cron"),
        ({"timezone": "Nowhere/Special"}, "invalid_timezone"),
        ({"timezone": "../../etc/passwd"}, "invalid_request"),
        ({"concurrency": "queue"}, "invalid_request"),
        ({"catch_up": "all"}, "invalid_request"),
        ({"every": "day"}, "invalid_request"),
        ({"job": {**digits_spec(), "epochs": 0}}, "invalid_request"),
        ({"job": {**digits_spec(), "labels": {SCHEDULE_LABEL: "s0"}}}, "invalid_request"),
        ({"job": {**digits_spec(), "labels": {f"k{i}": "v" * 256 for i in range(31)}}}, "invalid_request"),
        ({"job": {"name": "big", "entrypoint": "m:f", "config": {"x": "a" * 70_000}}}, "invalid_request"),
        ({"project": "beta"}, "project_not_found"),
    ],
)
def test_bad_input_gets_a_4xx_with_a_code(world, overrides, code):
    with world.http("owner") as owner:
        r = owner.post("/v1/schedules", json=schedule_body(**overrides))
    assert 400 <= r.status_code < 500 and r.json()["error"]["code"] == code, r.text


def test_bad_ids_and_bounds_on_reads_and_changes(world):
    with world.http("owner") as owner:
        assert owner.get("/v1/schedules/j123").status_code == 422
        assert owner.get("/v1/schedules", params={"next_runs": 11}).status_code == 422
        assert owner.patch(f"/v1/schedules/{world.schedule}", json={"paused": "maybe"}).status_code == 422
        assert owner.patch(f"/v1/schedules/{world.schedule}", json={"cron": "* * * * *"}).status_code == 422


def test_the_servers_unit_fires_a_due_tick_once(world):
    """The tick is put in the past in the store (the server was down over it): the running
    server's schedules unit fires it once, catch_up=once, as the schedule's owner."""
    schedule = world.fresh_schedule("mate", catch_up="once")
    with world.service.sessions.begin() as s:
        past = utcnow() - timedelta(days=1)
        s.execute(update(ScheduleRow).where(ScheduleRow.id == schedule).values(next_tick=past))
    label = {"label": f"{SCHEDULE_LABEL}={schedule}"}
    with world.http("owner") as owner:
        deadline = time.monotonic() + 60
        while not (jobs := owner.get("/v1/jobs", params=label).json()["items"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(jobs) == 1, "the server's schedules unit did not fire the due tick"
        job = jobs[0]
        assert job["status"] == "QUEUED" and job["project"] == "alpha" and job["name"] == "nightly"
        after = owner.get(f"/v1/schedules/{schedule}").json()
        assert after["fired"] == 1 and after["last_job_id"] == job["id"] and after["last_outcome"] == "fired"
        events = owner.get("/v1/events", params={"job": job["id"]}).json()["items"]
        assert {(e["type"], e["actor"]) for e in events} >= {("submitted", "mate"), ("schedule_fired", "mate")}
        time.sleep(1.5)  # the unit runs again meanwhile: the tick is handled, nothing more fires
        assert len(owner.get("/v1/jobs", params=label).json()["items"]) == 1
        owner.post(f"/v1/jobs/{job['id']}/cancel").raise_for_status()
