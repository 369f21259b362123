"""The dashboard at scale, in a real headless Chromium: time to the first paint of the jobs
table with 100k jobs in the store, and of the chart of a job with a 100k-point series,
each beside its target (< 1 s).

    .venv/bin/python -m bench.dashboard                      # 100k jobs, 100k points
    .venv/bin/python -m bench.dashboard --jobs 10000 --points 1000000 --repeat 5

No Ray: the server points at a port where no dashboard answers. Jobs and the series are
seeded straight into the store (bulk inserts, with the rollups ingestion keeps beside a
series). Each page is opened ``--repeat`` times in a fresh browser context (no cache);
a figure is the time from navigation start to the frame after the table's rows (or the
chart's points) are in the page, as ``performance.now()`` reads it there: first load,
and median and max of the rest (the median is held to the target). Chromium is Debian's (``tests/setup_browser.sh``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright
from sqlalchemy import insert, update

from api.schemas import parse_job_spec
from bench.api_scale import seed
from bench.figures import ROWS, row
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from service.cluster.local_cluster import free_ports
from service.cluster.ray_backend import RayBackend
from service.db.engine import make_engine, make_sessionmaker
from service.db.event_models import MetricRow
from service.db.models import JobRow
from service.events import rollups
from service.runtime import compose
from service.settings import Settings

CHROMIUM = os.environ.get("RAYDOCK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
TARGET_S = 1.0
BATCH = 8192
# Checked at every animation frame (Playwright's raf polling); the frame it first holds in
# stamps performance.now(): navigation start -> the frame that paints it.
PAINTED = "() => ({ready}) && (window.paintedAt = performance.now())"


def seed_series(database_url: str, data_dir: Path, dead: str, n: int) -> str:
    """A finished job with an n-point series (loss, acc), stored as ingestion stores it."""
    settings = Settings(storage={"data_dir": data_dir, "database_url": database_url}, cluster={"ray_address": dead})
    service = compose(settings, make_sessionmaker(make_engine(database_url)), RayBackend(dead, timeout_s=2))
    job, _ = service.jobs.submit(parse_job_spec(digits_spec(name="long-series", epochs=100)))
    with service.sessions.begin() as s:
        for start in range(0, n, BATCH):
            rows = [
                dict(
                    job_id=job.id,
                    attempt=1,
                    src_seq=i,
                    seq=i,
                    ts=1.0 + i,
                    step=i,
                    epoch=i * 100 // n,
                    values={"loss": 2.0 / (1 + i / 1000), "acc": min(0.99, i / n), "step": i, "epoch": i * 100 // n},
                )
                for i in range(start, min(start + BATCH, n))
            ]
            s.execute(insert(MetricRow), rows)
            rollups.add(s, job.id, rows)
        s.execute(
            update(JobRow)
            .where(JobRow.id == job.id)
            .values(
                status="SUCCEEDED",
                attempt=1,
                metrics_stored=n,
                attempt_metrics=n,
                attempt_metrics_of=1,
                latest_metrics=rows[-1]["values"],
            )
        )
    return job.id


def time_page(browser, url: str, ready: str, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url, wait_until="commit")
        page.wait_for_function(PAINTED.format(ready=ready), polling="raf", timeout=60_000)
        out.append(page.evaluate("window.paintedAt") / 1000)
        context.close()
        if errors:
            raise RuntimeError(f"console errors on {url}: {errors}")
    return out


def figure(times: list[float]) -> str:
    rest = times[1:] or times
    return (
        f"first {times[0] * 1000:.0f} ms, median {statistics.median(rest) * 1000:.0f} ms, max {max(rest) * 1000:.0f} ms"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000, help="jobs in the store")
    ap.add_argument("--points", type=int, default=100_000, help="reports in the long job's series")
    ap.add_argument("--repeat", type=int, default=5, help="page loads per figure")
    args = ap.parse_args()
    ROWS.clear()
    with tempfile.TemporaryDirectory(prefix="raydock-bench-dashboard-") as tmp:
        data = Path(tmp)
        url = f"sqlite:///{data}/raydock.db"
        dead = f"http://127.0.0.1:{free_ports(1)[0]}"
        t0 = time.perf_counter()
        seed(url, args.jobs, 1_000)
        long_job = seed_series(url, data / "seed", dead, args.points)
        print(f"seeded {args.jobs:,} jobs and a {args.points:,}-point series in {time.perf_counter() - t0:.0f} s")
        server = ServerProcess(data / "server", dead, extra_env={"RAYDOCK_DATABASE_URL": url}).start()
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM)
                warm = browser.new_page()  # the browser's own start-up is not the page's
                warm.goto("about:blank")
                warm.close()
                print("what | figure | bound | ok/FAIL")
                pages = [
                    (
                        f"jobs table, {args.jobs // 1000:,}k jobs, first page",
                        "/",
                        "document.querySelectorAll('tr[data-job]').length >= 50",
                    ),
                    (
                        f"jobs table, {args.jobs // 1000:,}k jobs, label filter",
                        "/?label=team%3Dt7",
                        "document.querySelectorAll('tr[data-job]').length >= 50",
                    ),
                    (
                        f"job chart, {args.points // 1000:,}k-point series",
                        f"/jobs/{long_job}",
                        "+document.querySelector('figure[data-metric=loss]')?.dataset.points > 100",
                    ),
                ]
                for what, path, ready in pages:
                    times = time_page(browser, server.url + path, ready, args.repeat)
                    row(
                        what,
                        figure(times),
                        f"median < {TARGET_S:g} s",
                        statistics.median(times[1:] or times) < TARGET_S,
                    )
                browser.close()
        finally:
            server.stop()
    return sum(1 for *_, ok in ROWS if not ok)


if __name__ == "__main__":
    raise SystemExit(main())
