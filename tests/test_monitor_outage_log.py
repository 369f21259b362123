"""An unreachable cluster is logged once per outage, not once per tick: the monitor meets
it on every tick (reconcile, admission, submits) and the log must stay readable."""

from __future__ import annotations

import logging

from bench.harness.jobstore import job_service, submit


def test_a_cluster_that_does_not_answer_is_logged_once_however_many_ticks_meet_it(tmp_path, caplog):
    service = job_service(f"sqlite:///{tmp_path / 'raydock.db'}", tmp_path)  # its Ray address: nothing listens there
    submit(service)  # a queued job: admission asks the cluster for room every tick
    monitor = service.monitor
    with caplog.at_level(logging.DEBUG, logger="raydock.monitor"):
        for _ in range(4):
            monitor.tick()
    warnings = [r for r in caplog.records if r.name == "raydock.monitor" and r.levelno >= logging.WARNING]
    assert [r.getMessage().split(":")[0] for r in warnings] == ["cannot reconcile with Ray"]
    assert "said once until the cluster answers again" in warnings[0].getMessage()
    assert (
        sum(r.name == "raydock.monitor" and r.levelno == logging.DEBUG for r in caplog.records) >= 3
    )  # still there, at debug level
    service.sessions.kw["bind"].dispose()
