"""A submit accepted by one replica wakes the monitor of another (service/db/wakes.py): on a
real PostgreSQL, replica B's submit reaches replica A's listener through NOTIFY; on SQLite
(one process) there is no listener, and a submit wakes only its own process, as before."""

from __future__ import annotations

import threading

from bench.harness.jobstore import job_service, submit
from service.db.engine import make_engine
from service.db.wakes import Wakes


def test_a_submit_on_one_replica_wakes_the_listener_of_another(postgres_server, tmp_path):
    name = postgres_server.create_database()
    try:
        url = postgres_server.url(name)
        a = Wakes(make_engine(url))
        woken = threading.Event()
        a.listen(woken.set)  # the first step connects and listens; nothing was sent yet
        assert not woken.is_set()
        b_side = job_service(url, tmp_path / "b")  # replica B's parts, wired as `raydock serve` wires them
        assert "wakes" in [u.name for u in b_side.runner.units()]
        submit(b_side)
        a.listen(woken.set)  # the notification was queued on A's connection meanwhile
        assert woken.is_set()
        woken.clear()
        a.listen(woken.set)  # one submit, one wake
        assert not woken.is_set()
        a.stop()
        assert a._conn is None  # closed at the stop, none left open
        b_side.sessions.kw["bind"].dispose()
    finally:
        postgres_server.drop_database(name)


def test_on_sqlite_a_submit_wakes_only_its_own_process(tmp_path):
    side = job_service(f"sqlite:///{tmp_path / 'store.db'}", tmp_path)
    assert not Wakes(side.sessions.kw["bind"]).enabled
    assert "wakes" not in [u.name for u in side.runner.units()]
    tick = next(u for u in side.runner.units() if u.name == "monitor")
    assert side.jobs.on_submit == tick.wake
