"""Schedules fire through the server's own unit (service/schedules/firing.py, as
service/runtime.py builds it) on real SQLite and PostgreSQL, no Ray: each firing is a
QUEUED job labelled with its schedule. A tick fires once whatever replicas race for it or
restarts repeat it; missed ticks are skipped or run once; forbid, allow and replace decide
what a tick does while the last job runs; a replica that lost the unit's lease fires
nothing; what refuses a firing is recorded on the schedule. Times are given to the unit
(``now``), so no test waits for a clock."""

from __future__ import annotations

import threading
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import select, update

from api.errors import InvalidSpec, QuotaExceeded
from api.schemas import JobStatus, QuotaSpec
from api.schemas.schedules import SCHEDULE_LABEL, TICK_LABEL, ScheduleSpec
from api.schemas.tenancy import UserCreate
from bench.harness.jobstore import job_service, set_columns
from bench.harness.specs import digits_spec
from service.db.eventlog_models import EventLogRow
from service.db.leases import LeaseLost, Leases
from service.db.models import JobRow, utcnow
from service.db.schedule_models import ScheduleRow
from service.db.tenancy_models import UserRow
from service.runtime import Runtime
from service.schedules.firing import tick_label
from service.tenancy import quotas
from service.tenancy.caller import Caller

ADMIN = Caller("admin", None, True)


def spec(**overrides) -> ScheduleSpec:
    body = {"name": "nightly", "cron": "*/5 * * * *", "job": digits_spec(name="nightly-job"), **overrides}
    return ScheduleSpec.model_validate(body)


def fire(service: Runtime, now, fence=None) -> int:
    """One run of the server's own schedules unit at ``now``."""
    unit = next(u for u in service.runner.units() if u.name == "schedules")
    return unit.step(fence, now=now)


def jobs_of(service: Runtime, schedule_id: str) -> list[JobRow]:
    with service.sessions() as s:
        rows = s.scalars(select(JobRow).order_by(JobRow.created_at)).all()
    return [r for r in rows if r.labels.get(SCHEDULE_LABEL) == schedule_id]


@pytest.fixture()
def service(database_url, tmp_path):
    runtime = job_service(database_url, tmp_path)
    yield runtime
    runtime.sessions.kw["bind"].dispose()


