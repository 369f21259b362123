"""An elastic range (``scaling.num_workers: {min, max}``) holds no more than its project's
quota and the cluster allow: admission grants it its max clamped to both, the attempt's
driver hands Ray Train that max, and the quota, the guarantee (``borrowed``), preemption
and usage count it. On a real SQLite store with the admission logic (no Ray), and on the
session cluster over real HTTP."""

from __future__ import annotations

import json
import uuid

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import text

from api.schemas import QuotaSpec
from bench.harness.jobstore import job_service, set_columns
from bench.harness.sched_attacks import ACTIVE, WIDE, admit, cluster, submit
from bench.harness.specs import digits_spec
from bench.harness.waiting import wait_for
from service.db.engine import make_engine
from service.db.models import JobRow, utcnow
from service.files import storage
from service.scheduling import fair_share, queue
from service.tenancy import quotas
from tests.support.session import CLUSTER_CPUS


@pytest.fixture()
def service(tmp_path):
    svc = job_service(f"sqlite:///{tmp_path / 'grant.db'}", tmp_path)
    yield svc
    svc.sessions.kw["bind"].dispose()


def test_an_elastic_range_is_counted_at_its_max_within_its_quota(service):
    with service.sessions.begin() as s:
        quotas.set_quota(s, "wide", QuotaSpec(guaranteed_cpus=1, max_cpus=2))
    job = submit(service, "wide", "wide", WIDE)
    plan, loads = admit(service, cluster(64), ceiling=False)  # the quota alone clamps it
    assert plan.start == [job]
    # It may grow to what its quota allows (2 CPUs), not to 4096, nor stop at its min (1):
    # beyond its 1 guaranteed CPU, so it is borrowed.
    assert loads["wide"].cpus == 2.0
    assert job in plan.borrowed


def test_the_grant_is_what_ray_train_gets_and_what_the_store_counts(service):
    with service.sessions.begin() as s:
        quotas.set_quota(s, "wide", QuotaSpec(guaranteed_cpus=1, max_cpus=2))
        quotas.set_quota(s, "owner", QuotaSpec(guaranteed_cpus=4))
    wide = submit(service, "wide", "wide", WIDE)
    unbound = submit(service, "free", "unbound", WIDE)  # no quota: the cluster clamps it
    plan, _ = admit(service, cluster(4))
    assert plan.start == [wide, unbound]
    assert plan.granted[wide][:3] == (2, 2.0, 0.0) and plan.granted[unbound][:3] == (4, 4.0, 0.0)
    with service.sessions.begin() as s:
        queue.record_starts(s, plan)

    # The attempt's driver is handed the granted max; the stored spec keeps the submitted range.
    prepared = service.monitor.attempts.prepare(wide)
    with storage.open_random_access(prepared.launch_uri) as f:
        launched = json.loads(f.read())["spec"]
    assert launched["scaling"]["num_workers"] == {"min": 1, "max": 2}
    assert service.reads.get(wide).spec["scaling"]["num_workers"] == {"min": 1, "max": 4096}
    assert service.reads.get(wide).granted_workers == 2 and service.reads.get(wide).borrowed

    # Running, it holds 2 CPUs in its project's quota and usage.
    set_columns(service, [wide], status="RUNNING", attempt=1, attempt_started_at=utcnow())
    set_columns(service, [unbound], status="CANCELLED", submission_id=None)
    with service.sessions() as s:
        assert quotas.public(s, "wide", ACTIVE, QuotaSpec(), 3600).cpus_in_use == 2.0
        assert s.get(JobRow, wide).holds_cpus == 2.0

    # Another project's job within its guarantee needs 3 of the 4 CPUs: the borrowed
    # elastic job is the one to preempt for it.
    owned = submit(service, "owner", "owned", {"num_workers": 1, "cpus_per_worker": 3})
    plan, loads = admit(service, cluster(4))
    assert plan.start == [] and plan.wants is not None
    waiting, need = plan.wants
    assert waiting.id == owned and need == (1.0, 0.0)
    with service.sessions() as s:
        running = quotas.running(s, ("RUNNING",))
    assert fair_share.victims(running, loads, need, "owner") == [wide]


