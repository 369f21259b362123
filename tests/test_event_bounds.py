"""A job's events attacking the server that takes them in, over real HTTP on real SQLite
and PostgreSQL (``bench/harness/attacks.py``): per-job bounds on what events store, one post in
flight per job, short write transactions, chunked deletes of big jobs, and the best
trial of a search read from one index. Figures are printed (``-s``)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from sqlalchemy import func, select

from bench.harness import attacks
from bench.harness.jobstore import set_columns
from service.db.event_models import CheckpointRow, ExploitRow, MetricRow, TrialMetricRow, TrialRow, WorkerGroupRow
from service.db.models import JobRow
from trainers.events import _Pusher


@pytest.fixture(scope="module")
def target(tmp_path_factory, module_database_url):
    """One server per database for the tests that each keep to jobs of their own."""
    t = attacks.start_target(tmp_path_factory.mktemp("events"), module_database_url)
    yield t
    t.stop()


@pytest.fixture()
def own_target(tmp_path, database_url):
    """A store of the test's own, for a test that fills it (the reads of those after it stay small)."""
    t = attacks.start_target(tmp_path, database_url)
    yield t
    t.stop()


def rows(target, table, job_id: str) -> int:
    with target.service.sessions() as s:
        return int(s.scalar(select(func.count()).select_from(table).where(table.job_id == job_id)))


# ------------------------------------------------------------------ M5: bounds per job


@pytest.mark.slow  # seconds of pushing 36 MB of events
def test_a_flood_of_worker_failures_keeps_the_job_list_small(target):
    job_id = target.running_job()
    t0 = time.perf_counter()
    attacks.flood_worker_failures(target, job_id, n=18_000)
    took = time.perf_counter() - t0
    size = attacks.list_page_bytes(target)
    job = httpx.get(f"{target.url}/v1/jobs/{job_id}").json()
    print(
        f"\n18000 worker_failure events: pushed in {took:.1f} s; GET /v1/jobs?limit=50 is {size} bytes (bound 256 KiB)"
    )
    assert size < 256 * 1024
    assert job["restarts_total"] == 18_000
    assert [r["at"] for r in job["restarts"]] == [1.0 + i for i in range(17_990, 18_000)]  # the newest 10
    assert all(len(r["reason"]) <= 1000 for r in job["restarts"])


BOUNDS = {
    "RAYDOCK_MAX_METRICS_PER_JOB": "30",
    "RAYDOCK_MAX_WORKER_GROUPS_PER_JOB": "2",
    "RAYDOCK_MAX_CHECKPOINTS_PER_JOB": "3",
    "RAYDOCK_MAX_TRIALS_PER_JOB": "4",
    "RAYDOCK_MAX_TRIAL_REPORTS_PER_JOB": "25",
    "RAYDOCK_MAX_EXPLOITS_PER_JOB": "2",
}


