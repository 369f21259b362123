"""The wall-clock bounds the tests leave to benchmarks, measured against their bounds.

    .venv/bin/python -m bench.abuse_teardown

Tests assert behaviour and print their figures; a busy machine makes a latency bound fail
while the behaviour is right, so the bounds live here. Most of those the tests print are
rows of another script already (bench/abuse_events.py: submits while a search pushes;
bench/abuse_http.py: /healthz under slowloris, the 408 of a half-sent head, the 401 before
a body, bulk cancel with a hung dashboard; bench/abuse_downloads.py: lists and a fresh
download while downloads stall). This one holds the rest:

- POST /v1/jobs while a job of a million rows (600k metrics, 400k trial reports) is
  deleted from SQLite: how many submits were answered before the delete ended, and the
  slowest of them (the delete goes in chunks, each a short write transaction).

Starts its own server (real HTTP, SQLite, no Ray: ``harness/attacks.py``). Every loop is
bounded. ``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import httpx

from bench.figures import row, run_attacks
from bench.harness import attacks
from bench.harness.jobstore import set_columns

MAX_SUBMIT_MS = 1000


def submits_while_a_big_job_is_deleted(root: Path) -> None:
    target = attacks.start_target(root / "delete")
    try:
        job_id = target.running_job()
        attacks.seed_rows(target, job_id, metrics=600_000, trial_reports_n=400_000)
        set_columns(target.service, job_id, status="SUCCEEDED")

        def delete() -> tuple[float, int]:
            t0 = time.perf_counter()
            r = httpx.delete(f"{target.url}/v1/jobs/{job_id}", timeout=600)
            return time.perf_counter() - t0, r.status_code

        latencies, (took, status), meanwhile = attacks.submit_latencies_while(target, delete)
        row("DELETE of a job with 1M rows (SQLite)", f"{took:.1f} s ({status})", "204", status == 204)
        row("POST /v1/jobs answered during that delete", f"{meanwhile} of {len(latencies)}", ">= 2", meanwhile >= 2)
        row(
            "POST /v1/jobs during that delete: median / max",
            f"{statistics.median(latencies):.0f} / {max(latencies):.0f} ms",
            f"max < {MAX_SUBMIT_MS} ms",
            max(latencies) < MAX_SUBMIT_MS,
        )
    finally:
        target.stop()


def main() -> int:
    return run_attacks("teardown", submits_while_a_big_job_is_deleted)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