def test_a_min_beyond_the_quota_waits_for_it_whatever_the_max(service):
    with service.sessions.begin() as s:
        quotas.set_quota(s, "small", QuotaSpec(max_cpus=2))
    job = submit(service, "small", "too-wide", {"num_workers": {"min": 3, "max": 8}})
    plan, _ = admit(service, cluster(16), ceiling=False)
    assert plan.start == [] and job not in plan.granted
    assert plan.reasons[job] == (
        "waiting for quota: the job needs 3 CPUs to start, more than project small's max_cpus (2): "
        "ask for less (scaling.num_workers, an elastic job's min; a search's max_concurrent_trials) or raise the quota"
    )


@pytest.mark.long  # about 3 minutes inside the suite (a preemption and its grace): RAYDOCK_LONG_TESTS=1
def test_an_elastic_job_on_the_cluster_runs_at_most_its_quota_and_yields_to_a_guarantee(client):
    """The session cluster has 4 CPUs. A project allowed 2 CPUs (1 guaranteed) submits a
    range of 1..4096 workers; another project guaranteed all 4 then submits a 3-CPU job."""
    tag = uuid.uuid4().hex[:6]
    wide, owner = f"wide-{tag}", f"owner-{tag}"
    for project in (wide, owner):
        client.create_project(project)
    client.set_quota(wide, QuotaSpec(guaranteed_cpus=1, max_cpus=2))
    client.set_quota(owner, QuotaSpec(guaranteed_cpus=CLUSTER_CPUS))
    # Both jobs are cancelled at the test's teardown (tests/support/cluster_teardown.py), whatever fails.
    long = dict(epochs=100_000, batch_size=16, checkpoint={"every_n_epochs": 1000})
    elastic = client.submit(digits_spec(name="wide", project=wide, scaling=WIDE, **long))
    groups = wait_for(elastic.worker_groups, 300, "its workers to start")
    assert client.quota(wide).cpus_in_use == 2  # what it may grow to, within max_cpus
    assert elastic.refresh().info.granted_workers == 2 and elastic.info.borrowed
    assert max(g.world_size for g in groups) <= 2  # Ray Train was handed max 2, not 4096

    owned = digits_spec(name="owned", project=owner, epochs=1, scaling={"num_workers": 1, "cpus_per_worker": 3})
    guaranteed = client.submit(owned)
    wait_for(lambda: guaranteed.refresh().status.value != "QUEUED", 300, "the guaranteed job to be admitted")
    moves = [(e.data["from"], e.data["to"]) for e in elastic.events(type="status_changed")]
    assert ("RUNNING", "PREEMPTED") in moves


def test_the_migration_gives_waiting_and_running_elastic_jobs_their_range(database_url):
    engine = make_engine(database_url)
    cfg = Config()
    cfg.set_main_option("script_location", "service:migrations")
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0013_start_phases")
    spec = json.dumps(digits_spec(scaling=WIDE))
    with engine.begin() as conn:
        for job_id, status in (("waits", "QUEUED"), ("runs", "RUNNING"), ("ended", "SUCCEEDED")):
            conn.execute(
                text(
                    "INSERT INTO jobs (id, name, kind, status, labels, spec, created_at, attempt, log_offset, priority,"
                    " restarts) VALUES (:id, 'n', 'train', :status, '{}', :spec, '2026-01-01', 1, 0, 0, '[]')"
                ),
                {"id": job_id, "status": status, "spec": spec},
            )
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, min_workers, max_workers, granted_workers FROM jobs ORDER BY id"))
        assert [tuple(r) for r in rows] == [
            ("ended", None, None, None),
            ("runs", 1, 4096, None),
            ("waits", 1, 4096, None),
        ]
    engine.dispose()