@pytest.mark.slow  # a server of its own per database: seconds each
def test_events_past_a_per_job_bound_are_dropped_counted_and_say_which_setting(tmp_path, database_url):
    target = attacks.start_target(tmp_path, database_url, **BOUNDS)
    try:
        train = target.running_job()
        prefix = target.service.reads.prefix(train)
        body = [{"type": "metric", "seq": i, "ts": 1.0 + i, "metrics": {"loss": 1.0, "step": i}} for i in range(50)]
        body += [{"type": "worker_group", "seq": i, "world_size": 2, "nodes": []} for i in range(5)]
        body += [{"type": "checkpoint", "seq": i, "path": f"{prefix}/checkpoint_{i:06d}"} for i in range(7)]
        assert target.push(train, body).status_code == 204
        job = httpx.get(f"{target.url}/v1/jobs/{train}").json()
        assert (
            rows(target, MetricRow, train),
            rows(target, WorkerGroupRow, train),
            rows(target, CheckpointRow, train),
        ) == (30, 2, 3)
        # One metric past the bound is dropped; the push then stops at the gap it leaves (the log brings the rest).
        assert job["dropped_events"] == 1 + 3 + 4
        assert "RAYDOCK_MAX_CHECKPOINTS_PER_JOB" in job["last_dropped_reason"]
        assert job["latest_metrics"]["step"] == 29  # what was stored, nothing past the bound

        search = target.running_search()
        reports = attacks.trial_reports(0, 40, trials=6)  # 6 trials, 40 reports
        exploits = [{"type": "exploit", "seq": i, "trial_id": "t0", "donor_trial_id": "t1"} for i in range(4)]
        assert target.push(search, reports + exploits).status_code == 204
        assert (
            target.push(search, [{"type": "trial", "seq": 0, "trial_id": "t0", "status": "TERMINATED"}]).status_code
            == 204
        )
        job = httpx.get(f"{target.url}/v1/jobs/{search}").json()
        assert (
            rows(target, TrialRow, search),
            rows(target, TrialMetricRow, search),
            rows(target, ExploitRow, search),
        ) == (4, 25, 2)
        assert job["dropped_events"] == 40 - 25 + 2
        assert "RAYDOCK_MAX_EXPLOITS_PER_JOB" in job["last_dropped_reason"]
        trials = httpx.get(f"{target.url}/v1/jobs/{search}/trials").json()
        assert [t["status"] for t in trials if t["trial_id"] == "t0"] == [
            "TERMINATED"
        ]  # a known trial still takes its status
    finally:
        target.stop()


@pytest.mark.long  # about 2 minutes on 2 cores (both databases): RAYDOCK_LONG_TESTS=1
def test_deleting_a_job_with_a_million_rows_never_holds_the_write_lock_long(own_target):
    target = own_target
    job_id = target.running_job()
    attacks.seed_rows(target, job_id, metrics=600_000, trial_reports_n=400_000)
    set_columns(target.service, job_id, status="SUCCEEDED")

    def delete() -> float:
        t0 = time.perf_counter()
        r = httpx.delete(f"{target.url}/v1/jobs/{job_id}", timeout=600)
        assert r.status_code == 204, r.text
        return time.perf_counter() - t0

    latencies, took, meanwhile = attacks.submit_latencies_while(target, delete)
    print(
        f"\ndelete of a job with 1M rows: {took:.1f} s; POST /v1/jobs meanwhile: {meanwhile} of {len(latencies)} "
        f"submits, median {sorted(latencies)[len(latencies) // 2]:.0f} ms, max {max(latencies):.0f} ms "
        "(bound 1000 ms on SQLite in bench/abuse_teardown.py)"
    )
    assert httpx.get(f"{target.url}/v1/jobs/{job_id}").status_code == 404
    assert rows(target, MetricRow, job_id) == rows(target, TrialMetricRow, job_id) == 0
    # Submits were answered between the delete's chunks: one delete holding SQLite's write
    # lock throughout would answer none of them before it ended.
    assert meanwhile >= 2


def test_a_resume_is_refused_while_the_job_is_being_deleted(target):
    job_id = target.running_job()
    set_columns(target.service, job_id, status="FAILED", deleting=True)  # as a delete leaves it mid-way
    r = httpx.post(f"{target.url}/v1/jobs/{job_id}/resume")
    assert r.status_code == 409 and r.json()["error"]["code"] == "job_being_deleted"
    assert httpx.delete(f"{target.url}/v1/jobs/{job_id}").status_code == 204  # a later delete finishes it


# ------------------------------------------------------------------ M6: the write lock


