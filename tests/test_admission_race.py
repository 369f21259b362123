"""Admission on the session's Ray cluster never plans the CPUs of a job the monitor is
still starting: a start that fixes its submission id between a pass's read of what is
held and its read of the queue (a real write, committed at that moment) would otherwise
be in neither read, and its CPUs would go to the next job in line (peak commitment above
the cluster's, seen with replicas under load: bench/replicas_admission.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import event, func, select, update

from bench.harness.jobstore import submit
from service.attempts import ACTIVE
from service.cluster.ray_backend import RayBackend
from service.db.engine import make_engine, make_sessionmaker
from service.db.models import JobRow
from service.runtime import compose
from service.settings import Settings
from tests.support.session import CLUSTER_CPUS

pytestmark = pytest.mark.slow


def test_a_job_that_fixes_its_submission_id_mid_pass_keeps_its_cpus(ray_head, tmp_path):
    url = f"sqlite:///{tmp_path / 'raydock.db'}"
    settings = Settings(
        storage={"data_dir": tmp_path / "data", "database_url": url}, cluster={"ray_address": ray_head.dashboard_url}
    )
    backend = RayBackend(ray_head.dashboard_url, auth_token=ray_head.auth_token())
    service = compose(settings, make_sessionmaker(make_engine(url)), backend)
    starting = [submit(service, name=f"starting{i}") for i in range(2)]  # 2 CPUs each: the cluster's 4
    waiting = submit(service, name="waiting")
    engine = service.sessions.kw["bind"]

    def start_both_before_the_queue_read(conn, cursor, statement, parameters, context, executemany):
        # The monitor's own starts of the two dispatched jobs commit their submission ids
        # just as this pass reads the head of the queue (after it read what is held).
        head = "submission_id IS NULL" in statement and "ORDER BY" in statement and "LIMIT" in statement
        if head and not done:
            done.append(True)
            with engine.begin() as other:
                for job_id in starting:
                    other.execute(update(JobRow).where(JobRow.id == job_id).values(submission_id=f"raydock-{job_id}-1"))

    done: list[bool] = []
    event.listen(engine, "before_cursor_execute", start_both_before_the_queue_read)
    try:
        admitted = service.monitor.queue.admit(starting=frozenset(starting))
    finally:
        event.remove(engine, "before_cursor_execute", start_both_before_the_queue_read)
    assert done, "the pass read the queue's head"
    assert waiting not in admitted.start  # the cluster's CPUs are the two starting jobs'
    with service.sessions() as s:
        demand = s.scalar(select(func.sum(JobRow.holds_cpus)).where(JobRow.id.in_([*starting, *admitted.start])))
        assert s.scalar(select(func.count()).where(JobRow.status.in_(ACTIVE))) == 0
    assert demand <= CLUSTER_CPUS
