"""What one ``GET /metrics`` costs the store as history grows: the scrape-time gauges
(``service/telemetry/collector.py``) over a SQLite store of N jobs (most ended, a few
hundred queued, some running with throughput reports), with the ``ix_jobs_status_kind``
index and, side by side, without it.

    python -m bench.metrics_scrape --jobs 100000 --running 50
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import insert, text

from service.db.engine import make_engine, make_sessionmaker
from service.db.models import JobRow, utcnow
from service.telemetry.collector import StoreCollector


def fill(sessions, jobs: int, running: int) -> None:
    rng, now = random.Random(0), utcnow()
    ended = ["SUCCEEDED"] * 7 + ["FAILED"] * 2 + ["CANCELLED"]
    rows = []
    for i in range(jobs):
        status = "RUNNING" if i < running else "QUEUED" if i < running + jobs // 200 else rng.choice(ended)
        metrics = {"step": i, "samples_per_s": 1000.0, "mfu": 0.3} if status == "RUNNING" else {"loss": 0.1}
        at = now - timedelta(seconds=i)
        rows.append(
            dict(
                id=f"j{i:011x}",
                name="bench",
                kind=rng.choice(["train", "tune"]),
                status=status,
                spec={},
                labels={},
                created_at=at,
                queued_at=at,
                attempt=1,
                latest_metrics=metrics,
            )
        )
    with sessions.begin() as s:
        for k in range(0, len(rows), 5000):
            s.execute(insert(JobRow), rows[k : k + 5000])


def scrape_ms(sessions, repeat: int) -> tuple[float, int]:
    registry = CollectorRegistry()
    registry.register(StoreCollector(sessions))
    times, size = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        size = len(generate_latest(registry))
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--running", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raydock-bench-metrics-") as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'store.db'}")
        sessions = make_sessionmaker(engine)
        fill(sessions, args.jobs, args.running)
        with_index, size = scrape_ms(sessions, args.repeat)
        with engine.begin() as conn:
            conn.execute(text("DROP INDEX ix_jobs_status_kind"))
        without_index, _ = scrape_ms(sessions, args.repeat)
    print(f"jobs {args.jobs}, running {args.running}: one scrape, median of {args.repeat}")
    print(f"  with ix_jobs_status_kind     {with_index:8.1f} ms  ({size} bytes)")
    print(f"  without it                   {without_index:8.1f} ms  (x{without_index / with_index:.1f})")


if __name__ == "__main__":
    main()