def test_a_tick_fires_once_whatever_replicas_race_or_restarts_repeat(service, database_url, tmp_path):
    other = job_service(database_url, tmp_path / "b")  # a second replica on the same store
    made = service.schedules.create(spec(), ADMIN, "default")
    tick = made.next_runs[0]
    assert len(made.next_runs) == 3 and made.next_runs[1] - tick == timedelta(minutes=5)
    now = tick + timedelta(seconds=1)
    barrier, fired = threading.Barrier(4), []

    def run(side: Runtime) -> None:
        barrier.wait()
        fired.append(fire(side, now))

    threads = [threading.Thread(target=run, args=(side,)) for side in (service, other, service, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fired.append(fire(other, now + timedelta(seconds=30)))  # a restart runs the unit again within the tick
    assert sum(fired) == 1
    [job] = jobs_of(service, made.id)
    assert job.status == "QUEUED" and job.project == "default" and job.name == "nightly-job"
    assert job.labels[TICK_LABEL] == tick_label(tick)
    after = service.schedules.get(made.id, ADMIN)
    assert after.last_job_id == job.id and after.fired == 1 and after.last_outcome == "fired"
    assert after.last_tick == tick and after.next_runs[0] == tick + timedelta(minutes=5)
    with service.sessions() as s:
        logged = s.scalars(select(EventLogRow).where(EventLogRow.type == "schedule_fired")).all()
    assert [(e.job_id, e.data["schedule"]) for e in logged] == [(job.id, made.id)]
    other.sessions.kw["bind"].dispose()


def test_ticks_missed_while_down_are_skipped_or_run_once(service):
    skip = service.schedules.create(spec(cron="0 * * * *", catch_up="skip"), ADMIN, "default")
    once = service.schedules.create(spec(cron="@hourly", catch_up="once"), ADMIN, "default")
    down_until = skip.next_runs[0] + timedelta(hours=3, minutes=5)  # four ticks passed meanwhile
    assert fire(service, down_until) == 1
    assert jobs_of(service, skip.id) == []
    skipped = service.schedules.get(skip.id, ADMIN)
    assert skipped.last_outcome.startswith("skipped") and "catch_up=skip" in skipped.last_outcome
    assert skipped.next_runs[0] > down_until
    [job] = jobs_of(service, once.id)  # one job for the latest missed tick, not four
    assert job.labels[TICK_LABEL] == tick_label(once.next_runs[0] + timedelta(hours=3))
    assert fire(service, down_until + timedelta(seconds=5)) == 0


def test_what_a_tick_does_while_the_last_job_has_not_ended(service):
    made = {p: service.schedules.create(spec(concurrency=p), ADMIN, "default") for p in ("forbid", "allow", "replace")}
    first_tick = made["forbid"].next_runs[0]
    assert fire(service, first_tick) == 3
    first = {p: jobs_of(service, s.id)[0] for p, s in made.items()}
    assert fire(service, first_tick + timedelta(minutes=5)) == 2  # allow and replace
    jobs = {p: [(j.id, j.status) for j in jobs_of(service, s.id)] for p, s in made.items()}
    assert jobs["forbid"] == [(first["forbid"].id, "QUEUED")]
    outcome = service.schedules.get(made["forbid"].id, ADMIN).last_outcome
    assert outcome.startswith("skipped") and first["forbid"].id in outcome
    assert [status for _, status in jobs["allow"]] == ["QUEUED", "QUEUED"]
    assert jobs["replace"][0] == (first["replace"].id, "CANCELLED") and jobs["replace"][1][1] == "QUEUED"
    set_columns(service, first["forbid"].id, status=JobStatus.SUCCEEDED.value)  # ended: its next tick fires
    assert fire(service, first_tick + timedelta(minutes=10)) == 3
    assert len(jobs_of(service, made["forbid"].id)) == 2


def test_a_paused_schedule_fires_nothing_and_resumes_from_its_next_tick(service):
    made = service.schedules.create(spec(cron="* * * * *", paused=True), ADMIN, "default")
    assert made.paused and made.next_runs == []
    assert fire(service, made.created_at + timedelta(minutes=30)) == 0
    with service.sessions.begin() as s:  # it was made an hour ago: ticks passed while it was paused
        s.execute(update(ScheduleRow).where(ScheduleRow.id == made.id).values(created_at=utcnow() - timedelta(hours=1)))
    resumed = service.schedules.set_paused(made.id, False, ADMIN)
    assert resumed.last_outcome == "skipped: paused over its tick" and resumed.fired == 0
    assert fire(service, resumed.next_runs[0]) == 1
    assert [j.labels[TICK_LABEL] for j in jobs_of(service, made.id)] == [tick_label(resumed.next_runs[0])]
    service.schedules.delete(made.id, ADMIN)
    assert fire(service, resumed.next_runs[0] + timedelta(minutes=1)) == 0  # deleted: nothing more
    assert len(jobs_of(service, made.id)) == 1  # its job stays


def test_a_replica_that_lost_the_units_lease_fires_nothing(service, database_url, tmp_path):
    engine = service.sessions.kw["bind"]
    a, b = Leases(engine, 60.0, holder="host-a/1/aa"), Leases(engine, 60.0, holder="host-b/2/bb")
    stale = a.claim(["schedules"])["schedules"]
    a.release()  # a pauses; b takes the unit over
    fresh = b.claim(["schedules"])["schedules"]
    made = service.schedules.create(spec(), ADMIN, "default")
    with pytest.raises(LeaseLost):
        fire(service, made.next_runs[0], stale)
    assert jobs_of(service, made.id) == []
    assert service.schedules.get(made.id, ADMIN).last_tick is None  # the tick is still the holder's to fire
    assert fire(service, made.next_runs[0], fresh) == 1


def test_a_refused_firing_is_recorded_and_its_tick_handled(service):
    users = service.users
    users.create(UserCreate(name="ann", project=None), actor="admin")
    service.projects.create("alpha", ADMIN)
    service.projects.set_member("alpha", "ann", "member", ADMIN)
    with service.sessions() as s:
        ann = Caller("ann", s.scalar(select(UserRow.id).where(UserRow.name == "ann")), False, {"alpha": "member"})
    made = service.schedules.create(spec(), ann, "alpha")
    assert made.owner == "ann" and made.project == "alpha"
    with service.sessions.begin() as s:
        quotas.set_quota(s, "alpha", QuotaSpec(max_queued=0))
    tick = made.next_runs[0]
    assert fire(service, tick) == 0
    outcome = service.schedules.get(made.id, ADMIN).last_outcome
    assert outcome.startswith("refused") and "max_queued" in outcome
    with service.sessions.begin() as s:
        quotas.set_quota(s, "alpha", QuotaSpec())
    assert fire(service, tick + timedelta(minutes=5)) == 1
    [job] = jobs_of(service, made.id)
    assert job.user_id == ann.user_id and job.project == "alpha"  # submitted as its owner
    service.projects.remove_member("alpha", "ann", ADMIN)
    assert fire(service, tick + timedelta(minutes=10)) == 0
    assert "may no longer submit" in service.schedules.get(made.id, ADMIN).last_outcome


def test_create_refuses_what_could_never_fire(tmp_path):
    service = job_service(f"sqlite:///{tmp_path / 'raydock.db'}", tmp_path)  # no store question: SQLite alone
    for body, code in (
        (spec(cron="* * * * * *"), "invalid_cron"),
        (spec(cron="0 0 30 2 *"), "invalid_cron"),
        (spec(timezone="Mars/Olympus"), "invalid_timezone"),
    ):
        with pytest.raises(InvalidSpec) as refused:
            service.schedules.create(body, ADMIN, "default")
        assert refused.value.code == code, body
    service.settings.scheduling.max_schedules_per_project = 2
    for _ in range(2):
        service.schedules.create(spec(), ADMIN, "default")
    with pytest.raises(QuotaExceeded) as full:
        service.schedules.create(spec(), ADMIN, "default")
    assert full.value.code == "too_many_schedules" and "RAYDOCK_MAX_SCHEDULES_PER_PROJECT" in full.value.message
    in_berlin = service.schedules.create(spec(cron="0 3 * * *", timezone="Europe/Berlin"), ADMIN, "other")
    assert all(t.astimezone(ZoneInfo("Europe/Berlin")).hour == 3 for t in in_berlin.next_runs)
