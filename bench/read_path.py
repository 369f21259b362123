"""The read path: ``GET /v1/jobs/{id}`` of a queued job with 10k queued, and the list's
first page, over real HTTP against real ``raydock serve`` processes, beside the targets.

    .venv/bin/python -m bench.read_path                               # SQLite, one replica
    .venv/bin/python -m bench.read_path --db postgres --replicas 1 2 3   # PostgreSQL, 1, 2, 3 replicas
    .venv/bin/python -m bench.read_path --seconds 8
    git archive <rev> | tar -x -C /tmp/before && .venv/bin/python -m bench.read_path --before /tmp/before

SQLite, one replica: GET one job as a loopback client in local mode (what bench/api_scale.py
measures), then with a project member's user token (remembered for RAYDOCK_TOKEN_CACHE_S,
service/tenancy/caller_cache.py) and with the same token on a replica that looks every
token up (RAYDOCK_TOKEN_CACHE_S=0), and the list's first page. ``--before DIR``: the
local-mode GET also against a server run from another checkout of raydock (DIR), both up
at once on the same store and loaded in one-second turns: a before/after on one busy machine.

PostgreSQL (a throwaway server, bench/harness/databases.py): for each replica count N, N
replicas on one database (bench/harness/replicas.py; no Ray, so jobs stay queued), the
load generator's connections spread over them round-robin: GET one job, then
``POST /v1/jobs``. The replicas, PostgreSQL and the load generator share this machine's
cores: when they are fewer than the replicas need, more replicas cannot give more, and
the CPU per request (server, client) says where the time went.

One row per figure, ``what | figure | bound | ok/FAIL`` (bench/figures.py); the load
generator is bench/api_scale.py's (keep-alive ``http.client`` connections, 8 threads).
The machine's load average is in each row: on a shared machine the neighbours' work
shows in the wall-clock figures, less in the CPU per request. Where the server's time
goes: ``py-spy record -p <pid>`` during a phase.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from sqlalchemy import select

from bench import api_scale
from bench.api_scale import Connection, ms, pct, seed, server_cpu
from bench.figures import ROWS, row
from bench.harness.databases import PostgresServer
from bench.harness.jobstore import dead_ray
from bench.harness.replicas import replica
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from service.db.engine import make_engine
from service.db.models import JobRow

QUEUED = 10_000
GET_SQLITE = (1500.0, 0.030)  # req/s at least, p99 at most
GET_POSTGRES = 1000.0
LIST_P99_S = 0.050


class Authorized(Connection):
    def __init__(self, url: str, token: str | None) -> None:
        super().__init__(url)
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}

    def request(self, method: str, path: str, body: object = None) -> tuple[int, bytes]:
        headers = {**self.auth, **({"Content-Type": "application/json"} if body is not None else {})}
        data = None if body is None else api_scale.json.dumps(body).encode()
        self.http.request(method, path, body=data, headers=headers)
        answer = self.http.getresponse()
        return answer.status, answer.read()


def hammer(servers: list[ServerProcess], request, seconds: float, token: str | None = None):
    """bench/api_scale.py's load, thread k on replica k mod N, with ``token`` when given:
    (req/s, latencies, client CPU seconds, server CPU seconds)."""
    cpu0 = sum(server_cpu(s) for s in servers)
    rps, lat, client_cpu = api_scale.hammer(
        "", request, seconds, connect=lambda _, k: Authorized(servers[k % len(servers)].url, token)
    )
    return rps, lat, client_cpu, sum(server_cpu(s) for s in servers) - cpu0


def rate_row(what: str, result, target: tuple[float, float | None]) -> None:
    rps, lat, client_cpu, server_cpu_s = result
    p99 = pct(lat, 0.99)
    figure = (
        f"{rps:,.0f} req/s, p50 {ms(pct(lat, 0.5))}, p99 {ms(p99)}; CPU/req server {ms(server_cpu_s / len(lat))}, "
        f"client {ms(client_cpu / len(lat))}; load {os.getloadavg()[0]:.1f}"
    )
    least, worst = target
    bound = f">= {least:,.0f} req/s" + (f", p99 <= {ms(worst)}" if worst else "")
    row(what, figure, bound, rps >= least and (worst is None or p99 <= worst))


def queued_ids(database_url: str) -> list[str]:
    engine = make_engine(database_url)
    with engine.connect() as conn:
        ids = list(conn.scalars(select(JobRow.id).where(JobRow.status == "QUEUED")))
    engine.dispose()
    return ids


def get_one(ids: list[str]):
    return lambda c, i: c.request("GET", f"/v1/jobs/{ids[i % len(ids)]}")


def settle(servers: list[ServerProcess], ids: list[str], token: str | None = None) -> None:
    """A second of load, then until the servers idle (under 0.1 s of CPU in a second, 30 s
    at most): their start (imports, pools, the monitor's first ticks) is not measured."""
    hammer(servers, get_one(ids), 1.0, token)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        cpu0 = sum(server_cpu(s) for s in servers)
        time.sleep(1.0)
        if sum(server_cpu(s) for s in servers) - cpu0 < 0.1 * len(servers):
            return


def member_token(server: ServerProcess) -> str:
    """A user in project ``default`` (where the seeded jobs are) and a token of theirs, made
    over the API in local mode (which this ends, for good)."""
    with httpx.Client(base_url=server.url, timeout=30) as c:
        c.post("/v1/users", json={"name": "reader", "project": "default", "role": "member"}).raise_for_status()
        return c.post("/v1/users/reader/tokens", json={"name": "bench"}).raise_for_status().json()["token"]


def before_and_after(root: Path, url: str, ids: list[str], before: Path, seconds: float) -> None:
    """Both servers up at once on one store, loaded in turns of a second, so a neighbour's
    work on a shared machine falls on both alike: medians of each turn's figures."""
    servers = {}
    try:
        for name, code in (("before", before), ("after", None)):
            env = {"RAYDOCK_DATABASE_URL": url, **({"PYTHONPATH": str(code)} if code else {})}
            servers[name] = ServerProcess(root / name, dead_ray(), extra_env=env, cwd=code).start()
        settle(list(servers.values()), ids)
        turns: dict[str, list] = {name: [] for name in servers}
        for _ in range(max(2, int(seconds))):
            for name, server in servers.items():
                turns[name].append(hammer([server], get_one(ids), 1.0))
        for name, results in turns.items():
            rps = statistics.median(r[0] for r in results)
            lat = [x for r in results for x in r[1]]
            merged = (rps, lat, sum(r[2] for r in results), sum(r[3] for r in results))
            rate_row(
                f"SQLite, 1 replica: GET /v1/jobs/{{id}}, local mode, {name} (median of turns)", merged, GET_SQLITE
            )
    finally:
        for server in servers.values():
            server.stop()


def sqlite_rows(root: Path, seconds: float, before: Path | None) -> None:
    url = f"sqlite:///{root}/raydock.db"
    seed(url, QUEUED, QUEUED)
    api_scale.tick_figures(url, root, dead_ray())  # the first tick (every queue position stored) is not measured
    ids = queued_ids(url)
    if before is not None:
        before_and_after(root, url, ids, before, seconds)
    server = ServerProcess(root / "one", dead_ray(), extra_env={"RAYDOCK_DATABASE_URL": url}).start()
    try:
        settle([server], ids)
        rate_row(
            "SQLite, 1 replica: GET /v1/jobs/{id}, local mode", hammer([server], get_one(ids), seconds), GET_SQLITE
        )
        lat, cpu0 = [], server_cpu(server)
        with httpx.Client(base_url=server.url, timeout=30) as c:
            for _ in range(50):
                t0 = time.perf_counter()
                c.get("/v1/jobs", params={"limit": 50}).raise_for_status()
                lat.append(time.perf_counter() - t0)
        figure = (
            f"p50 {ms(pct(lat, 0.5))}, p99 {ms(pct(lat, 0.99))}; server CPU {ms((server_cpu(server) - cpu0) / 50)}/req"
        )
        row(
            "SQLite, 1 replica: GET /v1/jobs?limit=50, first page",
            figure,
            f"p99 <= {ms(LIST_P99_S)}",
            pct(lat, 0.99) <= LIST_P99_S,
        )
        token = member_token(server)
        settle([server], ids, token)
        rate_row(
            "SQLite, 1 replica: GET /v1/jobs/{id}, a member's token (cached)",
            hammer([server], get_one(ids), seconds, token),
            GET_SQLITE,
        )
    finally:
        server.stop()
    uncached = ServerProcess(
        root / "uncached", dead_ray(), extra_env={"RAYDOCK_DATABASE_URL": url, "RAYDOCK_TOKEN_CACHE_S": "0"}
    ).start()
    try:
        settle([uncached], ids, token)
        rate_row(
            "SQLite, 1 replica: GET /v1/jobs/{id}, a member's token, RAYDOCK_TOKEN_CACHE_S=0",
            hammer([uncached], get_one(ids), seconds, token),
            (0.0, None),
        )
    finally:
        uncached.stop()


def postgres_rows(root: Path, counts: list[int], seconds: float) -> None:
    pg = PostgresServer()
    pg.start()
    try:
        url = pg.url(pg.create_database())
        seed(url, QUEUED, QUEUED)
        api_scale.tick_figures(url, root, dead_ray())
        ids = queued_ids(url)
        spec = digits_spec(name="posted")
        for n in counts:
            servers = []
            try:
                for k in range(n):
                    servers.append(replica(root / f"pg-{n}-{k}", url, ttl_s=12.0))
                settle(servers, ids)
                rate_row(
                    f"PostgreSQL, {n} replica(s): GET /v1/jobs/{{id}}, 10k queued",
                    hammer(servers, get_one(ids), seconds),
                    (GET_POSTGRES, None),
                )
                rate_row(
                    f"PostgreSQL, {n} replica(s): POST /v1/jobs",
                    hammer(servers, lambda c, i: c.request("POST", "/v1/jobs", spec), seconds),
                    (0.0, None),
                )
            finally:
                for s in servers:
                    s.stop()
    finally:
        pg.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3], help="replica counts (PostgreSQL)")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each load phase")
    ap.add_argument("--before", type=Path, help="another checkout of raydock to measure beside this one (SQLite)")
    args = ap.parse_args()
    ROWS.clear()
    print(f"what | figure | bound | ok/FAIL   ({os.cpu_count()} cores, {api_scale.THREADS} client threads)")
    with tempfile.TemporaryDirectory(prefix="raydock-bench-") as tmp:
        if args.db == "sqlite":
            sqlite_rows(Path(tmp), args.seconds, args.before)
        else:
            postgres_rows(Path(tmp), args.replicas, args.seconds)
    return sum(1 for *_, ok in ROWS if not ok)


if __name__ == "__main__":
    raise SystemExit(main())
