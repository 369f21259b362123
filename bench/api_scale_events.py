"""Events, metrics, logs and checkpoint downloads at scale, over real HTTP, side by side
with their targets.

    .venv/bin/python -m bench.api_scale_events             # its own server and SQLite
    .venv/bin/python -m bench.api_scale_events --only ingest metrics --db postgres
    .venv/bin/python -m bench.api_scale_events --only metrics --points 20000 100000 1000000
    .venv/bin/python -m bench.api_scale                    # the same rows in part of the whole table

No Ray: the server points at a port where no dashboard answers; the job is put RUNNING
in the store and its events pushed the way a driver's pusher posts them. Rows:
metric ingestion for one job from empty and with 20k / 100k points stored; GET metrics of
a 20k-point job (pages) and max_points=500 of series of 20k and 100k points (``--points``
for other lengths); an empty follow poll of a 100 MB stored log
(time and the server's peak memory over it); a 200 MB checkpoint download (the server's
peak memory over it). Series and logs are seeded straight into the store for speed.
The script runs on older trees too (one event per post, whole-series reads), so the
same command measures before and after a change.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from sqlalchemy import insert, update

from api.schemas import parse_job_spec
from api.schemas.events import SUBMISSION_HEADER
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from service.cluster.local_cluster import free_ports
from service.cluster.ray_backend import RayBackend
from service.db.engine import make_engine, make_sessionmaker
from service.db.event_models import CheckpointRow, LogChunkRow, MetricRow
from service.db.models import JobRow
from service.events.tokens import token_hash
from service.runtime import compose
from service.settings import Settings

TOKEN = "bench-events-token"
SID = "raydock-pushed-1-abcdef"
EVENTS = 2000  # pushed per ingestion row
BATCH = 200  # events per post, as the driver's pusher sends them
LOG_MB = 100
CKPT_MB = 200


def _metric(i: int) -> dict:
    return {
        "type": "metric",
        "seq": i,
        "ts": 1.0 + i,
        "metrics": {"loss": 1.0 / (i + 1), "acc": (i % 100) / 100, "step": i, "epoch": i // 1000},
    }


class Bench:
    def __init__(self, data_dir: Path, database_url: str):
        dead = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
        env = {"RAYDOCK_DATABASE_URL": database_url, "RAYDOCK_MAX_LOG_BYTES": str((LOG_MB + 50) << 20)}
        self.server = ServerProcess(data_dir, dead, extra_env=env).start()
        self.url = self.server.url
        self.http = httpx.Client(base_url=self.url, timeout=120)
        settings = Settings(storage={"data_dir": data_dir, "database_url": database_url}, cluster={"ray_address": dead})
        self.service = compose(settings, make_sessionmaker(make_engine(database_url)), RayBackend(dead, timeout_s=2))
        self.batched = True

    def close(self) -> None:
        self.http.close()
        self.server.stop()

    def running_job(self) -> str:
        job, _ = self.service.jobs.submit(parse_job_spec(digits_spec()))
        self._set(job.id, status="RUNNING", attempt=1, ray_job_id=SID, events_token_hash=token_hash(TOKEN))
        return job.id

    def _set(self, job_id: str, **values) -> None:
        names = {c.name for c in JobRow.__table__.columns}
        if not names & set(values):
            return
        with self.service.sessions.begin() as s:
            s.execute(
                update(JobRow).where(JobRow.id == job_id).values(**{k: v for k, v in values.items() if k in names})
            )

    def seed_metrics(self, job_id: str, n: int) -> None:
        try:  # what ingestion maintains beside the rows, on trees that have it
            from service.events import rollups  # type: ignore[attr-defined]
        except ImportError:
            rollups = None
        with self.service.sessions.begin() as s:
            for start in range(0, n, 8192):
                rows = [
                    dict(
                        job_id=job_id,
                        attempt=1,
                        src_seq=i,
                        seq=i,
                        ts=1.0 + i,
                        step=i,
                        epoch=i // 1000,
                        values=_metric(i)["metrics"],
                    )
                    for i in range(start, min(start + 8192, n))
                ]
                s.execute(insert(MetricRow), rows)
                if rollups is not None:
                    rollups.add(s, job_id, rows)
        self._set(job_id, metrics_stored=n, attempt_metrics=n, attempt_metrics_of=1)

    def push_rate(self, job_id: str, first: int) -> str:
        """Events/s pushed for one job, EVENTS of them from seq ``first`` on."""
        headers = {"Authorization": f"Bearer {TOKEN}", SUBMISSION_HEADER: SID}
        path = f"/v1/internal/jobs/{job_id}/events"
        t = time.perf_counter()
        if self.batched:
            for start in range(first, first + EVENTS, BATCH):
                r = self.http.post(path, json=[_metric(i) for i in range(start, start + BATCH)], headers=headers)
                if r.status_code == 422:  # a server that takes one event per post
                    self.batched = False
                    return self.push_rate(job_id, first)
        else:
            for i in range(first, first + EVENTS):
                self.http.post(path, json=_metric(i), headers=headers)
        took = time.perf_counter() - t
        return f"{EVENTS / took:,.0f} events/s" + ("" if self.batched else " (one per post)")

    def timed_get(self, path: str, params: dict, times: int = 20) -> str:
        """p50 wall time, and the server's CPU per request (a figure that holds on a busy
        machine; on PostgreSQL the database server's own CPU is not in it)."""
        walls, cpu0 = [], _cpu_s(self.server.proc.pid)
        for _ in range(times):
            t = time.perf_counter()
            r = self.http.get(path, params=params)
            walls.append(time.perf_counter() - t)
            r.raise_for_status()
        cpu = (_cpu_s(self.server.proc.pid) - cpu0) / times
        return f"p50 {statistics.median(walls) * 1000:,.1f} ms, CPU {cpu * 1000:,.0f} ms ({len(r.content) / 1024:,.0f} KiB, {len(r.json()):,} points)"

    def peak_rss(self, run) -> tuple[float, float]:
        """(seconds, MiB the server's peak memory rose by) over ``run()``."""
        pid = self.server.proc.pid
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak starts again from now
        before = _status(pid, "VmRSS")
        t = time.perf_counter()
        run()
        return time.perf_counter() - t, (_status(pid, "VmHWM") - before) / 1024

    def seed_log(self, job_id: str, mb: int) -> int:
        line = ("x" * 99 + "\n") * 10_485  # ~1 MiB
        log = getattr(self.service.ingest, "log")
        at = 0
        if "at" in inspect.signature(log).parameters:
            for _ in range(mb):
                at += log(job_id, line, at)
        else:  # a store of plain chunks, one row per monitor read
            with self.service.sessions.begin() as s:
                for _ in range(mb):
                    s.add(LogChunkRow(job_id=job_id, text=line))
                    at += len(line)
        return at

    def seed_checkpoint(self, job_id: str, mb: int) -> int:
        ckpt = Path(self.service.reads.prefix(job_id)) / "checkpoint_000000"
        (ckpt / "shards").mkdir(parents=True)
        for i in range(mb // 50):
            (ckpt / "shards" / f"part{i}.bin").write_bytes(os.urandom(50 << 20))
        with self.service.sessions.begin() as s:
            row = CheckpointRow(job_id=job_id, attempt=1, path=str(ckpt), step=0, epoch=0, values={})
            s.add(row)
            s.flush()
            return row.id


def _cpu_s(pid: int) -> float:
    """CPU seconds a process has used (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])  # KiB
    return 0


PARTS = ("ingest", "metrics", "logs", "checkpoint")
POINTS = (20_000, 100_000)


def rows(
    database_url: str | None = None, only: tuple[str, ...] = PARTS, points: tuple[int, ...] = POINTS
) -> list[tuple[str, str, str]]:
    """(what, figure, target) rows of the parts named in ``only``; its own server, on
    SQLite or on ``database_url``'s PostgreSQL when one is given."""
    with tempfile.TemporaryDirectory(prefix="raydock-bench-events-") as tmp:
        url = database_url if database_url and not database_url.startswith("sqlite") else f"sqlite:///{tmp}/raydock.db"
        b = Bench(Path(tmp), url)
        try:
            b.push_rate(b.running_job(), 0)  # warm-up: connections, imports, the first queries
            return [row for part in only for row in MEASURES[part](b, points)]
        finally:
            b.close()


def _ingest(b: Bench, points: tuple[int, ...]) -> list[tuple[str, str, str]]:
    target = ">= 2,000 events/s, flat in the series length"
    job = b.running_job()
    out = [("metric ingestion, one job, from 0 points", b.push_rate(job, 0), target)]
    for n in points:
        job = b.running_job()
        b.seed_metrics(job, n)
        out.append((f"metric ingestion, one job, at {n // 1000:,}k points", b.push_rate(job, n), target))
    return out


def _metrics(b: Bench, points: tuple[int, ...]) -> list[tuple[str, str, str]]:
    job = b.running_job()
    b.seed_metrics(job, 20_000)
    path = f"/v1/jobs/{job}/metrics"
    out = [
        ("GET metrics, 20k-point job, first page (default limit)", b.timed_get(path, {}), "< 50 ms"),
        ("GET metrics, 20k-point job, a page deep in (since=15000)", b.timed_get(path, {"since": 15_000}), "< 50 ms"),
    ]
    for n in points:
        if n != 20_000:
            job = b.running_job()
            b.seed_metrics(job, n)
        path = f"/v1/jobs/{job}/metrics"
        out.append(
            (
                f"GET metrics, {n // 1000:,}k-point job, max_points=500",
                b.timed_get(path, {"max_points": 500}),
                "< 50 ms",
            )
        )
        out.append(
            (
                f"GET metrics, {n // 1000:,}k-point job, since=N/3, max_points=500",
                b.timed_get(path, {"since": n // 3, "max_points": 500}),
                "< 50 ms",
            )
        )
    return out


def _logs(b: Bench, _points: tuple[int, ...]) -> list[tuple[str, str, str]]:
    out = []
    job = b.running_job()
    end = b.seed_log(job, LOG_MB)
    polls: list[float] = []

    def poll() -> None:
        for _ in range(10):
            t = time.perf_counter()
            r = b.http.get(f"/v1/jobs/{job}/logs", params={"offset": end})
            polls.append(time.perf_counter() - t)
            assert r.status_code == 200 and r.text == ""

    _, mib = b.peak_rss(poll)
    out.append(
        (
            f"empty follow poll, {LOG_MB} MB stored log",
            f"p50 {statistics.median(polls) * 1000:,.1f} ms, server peak +{mib:,.0f} MiB",
            "independent of log size",
        )
    )
    return out


def _checkpoint(b: Bench, _points: tuple[int, ...]) -> list[tuple[str, str, str]]:
    out = []
    job = b.running_job()
    cid = b.seed_checkpoint(job, CKPT_MB)

    def download() -> None:
        size = 0
        with b.http.stream("GET", f"/v1/jobs/{job}/checkpoints/{cid}/download") as r:
            for piece in r.iter_bytes(1 << 20):
                size += len(piece)
        assert size > CKPT_MB << 20

    took, mib = b.peak_rss(download)
    out.append(
        (
            f"checkpoint download, {CKPT_MB} MB",
            f"{took:,.1f} s, server peak +{mib:,.0f} MiB",
            "constant memory (streamed)",
        )
    )
    return out


MEASURES = {"ingest": _ingest, "metrics": _metrics, "logs": _logs, "checkpoint": _checkpoint}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS), help="the rows to measure")
    ap.add_argument(
        "--points",
        type=int,
        nargs="+",
        default=list(POINTS),
        help="series lengths of the ingestion and max_points rows",
    )
    ap.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    args = ap.parse_args()
    pg = None
    if args.db == "postgres":
        from bench.harness.databases import PostgresServer

        pg = PostgresServer()
        pg.start()
    try:
        url = pg.url(pg.create_database()) if pg else None
        print(f"{args.db}; load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores)")
        print(f"{'what':<58} {'figure':<50} target")
        for what, figure, target in rows(url, tuple(args.only), tuple(args.points)):
            print(f"{what:<58} {figure:<50} {target}", flush=True)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        if pg is not None:
            pg.stop()


if __name__ == "__main__":
    main()
