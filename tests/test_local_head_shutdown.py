"""A server that started its own Ray head stops it on shutdown only when no job is left
unended, however long the history: a job running behind more than 10,000 newer finished
jobs keeps the head up."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from sqlalchemy import insert

from bench.harness.jobstore import job_service, set_columns, submit
from service.cluster.local_cluster import start_head
from service.db.models import JobRow, utcnow
from service.http.app import _maybe_stop_head

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # starts Ray heads of its own


def test_the_local_head_stays_while_any_job_is_unended_and_stops_after(tmp_path):
    service = job_service(f"sqlite:///{tmp_path / 'raydock.db'}", tmp_path)
    running = submit(service, name="old-but-running")
    now = utcnow()
    set_columns(service, running, status="RUNNING", created_at=now - timedelta(days=30))
    with service.sessions.begin() as s:  # a long history, all newer than the running job
        s.execute(
            insert(JobRow),
            [
                {
                    "id": f"h{i:011d}",
                    "name": "done",
                    "kind": "train",
                    "status": "SUCCEEDED",
                    "spec": {},
                    "labels": {},
                    "created_at": now - timedelta(seconds=i),
                    "finished_at": now - timedelta(seconds=i),
                }
                for i in range(10_001)
            ],
        )
    head = start_head(tmp_path / "ray", num_cpus=1)
    try:
        runtime = dataclasses.replace(service, head=head)
        _maybe_stop_head(runtime)
        assert head.alive()  # the running job would lose its cluster

        set_columns(service, running, status="SUCCEEDED", finished_at=now)
        _maybe_stop_head(runtime)
        assert not head.alive()
    finally:
        if head.alive():
            head.stop()
        service.sessions.kw["bind"].dispose()
