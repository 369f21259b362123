"""Quotas and fair share without Ray: the admission order (within guarantee first, then
decayed usage by the formula, then priority, then arrival), the reasons a job waits, the
max_queued refusal, the choice of jobs to preempt, and the accounting sums, on a real
SQLite store."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select

from api.errors import QuotaExceeded
from api.schemas import JobStatus, QuotaSpec, parse_job_spec
from bench.harness.jobstore import job_service, set_columns, submit
from service import lifecycle
from service.db.models import JobRow, aware, utcnow
from service.db.tenancy_models import JobUsageRow, ProjectUsageRow
from service.scheduling import admission, queue
from service.scheduling.fair_share import ProjectLoad, Quota, Running, decay, victims
from service.settings import Settings
from service.tenancy import quotas, usage

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def q(job_id, project, cpus=1.0, priority=0, at=0, gpus=0.0):
    return admission.Queued(job_id, cpus, gpus, T0 + timedelta(seconds=at), project=project, priority=priority)


def run(heads: dict[str, list], loads: dict[str, ProjectLoad], cpus: float, gpus: float = 0.0) -> admission.Plan:
    its = {p: iter(jobs) for p, jobs in heads.items()}
    return admission.plan(admission.fair_order(its, loads), (cpus, gpus), None, loads)


def test_decay_halves_per_half_life():
    assert decay(100.0, T0, T0, 3600) == 100.0
    assert decay(100.0, T0, T0 + timedelta(hours=1), 3600) == pytest.approx(50.0)
    assert decay(100.0, T0, T0 + timedelta(hours=3), 3600) == pytest.approx(12.5)
    assert decay(100.0, T0, T0 - timedelta(hours=1), 3600) == 100.0  # a clock step back adds nothing


def test_order_within_guarantee_first_then_decayed_usage_then_priority_then_arrival():
    loads = {
        "heavy": ProjectLoad("heavy", cpu_seconds=decay(1000.0, T0, T0 + timedelta(hours=1), 3600)),  # 500
        "light": ProjectLoad("light", cpu_seconds=decay(900.0, T0, T0, 3600)),  # 900 > 500
        "owed": ProjectLoad("owed", Quota(guaranteed_cpus=1.0), cpu_seconds=10_000.0),
    }
    heads = {
        "heavy": [q("h-low", "heavy", priority=0, at=1), q("h-late", "heavy", priority=0, at=5)],
        "light": [q("l-high", "light", priority=9, at=0)],
        "owed": [q("o1", "owed", at=9), q("o2", "owed", at=10)],
    }
    # heads are given in each project's own (priority, arrival) order, as queue.head reads them
    plan = run(heads, loads, cpus=10)
    # owed's first job is within its guarantee (1 CPU) despite the most usage; its second is
    # not, and it has the most usage of all: last. heavy's decayed usage (500) is below light's (900).
    assert plan.start == ["o1", "h-low", "h-late", "l-high", "o2"]
    assert plan.borrowed == {"h-low", "h-late", "l-high", "o2"}


def test_priority_then_arrival_within_equal_usage():
    loads = {"a": ProjectLoad("a"), "b": ProjectLoad("b")}
    heads = {"a": [q("a-late", "a", priority=0, at=5)], "b": [q("b-first", "b", priority=0, at=1)]}
    assert run(heads, loads, cpus=5).start == ["b-first", "a-late"]
    heads = {"a": [q("a-high", "a", priority=3, at=5)], "b": [q("b-first", "b", priority=0, at=1)]}
    assert run(heads, {"a": ProjectLoad("a"), "b": ProjectLoad("b")}, cpus=5).start == ["a-high", "b-first"]


def test_a_job_over_its_running_limits_waits_for_quota_without_holding_up_others():
    loads = {
        "ml": ProjectLoad("ml", Quota(max_gpus=6), gpus=6.0, running=3),
        "cv": ProjectLoad("cv", Quota(max_running=2), running=2),
        "nlp": ProjectLoad("nlp", Quota(max_cpus=4), cpus=3.0, running=1),
        "ok": ProjectLoad("ok"),
    }
    heads = {
        "ml": [q("m1", "ml", gpus=1.0), q("m2", "ml", gpus=1.0)],
        "cv": [q("c1", "cv")],
        "nlp": [q("n1", "nlp", cpus=2.0)],
        "ok": [q("k1", "ok", at=50)],
    }
    plan = run(heads, loads, cpus=100, gpus=100)
    assert plan.start == ["k1"]
    assert plan.reasons == {
        "m1": "waiting for quota: project ml uses 6 of 6 GPUs",
        "c1": "waiting for quota: project cv uses 2 of 2 running jobs",
        "n1": "waiting for quota: project nlp uses 3 of 4 CPUs",
    }
    assert "m2" not in plan.seen  # its project is blocked: it waits behind m1


def test_a_job_within_its_guarantee_that_does_not_fit_asks_for_room():
    loads = {
        "owner": ProjectLoad("owner", Quota(guaranteed_cpus=2)),
        "guest": ProjectLoad("guest", cpus=4.0, running=2),
    }
    plan = run({"owner": [q("o", "owner", cpus=2.0)], "guest": [q("g", "guest")]}, loads, cpus=0.5)
    assert plan.start == [] and plan.wants is not None
    job, need = plan.wants
    assert job.id == "o" and need == (1.5, 0.0)
    assert plan.reasons["o"] == "waiting for resources: needs 2 CPUs / 0 GPUs, 0.5 / 0 free"
    # The guest's newest borrowed job goes first; one that frees nothing short (GPUs) is skipped.
    started = [T0 + timedelta(minutes=m) for m in range(4)]
    running = [
        Running("g-old", "guest", 2.0, 0.0, started[0], True),
        Running("g-new", "guest", 2.0, 0.0, started[2], True),
        Running("g-kept", "guest", 2.0, 0.0, started[3], False),  # not borrowed
        Running("o-own", "owner", 2.0, 0.0, started[3], True),  # the asking project's own
    ]
    assert victims(running, loads, need, "owner") == ["g-new"]
    assert victims(running, loads, (3.0, 0.0), "owner") == ["g-new", "g-old"]
    assert victims(running, loads, (5.0, 0.0), "owner") == []  # all of them would not make the room


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("quotas")  # one store for the module: each test its own projects
    svc = job_service(f"sqlite:///{tmp_path / 'q.db'}", tmp_path)
    yield svc
    svc.sessions.kw["bind"].dispose()


def test_max_queued_refuses_with_429_naming_the_quota_and_the_usage(service):
    with service.sessions.begin() as s:
        quotas.set_quota(s, "ml", QuotaSpec(max_queued=2))
    submit(service, project="ml"), submit(service, project="ml")
    submit(service, project="other")  # another project's queue is its own
    with pytest.raises(QuotaExceeded) as caught:
        service.jobs.submit(parse_job_spec({**_spec(), "project": "ml"}))
    err = caught.value
    assert err.status == 429 and err.code == "quota_exceeded"
    assert err.message.startswith("project ml uses 2 of 2 queued jobs (quota max_queued).")
    assert err.to_body()["error"]["details"] == [{"quota": "max_queued", "project": "ml", "used": 2, "limit": 2}]


def test_a_malformed_project_is_refused():
    with pytest.raises(ValueError) as caught:
        parse_job_spec({**_spec(), "project": "ML_team"})
    assert "project" in str(caught.value)


def test_half_life_zero_is_refused_at_startup(monkeypatch):
    monkeypatch.setenv("RAYDOCK_FAIR_SHARE_HALF_LIFE_S", "0")
    with pytest.raises(ValueError) as caught:
        Settings()
    assert "RAYDOCK_FAIR_SHARE_HALF_LIFE_S must be more than 0" in str(caught.value)


def test_accounting_sums_each_attempt_and_decays_the_project(service):
    job_id = submit(service, project="acct")  # 2 workers x 1 CPU: holds 2 CPUs
    t = utcnow()
    set_columns(
        service, job_id, status=JobStatus.RUNNING.value, attempt=1, attempt_started_at=t - timedelta(seconds=30)
    )
    with service.sessions.begin() as s:
        assert usage.accrue_running(s, ("RUNNING",), t - timedelta(seconds=10)) == 1  # 20 s so far
    with service.sessions.begin() as s:
        job = s.get(JobRow, job_id)
        assert job.cpu_seconds == pytest.approx(40.0)
        lifecycle.transition(s, job, JobStatus.SUCCEEDED, reason="done")  # the last 10 s
    with service.sessions.begin() as s:
        job = s.get(JobRow, job_id)
        ran = (aware(job.finished_at) - (t - timedelta(seconds=30))).total_seconds()  # 30 s and a little
        assert job.cpu_seconds == pytest.approx(2 * ran) and job.gpu_seconds == 0.0
        row = s.scalars(select(JobUsageRow).where(JobUsageRow.job_id == job_id)).one()
        assert (row.attempt, row.cpu_seconds) == (1, pytest.approx(2 * ran))
        end = aware(job.finished_at)
        usage.bill(s, end, 3600)
    with service.sessions.begin() as s:
        assert s.get(ProjectUsageRow, "acct").cpu_seconds == pytest.approx(2 * ran)
        usage.bill(s, end + timedelta(hours=1), 3600)  # nothing new: the figure stays as of `end`
        assert usage.decayed(s, "acct", end + timedelta(hours=1), 3600)[0] == pytest.approx(ran)
        report = usage.report(s, None, None, "acct")
        half = usage.report(s, end - timedelta(seconds=ran / 2), None, "acct")
    assert [(r.project, r.cpu_seconds, r.jobs) for r in report.rows] == [("acct", pytest.approx(2 * ran), 1)]
    assert half.rows[0].cpu_seconds == pytest.approx(ran)  # half of its run is in the range
    assert service.reads.get(job_id).usage.cpu_seconds == pytest.approx(2 * ran)


def test_the_queue_reads_each_projects_head(service):
    a = [submit(service, project="a", name=f"a{i}") for i in range(3)]
    b = submit(service, project="b")
    with service.sessions() as s:
        loads = quotas.loads(s, ("RUNNING",), QuotaSpec(), 3600)
        assert {"a", "b"} <= set(loads) and loads["a"].running == 0
        assert [j.id for j in queue.head(s, set(), project="a")] == a
        assert [j.id for j in queue.head(s, set(), project="b")] == [b]


def _spec() -> dict:
    from bench.harness.specs import digits_spec

    return digits_spec()
