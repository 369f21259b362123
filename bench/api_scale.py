"""The control plane at scale: N stored jobs (mixed statuses, 10k of them queued), the
API's figures over real HTTP, side by side with their targets.

    .venv/bin/python -m bench.api_scale                      # SQLite, N = 10k and 100k
    .venv/bin/python -m bench.api_scale --db postgres        # a throwaway PostgreSQL (harness/databases.py)
    .venv/bin/python -m bench.api_scale --jobs 10000 --seconds 3
    .venv/bin/python -m bench.api_scale --jobs 10000 --no-events   # the job rows alone

No Ray: the server points at a port where no dashboard answers, so jobs stay queued.
Jobs are seeded straight into the store (bulk inserts) for speed; then, per N:
one monitor tick in this process (the first, which stores every queue position, and a
steady one, with the rows it wrote), then a server process and `GET /v1/jobs/{id}` of
queued jobs, `GET /v1/jobs?limit=50` (first page, a deep page by cursor, by status, by
label, and by offset for comparison), `POST /v1/jobs`, and a cancel of every queued job.
Rows of ``bench/api_scale_events.py`` (metrics, logs, checkpoints), when that module is
there, are added to the same table: its ``rows(**context)`` is called with the keywords
it accepts among ``url``, ``database_url``, ``data_dir`` and returns (what, figure,
target) rows.

The load phases (``GET /v1/jobs/{id}``, ``POST /v1/jobs``, cancel one by one) run THREADS
client threads in this process, on the same 2 cores as the server, each with one
keep-alive HTTP/1.1 connection of the standard library's ``http.client``: a request costs
the client about 0.2 ms of CPU there, where httpx took about 1 ms and so held back the
very rate it measured (at 1,000 req/s it wanted a core of its own). Nothing else is
cheaper: every request is a real one over TCP, each answer is read to its last byte and
its status checked, and latency is timed around the whole exchange. Each rate row gives
the server's CPU per request and the client's, so a client that becomes the limit
shows. Where the time goes in the server: ``py-spy record -p <server pid>`` during a
load phase (``py-spy`` comes with the dev extra).
"""

from __future__ import annotations

import argparse
import http.client
import inspect
import json
import os
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from sqlalchemy import event, insert, select

from api.schemas import parse_job_spec
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from service.cluster.local_cluster import free_ports
from service.cluster.ray_backend import RayBackend
from service.db.engine import make_engine, make_sessionmaker
from service.db.listing import encode_cursor
from service.db.models import JobLabelRow, JobRow, utcnow
from service.runtime import compose
from service.scheduling import queue
from service.settings import Settings

QUEUED = 10_000
THREADS = 8
FINISHED = ("SUCCEEDED",) * 7 + ("FAILED",) * 2 + ("CANCELLED",)
TARGETS = {
    "get": ">= 1,000 req/s, p99 < 50 ms",
    "list": "< 50 ms at any depth",
    "post": ">= 300 req/s",
    "cancel": "< 10 s",
    "tick": "grows with active jobs only; reasons written only when they change",
}


# ----------------------------------------------------------------------------- seeding


def seed(database_url: str, n: int, queued: int) -> None:
    """n jobs, the newest ``queued`` of them QUEUED, the rest finished, two labels each."""
    engine = make_engine(database_url)
    spec = parse_job_spec(digits_spec(name="seeded"))
    body, typed = spec.model_dump(mode="json"), queue.typed_columns(spec)
    now = utcnow()
    batch = 5000
    with engine.begin() as conn:
        for start in range(0, n, batch):
            jobs, labels = [], []
            for i in range(start, min(n, start + batch)):
                job_id = "j" + uuid.uuid4().hex[:11]
                created = now - timedelta(seconds=2 * (n - i))
                waiting = i >= n - queued
                status = "QUEUED" if waiting else FINISHED[i % len(FINISHED)]
                jobs.append(
                    {
                        **typed,
                        "id": job_id,
                        "name": f"seeded-{i}",
                        "kind": "train",
                        "status": status,
                        "status_reason": "waiting to be scheduled" if waiting else "training finished",
                        "labels": {"team": f"t{i % 20}", "bench": "yes"},
                        "spec": body,
                        "created_at": created,
                        "queued_at": created,
                        "finished_at": None if waiting else created + timedelta(seconds=1),
                        "priority": i % 3,
                        "attempt": 0 if waiting else 1,
                        "log_offset": 0,
                        "restarts": [],
                        "dropped_events": 0,
                    }
                )
                labels += [
                    {"job_id": job_id, "key": k, "value": v, "created_at": created}
                    for k, v in (("team", f"t{i % 20}"), ("bench", "yes"))
                ]
            conn.execute(insert(JobRow), jobs)
            conn.execute(insert(JobLabelRow), labels)
    if engine.dialect.name == "postgresql":  # what autovacuum does to a table that grew: statistics, visibility map
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
    engine.dispose()


# ----------------------------------------------------------------------------- measuring


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


