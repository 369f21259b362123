"""Ray counts its usage every few seconds (its autoscaler's monitor; the dashboard's
/api/cluster_status answers with the last count and its time). A job of ours that ended
after that count still shows as used there: admission adds back what it held, so the job
behind it starts at its end instead of at Ray's next count (up to 5 s later: a search
posted right after another ended was admitted 1-4 s late). On the real stores (SQLite and
PostgreSQL), no Ray; the last test reads the count's time from the session's Ray head."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from sqlalchemy import select

from api.schemas import ClusterInfo, JobStatus
from bench.harness.jobstore import job_service, set_columns, submit
from service import lifecycle
from service.attempts import ACTIVE
from service.cluster.ray_backend import RayBackend
from service.db.models import JobRow
from service.scheduling import admission, queue


@pytest.fixture(params=["sqlite", "postgresql"])
def service(request, tmp_path):
    pg = request.getfixturevalue("postgres_server") if request.param == "postgresql" else None
    name = pg.create_database() if pg else None
    svc = job_service(pg.url(name) if pg else f"sqlite:///{tmp_path / 'store.db'}", tmp_path / "data")
    yield svc
    svc.sessions.kw["bind"].dispose()
    if pg:
        pg.drop_database(name)


def end(service, job_id: str, target: JobStatus) -> None:
    with service.sessions.begin() as s:
        job = s.get(JobRow, job_id)
        assert lifecycle.transition(s, job, target, reason="test")


def free_cpus(service, counted_at: float, cpus_used: float) -> float:
    """What the queue may use with Ray's count made at ``counted_at`` showing ``cpus_used``."""
    info = ClusterInfo(
        address="x", nodes=[], cpus_total=4, cpus_free=4 - cpus_used, gpus_total=0, gpus_free=0, usage_at=counted_at
    )
    with service.sessions() as s:
        held, _ = queue.held(s, ACTIVE)
        released = queue.released_since(s, ACTIVE, datetime.fromtimestamp(counted_at, timezone.utc))
    return admission.free(info, held, (0.0, 0.0), released)[0]


def test_a_job_that_ended_after_rays_count_leaves_its_cpus_free(service):
    ran, waiting = submit(service, name="ran"), submit(service, name="waiting", scaling={"num_workers": 3})
    with service.sessions() as s:
        holds = s.scalar(select(JobRow.holds_cpus).where(JobRow.id == ran))
        needs = s.scalar(select(JobRow.demand_cpus).where(JobRow.id == waiting))
    assert holds + needs > 4 >= needs  # the waiting job fits only once the first one's CPUs are back
    set_columns(service, ran, status=JobStatus.RUNNING.value)
    counted = time.time() - 2.0  # Ray's last count: while the first job ran
    assert free_cpus(service, counted, holds) == 4 - holds
    end(service, ran, JobStatus.SUCCEEDED)
    assert free_cpus(service, counted, holds) == 4  # before: 4 - holds, and the waiting job waited for Ray's next count
    assert free_cpus(service, time.time() + 1.0, 0.0) == 4  # Ray's next count: nothing added back twice


def test_what_was_never_held_or_ended_before_the_count_is_not_added_back(service):
    never_started, before, other = (submit(service, name=n) for n in ("never-started", "before", "other"))
    earlier = time.time() - 2.0  # a count made before the cancel below
    end(service, never_started, JobStatus.CANCELLED)  # cancelled from the queue, after that count: it held nothing
    with service.sessions() as s:
        assert queue.released_since(s, ACTIVE, datetime.fromtimestamp(earlier, timezone.utc)) == (0.0, 0.0)
    set_columns(service, before, status=JobStatus.RUNNING.value)
    end(service, before, JobStatus.FAILED)
    counted = time.time() + 1.0  # Ray's count after that end: it saw the CPUs come back
    set_columns(service, other, status=JobStatus.RUNNING.value)
    with service.sessions() as s:
        assert queue.released_since(s, ACTIVE, datetime.fromtimestamp(counted, timezone.utc)) == (0.0, 0.0)
    # Others' use of the cluster that Ray counted stays counted: 3 CPUs used by someone else.
    with service.sessions() as s:
        holds = s.scalar(select(JobRow.holds_cpus).where(JobRow.id == other))
    assert free_cpus(service, counted, 3.0) == min(4 - holds, 1.0)


def test_the_clusters_usage_comes_with_the_time_ray_counted_it(ray_head):
    before = time.time()
    info = RayBackend(ray_head.dashboard_url, auth_token=ray_head.auth_token()).cluster_info()
    assert info.usage_at is not None
    assert before - 60 < info.usage_at < time.time() + 1  # a count of this head's, not a guess
