"""What the event log and its webhooks cost, measured side by side in one run (SQLite in a
temp dir, a receiver on loopback, no Ray):

1. a status change with its event (``lifecycle.transition``) against the same change
   written without one (the compare-and-set UPDATE and the status-history row alone);
2. webhooks: N events to one subscription (posted one at a time, in order) and to four,
   time until all are delivered and the latency from commit to receipt.

    python -m bench.webhooks [--jobs 500] [--events 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import update

from api.schemas import JobStatus
from bench.harness.webhook_receiver import Receiver
from service import lifecycle
from service.background.periodic import Periodic
from service.background.runner import Runner
from service.db.engine import make_engine, make_sessionmaker
from service.db.models import JobRow, TransitionRow
from service.eventlog.deliverer import POLL_S, Deliverer
from service.eventlog.log import record
from service.settings import Settings


def _jobs(sessions, prefix: str, n: int) -> list[str]:
    ids = [f"{prefix}{i}" for i in range(n)]
    with sessions.begin() as s:
        s.add_all(JobRow(id=i, name="b", kind="train", status="QUEUED", labels={}, spec={}) for i in ids)
    return ids


def transitions(sessions, n: int) -> tuple[float, float]:
    logged, bare = _jobs(sessions, "l", n), _jobs(sessions, "b", n)
    t = time.perf_counter()
    for job_id in logged:
        with sessions.begin() as s:
            lifecycle.transition(s, s.get(JobRow, job_id), JobStatus.CANCELLED, reason="bench")
    with_event = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for job_id in bare:
        with sessions.begin() as s:
            s.get(JobRow, job_id)
            s.execute(update(JobRow).where(JobRow.id == job_id, JobRow.status == "QUEUED").values(status="CANCELLED"))
            s.add(TransitionRow(job_id=job_id, from_status="QUEUED", to_status="CANCELLED", reason="bench"))
    return with_event, (time.perf_counter() - t) / n


def deliveries(tmp: Path, n: int, subscriptions: int) -> tuple[float, float, float]:
    """Seconds until every post arrived, posts per second, median commit-to-receipt."""
    with Receiver() as rx:
        hooks = [
            {"name": f"h{i}", "url": f"{rx.url}/h{i}", "events": ["*"], "secret": "s" * 20}
            for i in range(subscriptions)
        ]
        settings = Settings(
            storage={"data_dir": tmp / f"d{subscriptions}"},
            webhooks={"webhooks_raw": json.dumps(hooks), "webhook_allow_private": True},
        )
        sessions = make_sessionmaker(make_engine(settings.storage.resolved_database_url))
        deliverer = Deliverer(settings, sessions)
        runner, unit = (
            Runner(),
            Periodic("webhooks", POLL_S, deliverer.deliver_once, own_thread=True, on_stop=deliverer.aclose),
        )
        runner.start(unit)
        sent: dict[int, float] = {}
        t0 = time.perf_counter()
        for i in range(n):
            with sessions.begin() as s:
                row = record(s, "code_uploaded", actor="bench", n=i)
                s.flush()
                sent[row.id] = time.perf_counter()
        while len(rx.posts) < n * subscriptions:
            time.sleep(0.01)
        total = time.perf_counter() - t0
        latency = statistics.median(p.at - sent[p.event["id"]] for p in rx.posts)
        asyncio.run(runner.stop(unit))
    return total, n * subscriptions / total, latency


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--events", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="raydock-bench-webhooks-") as tmp:
        sessions = make_sessionmaker(make_engine(f"sqlite:///{tmp}/t.db"))
        with_event, bare = transitions(sessions, args.jobs)
        print(
            f"status change + event: {with_event * 1e3:.2f} ms; without: {bare * 1e3:.2f} ms; x{with_event / bare:.2f}"
        )
        for subs in (1, 4):
            total, rate, latency = deliveries(Path(tmp), args.events, subs)
            print(
                f"{args.events} events to {subs} subscription(s): all delivered in {total:.2f} s "
                f"({rate:.0f} posts/s), median commit-to-receipt {latency * 1e3:.0f} ms"
            )


if __name__ == "__main__":
    main()
