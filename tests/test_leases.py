"""Background work runs on one replica at a time (service/db/leases.py, service/background/runner.py):
each unit's lease has one holder; a holder that stops renewing loses it after its TTL and a
new holder takes it under a higher fencing token; a write fenced with the old token is
refused, so a replica that lost the monitor while paused admits and starts nothing; a
graceful stop frees its leases at once. On real SQLite and PostgreSQL (two replicas on one
store: two holders in this process, no Ray)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time

import pytest
from sqlalchemy import select

from api.schemas import FailureCause, JobStatus
from bench.harness.jobstore import job_service, set_columns, submit
from service.background.periodic import Periodic
from service.background.runner import Runner
from service.db.engine import make_engine
from service.db.eventlog_models import EventLogRow
from service.db.leases import LeaseLost, Leases
from service.db.models import JobRow
from service.scheduling.admission import Failure

UNITS = ["monitor", "usage", "webhooks"]


def _taken(leases: Leases, names: list[str], tries: int = 2000) -> dict:
    """Claim until all of ``names`` are held (the other holder's TTL runs out meanwhile)."""
    for _ in range(tries):
        held = leases.claim(names)
        if set(held) == set(names):
            return held
        time.sleep(0.005)
    raise AssertionError(f"{leases.holder} never took {names}")


def test_one_holder_per_lease_and_a_higher_token_at_every_take_over(database_url):
    engine = make_engine(database_url)
    a = Leases(engine, ttl_s=60.0, holder="host-a/1/aa")
    b = Leases(engine, ttl_s=60.0, holder="host-b/2/bb")

    first = a.claim(UNITS)
    assert set(first) == set(UNITS)
    assert b.claim(UNITS) == {}  # held and unexpired: nothing for the other replica
    assert a.claim(UNITS) == first  # a renewal keeps the token

    a.release()  # a graceful stop: free at once, no TTL to wait
    taken = b.claim(UNITS)
    assert set(taken) == set(UNITS)
    assert all(taken[n].token == first[n].token + 1 for n in UNITS)
    assert a.claim(UNITS) == {}

    short = Leases(engine, ttl_s=0.05, holder="host-b/2/bb")  # b renews with a short TTL, then stops renewing
    short.claim(UNITS)
    again = _taken(a, UNITS)
    assert all(again[n].token == taken[n].token + 1 for n in UNITS)
    now, replicas, leases = a.listing()
    assert {r[0] for r in replicas} == {"host-a/1/aa", "host-b/2/bb"}  # b's row went with its release, and came back
    assert {(name, holder) for name, holder, *_ in leases} == {(n, "host-a/1/aa") for n in UNITS}
    assert all(expires > now for *_, expires in leases)


def test_a_replica_that_lost_the_monitor_admits_and_starts_nothing(database_url, tmp_path):
    """Replica A took the monitor's lease and began a pass; it paused past its TTL and B
    took the lease. A's admission (fixing the submission id) and its start (QUEUED ->
    STARTING) are refused in their transactions; B's go through."""
    a_side = job_service(database_url, tmp_path / "a")
    b_side = job_service(database_url, tmp_path / "b")
    job_id = submit(a_side)
    engine = a_side.sessions.kw["bind"]
    fence_a = Leases(engine, ttl_s=0.05, holder="host-a/1/aa").claim(["monitor"])["monitor"]
    fence_b = _taken(Leases(engine, ttl_s=60.0, holder="host-b/2/bb"), ["monitor"])["monitor"]
    assert fence_b.token == fence_a.token + 1

    with pytest.raises(LeaseLost):
        a_side.monitor.attempts.prepare(job_id, fence_a)
    with a_side.sessions() as s:
        job = s.get(JobRow, job_id)
        assert (job.status, job.submission_id, job.attempt) == (JobStatus.QUEUED.value, None, 0)
        assert s.scalars(select(EventLogRow.type).where(EventLogRow.job_id == job_id)).all().count("admitted") == 0

    prepared = b_side.monitor.attempts.prepare(job_id, fence_b)
    assert prepared is not None
    with pytest.raises(LeaseLost):  # A's start of the same attempt, as if its submit had gone out before the pause
        a_side.monitor.attempts.confirm(job_id, prepared.submission_id, prepared.attempt, fence=fence_a)
    with a_side.sessions() as s:
        job = s.get(JobRow, job_id)
        assert (job.status, job.submission_id, job.ray_job_id) == (JobStatus.QUEUED.value, prepared.submission_id, None)

    b_side.monitor.attempts.confirm(job_id, prepared.submission_id, prepared.attempt, fence=fence_b)
    with b_side.sessions() as s:
        job = s.get(JobRow, job_id)
        assert (job.status, job.ray_job_id, job.attempt) == (JobStatus.STARTING.value, prepared.submission_id, 1)


def test_a_replica_that_lost_the_monitor_preempts_and_fails_nothing(database_url, tmp_path):
    """The monitor's other decisions are fenced too: preempting a borrowed job and failing
    a waiting one (past its deadline, never fitting) are refused under a lost lease."""
    a_side = job_service(database_url, tmp_path / "a")
    running, waiting = submit(a_side), submit(a_side)
    set_columns(a_side, running, status=JobStatus.RUNNING.value, attempt=1, ray_job_id="raydock-x-1")
    engine = a_side.sessions.kw["bind"]
    fence_a = Leases(engine, ttl_s=0.05, holder="host-a/1/aa").claim(["monitor"])["monitor"]
    fence_b = _taken(Leases(engine, ttl_s=60.0, holder="host-b/2/bb"), ["monitor"])["monitor"]
    late = Failure(waiting, FailureCause.NO_RESOURCES, "can never fit the cluster", "too big")

    with pytest.raises(LeaseLost):
        a_side.monitor.preemptions.preempt([running], waiting, "default", fence_a)
    with pytest.raises(LeaseLost):
        a_side.monitor.queue.fail_queued([late], fence_a)
    with a_side.sessions() as s:
        assert (s.get(JobRow, running).status, s.get(JobRow, waiting).status) == ("RUNNING", "QUEUED")

    assert a_side.monitor.preemptions.preempt([running], waiting, "default", fence_b) == [running]
    a_side.monitor.queue.fail_queued([late], fence_b)
    with a_side.sessions() as s:
        assert (s.get(JobRow, running).status, s.get(JobRow, waiting).status) == ("PREEMPTED", "FAILED")


def test_each_unit_runs_on_one_runner_and_moves_at_a_graceful_stop(database_url):
    """Two runners (two replicas) over one store: each leased unit runs on exactly one of
    them, an unleased one on both; the holder's stop hands its units to the other."""
    engine = make_engine(database_url)
    runs: dict[tuple[str, str], int] = {}
    fences: dict[str, set[int]] = {}

    def runner_of(replica: str) -> Runner:
        runner = Runner(leases=Leases(engine, ttl_s=1.5, holder=f"host/{replica}/x"))

        def step_of(unit: str, fenced: bool):
            def step(*fence) -> None:
                runs[replica, unit] = runs.get((replica, unit), 0) + 1
                if fenced:
                    fences.setdefault(replica, set()).add(fence[0].token)

            return step

        for unit in UNITS:
            runner.add(Periodic(unit, 0.01, step_of(unit, unit == "monitor"), fenced=unit == "monitor"))
        runner.add(Periodic("warm-pool", 0.01, step_of("warm-pool", False), leased=False))
        return runner

    a, b = runner_of("a"), runner_of("b")

    def ran(replica: str, unit: str) -> int:
        return runs.get((replica, unit), 0)

    async def until(cond) -> None:
        for _ in range(2000):  # bounded by progress, not by a clock
            if cond():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"never came true; runs: {runs}")

    async def scenario() -> tuple[dict, dict]:
        a.start_all()
        await until(lambda: all(ran("a", u) >= 3 for u in UNITS))
        b.start_all()
        await until(lambda: ran("b", "warm-pool") >= 3)
        await asyncio.sleep(1.6)  # past a TTL: b has claimed several times meanwhile
        before = dict(runs)
        a_running = sorted(a.running())
        await a.stop_all()
        await until(lambda: all(ran("b", u) >= 3 for u in UNITS))
        b_running = sorted(b.running())
        await b.stop_all()
        return before, {"a": a_running, "b": b_running}

    before, running = asyncio.run(scenario())
    assert all(before.get(("b", u), 0) == 0 for u in UNITS)  # while a held them, b ran none of them
    assert before[("a", "warm-pool")] > 0 and before[("b", "warm-pool")] > 0  # unleased: on both
    assert running == {"a": sorted([*UNITS, "warm-pool"]), "b": sorted([*UNITS, "warm-pool"])}
    assert fences["a"] == {1} and fences["b"] == {2}  # b ran the monitor under the next token
    assert Leases(engine, ttl_s=60.0, holder="host/c/x").claim(UNITS).keys() == set(UNITS)  # b released at its stop


def test_on_sqlite_a_restarted_server_takes_its_dead_predecessors_leases_at_once(tmp_path, caplog):
    """SQLite is one process: leases left by a process of this host that is gone are taken
    without waiting out their TTL (a server restarted after a crash runs its units at once);
    a live process's are not, and the server is told that replicas need PostgreSQL."""
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    ended = subprocess.Popen(["true"])
    ended.wait()  # its pid names a process that is gone
    host = socket.gethostname()
    assert set(Leases(engine, ttl_s=3600.0, holder=f"{host}/{ended.pid}/old").claim(UNITS[1:])) == set(UNITS[1:])
    live = f"{host}/{os.getpid()}/other"  # this process: alive
    assert set(Leases(engine, ttl_s=3600.0, holder=live).claim(UNITS[:1])) == set(UNITS[:1])
    fresh = Leases(engine, ttl_s=3600.0, holder=f"{host}/{os.getpid()}/new")
    assert set(fresh.claim(UNITS)) == set(UNITS[1:])  # the dead holder's, not the live one's
    assert "replicas need PostgreSQL" in caplog.text