def test_a_second_post_of_a_job_in_flight_gets_429_with_a_code_and_retry_after(target):
    job_id = target.running_search()
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def post(k: int) -> None:
        r = target.push(job_id, attacks.trial_reports(k * 200, 200))
        with lock:
            answers.append(r)

    threads = [threading.Thread(target=post, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    busy = [r for r in answers if r.status_code == 429]
    assert busy and all(r.status_code in (204, 429) for r in answers)
    assert busy[0].json()["error"]["code"] == "events_push_in_flight" and busy[0].headers["Retry-After"] == "1"
    stored = sum(1 for r in answers if r.status_code == 204)
    assert rows(target, TrialMetricRow, job_id) == 200 * stored


def test_a_post_with_too_many_search_events_is_413_with_a_code(target):
    job_id = target.running_search()
    r = target.push(job_id, attacks.trial_reports(0, 201))
    assert r.status_code == 413 and r.json()["error"]["code"] == "event_batch_too_large"
    assert rows(target, TrialMetricRow, job_id) == 0
    assert target.push(job_id, attacks.trial_reports(0, 200)).status_code == 204


@pytest.mark.slow
def test_submits_are_taken_while_a_search_pushes_on_many_connections(tmp_path):
    """Every submit is answered 202 and stored while posts of a search's reports are
    stored on 8 connections; how fast they are answered is bench/abuse_events.py's."""
    target = attacks.start_target(tmp_path)  # SQLite: one write lock for the whole store
    try:
        job_id = target.running_search()
        figures = attacks.submits_while_a_search_pushes(target, job_id, connections=8, submits=40)
        print(
            f"\nPOST /v1/jobs while a search pushes on 8 connections: median {figures.p50:.0f} ms, max {figures.max:.0f} ms "
            f"(bounds 200 / 1000 ms in bench/abuse_events.py); posts stored {figures.pushes} "
            f"({figures.pushes_meanwhile} during the submits), turned away {figures.busy}"
        )
        assert not figures.other and figures.pushes_meanwhile > 0
        with target.service.sessions() as s:
            stored = s.scalar(select(func.count()).select_from(JobRow).where(JobRow.name == "submitted-meanwhile"))
        assert stored == len(figures.submit_ms) == 40
    finally:
        target.stop()


@pytest.mark.slow  # four pushers' retries after Retry-After: seconds
def test_pushers_of_one_job_retry_429_and_lose_no_event(target):
    """The driver, the controller and a search's trials each push for the same job; the
    server takes one post at a time, so the others are sent again after Retry-After."""
    job_id = target.running_search()
    url = f"{target.url}/v1/internal/jobs/{job_id}/events"
    pushers = [_Pusher(url, attacks.TOKEN, attacks.SID) for _ in range(4)]
    for k, pusher in enumerate(pushers):
        for e in attacks.trial_reports(k * 600, 600):
            pusher.q.put(json.dumps(e).encode())
    for pusher in pushers:
        pusher.flush(timeout=120)
    assert rows(target, TrialMetricRow, job_id) == 2400


# ------------------------------------------------------------------ M9: the best trial


@pytest.mark.long  # a minute of filling the store; bench/abuse_events.py times the same read
def test_the_best_so_far_of_100k_reports_is_one_indexed_read(own_target):
    target = own_target
    job_id = target.running_search()
    t0 = time.perf_counter()
    attacks.seed_trial_reports(target, job_id, n=100_000)
    seeded = time.perf_counter() - t0
    trial_id, value, metrics = attacks.best_by_reading_every_report(target, job_id)
    httpx.get(f"{target.url}/v1/jobs/{job_id}")  # a first request: the server's connections are open
    attacks.reset_peak_rss(target)
    before = attacks.server_peak_rss_kib(target)
    times = []
    for _ in range(3):  # the fastest of three: this machine's load says nothing about the query
        t0 = time.perf_counter()
        r = httpx.get(f"{target.url}/v1/jobs/{job_id}/best", timeout=120)
        times.append(time.perf_counter() - t0)
    took = min(times)
    grew = (attacks.server_peak_rss_kib(target) - before) / 1024
    print(
        f"\nGET /best at 100k reports (seeded in {seeded:.0f} s): {took * 1000:.0f} ms (bound in bench/abuse_events.py: 300 ms), server peak memory +{grew:.1f} MiB (bound 20)"
    )
    assert r.status_code == 200, r.text
    best = r.json()
    assert (best["trial_id"], best["value"], best["metrics"], best["final"]) == (trial_id, value, metrics, False)
    # Reading every report grew the server by +183 MiB; one indexed read, by nothing much.
    # The time is printed, and held to its bound by bench/abuse_events.py, not here.
    assert grew < 20
