"""Attacks on the events channel, measured against their bounds.

    .venv/bin/python -m bench.abuse_events

Starts its own servers (real HTTP, SQLite, no Ray: the attacked jobs are put RUNNING in
the store with an events token the attacker holds, ``harness/attacks.py``) and prints one
row per figure, ``what | figure | bound | ok/FAIL``:

- the size of a list page (GET /v1/jobs?limit=50) after 18,000 worker_failure events
  with 2,000-character reasons were pushed for one job (M5);
- POST /v1/jobs median and max while a search pushes reports on 8 connections (M6);
- GET /v1/jobs/{id}/best at 100,000 trial reports, and the server's peak memory over it (M9).

Every loop is bounded. ``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from bench.figures import row, run_attacks
from bench.harness import attacks


def worker_failure_flood(root: Path) -> None:
    target = attacks.start_target(root / "m5")
    try:
        job_id = target.running_job()
        attacks.flood_worker_failures(target, job_id, n=18_000)
        size = attacks.list_page_bytes(target)
        row("list page after 18k worker_failure events", f"{size / 1024:.1f} KiB", "< 256 KiB", size < 256 * 1024)
    finally:
        target.stop()


def submits_under_a_pushing_search(root: Path) -> None:
    target = attacks.start_target(root / "m6")
    try:
        job_id = target.running_search()
        f = attacks.submits_while_a_search_pushes(target, job_id, connections=8, submits=40)
        row("POST /v1/jobs p50, search pushing on 8 connections", f"{f.p50:.0f} ms", "< 200 ms", f.p50 < 200)
        row("POST /v1/jobs max, search pushing on 8 connections", f"{f.max:.0f} ms", "< 1000 ms", f.max < 1000)
        row("event posts stored / turned away (429)", f"{f.pushes} / {f.busy}", "no other status", not f.other)
    finally:
        target.stop()


def best_at_100k_reports(root: Path) -> None:
    target = attacks.start_target(root / "m9")
    try:
        job_id = target.running_search()
        attacks.seed_trial_reports(target, job_id, n=100_000)
        expected = attacks.best_by_reading_every_report(target, job_id)
        httpx.get(f"{target.url}/v1/jobs/{job_id}")
        attacks.reset_peak_rss(target)
        before = attacks.server_peak_rss_kib(target)
        t0 = time.perf_counter()
        best = httpx.get(f"{target.url}/v1/jobs/{job_id}/best", timeout=120).json()
        took = (time.perf_counter() - t0) * 1000
        grew = (attacks.server_peak_rss_kib(target) - before) / 1024
        same = (best.get("trial_id"), best.get("value"), best.get("metrics")) == expected
        row("GET /best at 100k trial reports", f"{took:.0f} ms", "< 300 ms", took < 300)
        row("GET /best server peak memory", f"+{grew:.1f} MiB", "< 20 MiB", grew < 20)
        row("GET /best answers the best report", "same" if same else f"{best} != {expected}", "same", same)
    finally:
        target.stop()


def main() -> int:
    return run_attacks("events", worker_failure_flood, submits_under_a_pushing_search, best_at_100k_reports)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
