"""How late a schedule fires on a quiet server: a real ``raydock serve`` (SQLite, or the
database named), N schedules firing every minute (``* * * * *``, concurrency allow), run
over M minutes; each firing's lateness is its job's ``created_at`` less the tick it fired
for (its ``raydock/tick`` label). Also counts jobs per schedule and tick, which must be one.

No Ray by default (a port where no dashboard answers: the jobs stay QUEUED, which is all a
firing is); ``--ray-address`` points the server at a running cluster instead.

    python -m bench.schedules [--schedules 5] [--minutes 3] [--database-url URL] [--ray-address URL]

The firings of one tick are handled one after another, so lateness grows with how many
schedules share a tick: on 2 busy cores, 5 firing together had p99 0.2 s, 20 had 1.3-2.6 s
(about 65-130 ms a firing).
"""

from __future__ import annotations

import argparse
import collections
import math
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from api.client import Client
from api.schemas.schedules import SCHEDULE_LABEL, TICK_LABEL
from bench.harness.jobstore import dead_ray
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec

TARGET_P99_S = 2.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def measure(url: str, schedules: int, minutes: int) -> tuple[list[float], int, int]:
    """Lateness of every firing (seconds), the firings expected, and the most jobs any
    schedule made for one tick."""
    with Client(url) as sdk:
        spec = {"cron": "* * * * *", "concurrency": "allow", "job": digits_spec(name="bench")}
        made = [sdk.create_schedule({"name": f"bench-{i}", **spec}) for i in range(schedules)]
        last = max(s.next_runs[0] for s in made).timestamp() + 60 * (minutes - 1)  # the last tick measured
        expected = sum(int((last - s.next_runs[0].timestamp()) // 60) + 1 for s in made)
        print(f"{schedules} schedules, {expected} firings to {datetime.fromtimestamp(last):%H:%M} ...", flush=True)
        while time.time() < last + 10:  # time for the last tick to fire
            time.sleep(1)
        late, per_tick, job_ids = [], collections.Counter(), []
        for schedule in made:
            sdk.pause_schedule(schedule.id)
            for job in sdk.iter_jobs(labels={SCHEDULE_LABEL: schedule.id}):
                tick = datetime.strptime(job.labels[TICK_LABEL], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
                if tick.timestamp() > last:
                    continue  # a tick after the window, fired before the pause
                late.append((job.created_at - tick).total_seconds())
                per_tick[(schedule.id, tick)] += 1
                job_ids.append(job.id)
        sdk.cancel_many(job_ids)
    return late, expected, max(per_tick.values(), default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=5, help="schedules, all firing every minute")
    parser.add_argument("--minutes", type=int, default=3)
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temp dir")
    parser.add_argument("--ray-address", default=None, help="default: no cluster (jobs stay QUEUED)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raydock-bench-schedules-") as tmp:
        env = {"RAYDOCK_DATABASE_URL": args.database_url} if args.database_url else {}
        server = ServerProcess(Path(tmp), args.ray_address or dead_ray(), extra_env=env).start()
        try:
            late, expected, most = measure(server.url, args.schedules, args.minutes)
        finally:
            server.stop()
    print(f"firings: {len(late)} (expected {expected}); most jobs for one schedule and tick: {most} (must be 1)")
    if not late:
        print("no firings measured")
        return
    p50, p99 = percentile(late, 0.5), percentile(late, 0.99)
    print(f"lateness min {min(late):.3f} s, p50 {p50:.3f} s, max {max(late):.3f} s")
    ok = p99 <= TARGET_P99_S and most == 1 and len(late) == expected
    print(f"lateness p99 {p99:.3f} s | target <= {TARGET_P99_S:g} s | {'ok' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