class Connection:
    """One keep-alive HTTP/1.1 connection to the server (a load generator's client)."""

    def __init__(self, url: str) -> None:
        where = urlsplit(url)
        self.http = http.client.HTTPConnection(where.hostname, where.port, timeout=60)

    def request(self, method: str, path: str, body: object = None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.http.request(method, path, body=None if body is None else json.dumps(body).encode(), headers=headers)
        answer = self.http.getresponse()
        return answer.status, answer.read()

    def close(self) -> None:
        self.http.close()


def hammer(url: str, request, seconds: float, connect=None) -> tuple[float, list[float], float]:
    """``request(connection, i)`` -> (status, body) from THREADS threads for ``seconds``,
    thread k on ``connect(url, k)`` (None: a plain ``Connection``): (req/s, latencies, the client's CPU seconds)."""
    lat: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def worker(k: int) -> None:
        mine, i, conn = [], k, Connection(url) if connect is None else connect(url, k)
        try:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                status, body = request(conn, i)
                mine.append(time.perf_counter() - t0)
                assert status < 300, body
                i += THREADS
        finally:
            conn.close()
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    t0, cpu0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(lat) / (time.perf_counter() - t0), lat, time.process_time() - cpu0


def rate(rps: float, lat: list[float], cpu_s: float, client_cpu_s: float) -> str:
    """The machine's load average goes with it: on a shared machine the neighbours' work
    shows in the wall-clock figures, less in the CPU per request."""
    per = len(lat)
    load = os.getloadavg()[0]
    return (
        f"{rps:,.0f} req/s, p50 {ms(pct(lat, 0.5))}, p99 {ms(pct(lat, 0.99))}; CPU/req server {ms(cpu_s / per)}, "
        f"client {ms(client_cpu_s / per)}; load {load:.1f}"
    )


def server_cpu(server: ServerProcess) -> float:
    """CPU seconds the server process has used (user + system): figures that hold on a
    busy machine, where wall-clock rates measure the neighbours too."""
    fields = Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_gets(server: ServerProcess, c: httpx.Client, path: str, params: dict, times: int = 30) -> str:
    lat, cpu0 = [], server_cpu(server)
    for _ in range(times):
        t0 = time.perf_counter()
        r = c.get(path, params=params)
        lat.append(time.perf_counter() - t0)
        assert r.status_code == 200, r.text
    return (
        f"p50 {ms(pct(lat, 0.5))}, p99 {ms(pct(lat, 0.99))}; server CPU {ms((server_cpu(server) - cpu0) / times)}/req"
    )


def tick_figures(database_url: str, data_dir: Path, dead: str) -> tuple[str, str]:
    """One monitor tick on this store: the first (it stores every queue position) and a
    steady one, with the rows each wrote."""
    settings = Settings(storage={"data_dir": data_dir, "database_url": database_url}, cluster={"ray_address": dead})
    service = compose(settings, make_sessionmaker(make_engine(database_url)), RayBackend(dead, timeout_s=2))
    monitor = service.monitor
    engine = service.sessions.kw["bind"]
    written = []
    event.listen(
        engine,
        "after_cursor_execute",
        lambda conn, cur, stmt, *a: written.append(cur.rowcount if stmt.lstrip().upper().startswith("UPDATE") else 0),
    )
    out = []
    for _ in range(2):
        written.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        monitor.tick()
        out.append(
            f"{ms(time.perf_counter() - t0)} ({ms(time.process_time() - c0)} CPU), {sum(written):,} rows written"
        )
    engine.dispose()
    return out[0], out[1]


def measure(
    n: int, database_url: str, data_dir: Path, seconds: float, events: bool = True
) -> list[tuple[str, str, str]]:
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    t0 = time.perf_counter()
    seed(database_url, n, QUEUED)
    print(f"  seeded {n:,} jobs in {time.perf_counter() - t0:.1f}s", flush=True)
    first_tick, steady_tick = tick_figures(database_url, data_dir, dead)
    rows = [
        ("monitor tick, 10k queued: first (stores every position)", first_tick, "-"),
        ("monitor tick, 10k queued: steady", steady_tick, TARGETS["tick"]),
    ]
    server = ServerProcess(data_dir / "server", dead, extra_env={"RAYDOCK_DATABASE_URL": database_url}).start()
    try:
        engine = make_engine(database_url)
        with engine.connect() as conn:
            waiting = list(conn.scalars(select(JobRow.id).where(JobRow.status == "QUEUED")))
            middle = conn.execute(
                select(JobRow.created_at, JobRow.id)
                .order_by(JobRow.created_at.desc(), JobRow.id.desc())
                .offset(n // 2)
                .limit(1)
            ).one()
        engine.dispose()
        cpu0 = server_cpu(server)
        rps, lat, client_cpu = hammer(
            server.url, lambda c, i: c.request("GET", f"/v1/jobs/{waiting[i % len(waiting)]}"), seconds
        )
        rows.append(
            ("GET /v1/jobs/{id} (queued)", rate(rps, lat, server_cpu(server) - cpu0, client_cpu), TARGETS["get"])
        )
        with httpx.Client(base_url=server.url, timeout=60) as c:
            for what, params in (
                ("first page", {}),
                ("by cursor at N/2", {"cursor": encode_cursor(middle.created_at, middle.id)}),
                ("status=QUEUED", {"status": "QUEUED"}),
                ("label=team=t3", {"label": "team=t3"}),
                ("offset=N/2 (no cursor)", {"offset": n // 2}),
            ):
                target = TARGETS["list"] if "offset" not in what else "- (use the cursor)"
                rows.append(
                    (
                        f"GET /v1/jobs?limit=50, {what}",
                        timed_gets(server, c, "/v1/jobs", {"limit": 50, **params}),
                        target,
                    )
                )
        spec = digits_spec(name="posted")
        cpu0 = server_cpu(server)
        rps, lat, client_cpu = hammer(server.url, lambda c, i: c.request("POST", "/v1/jobs", spec), seconds)
        rows.append(
            (
                "POST /v1/jobs (server CPU includes the monitor's ticks)",
                rate(rps, lat, server_cpu(server) - cpu0, client_cpu),
                TARGETS["post"],
            )
        )
        with make_engine(database_url).connect() as conn:
            posted = list(conn.scalars(select(JobRow.id).where(JobRow.status == "QUEUED", JobRow.name == "posted")))
        rows.append(cancel_one_by_one(server, posted))
        t0, cpu0 = time.perf_counter(), server_cpu(server)
        with httpx.Client(base_url=server.url, timeout=120) as c:
            for start in range(0, len(waiting), 1000):
                r = c.post("/v1/jobs:cancel", json={"ids": waiting[start : start + 1000]})
                assert r.status_code == 200 and not r.json()["refused"], r.text
        took, cpu = time.perf_counter() - t0, server_cpu(server) - cpu0
        what = f"cancel {len(waiting):,} queued jobs (POST /v1/jobs:cancel, 1000 ids a request)"
        rows.append((what, f"{took:.1f} s; server CPU {cpu:.1f} s", TARGETS["cancel"]))
        rows += events_rows(url=server.url, database_url=database_url, data_dir=data_dir) if events else []
    finally:
        server.stop()
    return rows


def cancel_one_by_one(server: ServerProcess, ids: list[str]) -> tuple[str, str, str]:
    """POST /v1/jobs/{id}/cancel for each job, from THREADS clients."""
    t0, cpu0 = time.perf_counter(), server_cpu(server)

    def cancel(mine: list[str]) -> None:
        conn = Connection(server.url)
        for job_id in mine:
            status, body = conn.request("POST", f"/v1/jobs/{job_id}/cancel")
            assert status == 200, body
        conn.close()

    threads = [threading.Thread(target=cancel, args=(ids[k::THREADS],)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took, cpu = time.perf_counter() - t0, server_cpu(server) - cpu0
    rate = f"{len(ids) / took:,.0f} jobs/s; server CPU {ms(cpu / max(len(ids), 1))}/job"
    return f"cancel one by one ({len(ids):,} queued jobs, {THREADS} clients)", rate, "-"


def events_rows(**context) -> list[tuple[str, str, str]]:
    """The metrics/logs/checkpoint rows, when bench/api_scale_events.py is there."""
    try:
        from bench import api_scale_events  # type: ignore[attr-defined]
    except ImportError:
        return []
    accepted = inspect.signature(api_scale_events.rows).parameters
    return [tuple(r) for r in api_scale_events.rows(**{k: v for k, v in context.items() if k in accepted})]


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[10_000, 100_000], help="stored jobs (one run per value)")
    ap.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each load phase")
    ap.add_argument("--no-events", action="store_true", help="leave out the rows of bench/api_scale_events.py")
    args = ap.parse_args()
    pg = None
    if args.db == "postgres":
        from bench.harness.databases import PostgresServer

        pg = PostgresServer()
        pg.start()
    results: dict[int, list[tuple[str, str, str]]] = {}
    try:
        for n in args.jobs:
            print(f"N = {n:,} jobs ({args.db})", flush=True)
            with tempfile.TemporaryDirectory(prefix="raydock-bench-") as tmp:
                url = pg.url(pg.create_database()) if pg else f"sqlite:///{tmp}/raydock.db"
                results[n] = measure(n, url, Path(tmp), args.seconds, events=not args.no_events)
            for what, figure, target in results[n]:
                print(f"  {what:<58} {figure:<44} target {target}", flush=True)
    finally:
        if pg is not None:
            pg.stop()
    print(
        f"\n| what ({args.db}, {THREADS} client threads, 2 cores) | "
        + " | ".join(f"N = {n:,}" for n in results)
        + " | target |"
    )
    print("|---|" + "---|" * len(results) + "---|")
    for i, (what, _, target) in enumerate(next(iter(results.values()))):
        print(
            f"| {what} | "
            + " | ".join(rows[i][1] if i < len(rows) else "" for rows in results.values())
            + f" | {target} |"
        )


if __name__ == "__main__":
    main()
