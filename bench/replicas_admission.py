"""Admission stays within the cluster while replicas die, measured against the targets.

    .venv/bin/python -m bench.replicas_admission [--jobs 200] [--replicas 3] [--cpus 4] [--kill-every 8]

Real ``raydock serve`` replicas on one PostgreSQL and one Ray head this script starts (one
storage path), a short lease TTL (3 s). Small jobs (one worker of one CPU, one epoch) are
submitted round-robin to the live replicas, one every PACE_S, and until every accepted job
has ended a random replica is SIGKILLed every ``--kill-every`` seconds and a fresh one
started in its place. The store is sampled every
100 ms for the CPUs committed to admitted jobs (STARTING, RUNNING, CANCELLING, PREEMPTED).

Rows: peak committed CPUs (target: never above the cluster's), accepted jobs that ended
SUCCEEDED (target: all), Ray jobs per attempt (target: exactly one each).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import func, select

from bench.figures import ROWS, row
from bench.harness.databases import PostgresServer
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from service.attempts import ACTIVE
from service.cluster.local_cluster import ensure_token, start_head
from service.cluster.ray_backend import RayBackend
from service.db.engine import make_engine
from service.db.models import JobRow

TTL_S = 3.0
PACE_S = 0.5  # between two submits: a kill lands in the middle of the burst
SPEC = {
    k: v
    for k, v in digits_spec(name="admitted", epochs=1, scaling={"num_workers": 1, "cpus_per_worker": 1.0}).items()
    if k != "checkpoint"
}


def _replica(root: Path, n: int, url: str, ray: str, token: Path) -> ServerProcess:
    env = {
        "RAYDOCK_DATABASE_URL": url,
        "RAYDOCK_LEASE_TTL_S": str(TTL_S),
        "RAYDOCK_STORAGE_PATH": str(root / "storage"),
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_AUTH_MODE": "token",
    }
    return ServerProcess(root / f"replica-{n}", ray, extra_env=env).start(timeout=180)


def run(root: Path, jobs: int, replicas: int, cpus: int, kill_every: float) -> None:
    pg = PostgresServer().start()
    token = ensure_token(root / "auth_token")
    head = start_head(root / "ray", num_cpus=cpus, auth_token_path=token)
    live: list[ServerProcess] = []
    try:
        url = pg.url(pg.create_database())
        engine = make_engine(url)
        made = 0
        for _ in range(replicas):
            live.append(_replica(root, made, url, head.dashboard_url, token))
            made += 1
        peak, stop = [0.0], threading.Event()

        def sample() -> None:
            while not stop.is_set():
                with engine.connect() as c:
                    held = c.scalar(
                        select(func.coalesce(func.sum(JobRow.holds_cpus), 0.0)).where(JobRow.status.in_(ACTIVE))
                    )
                peak[0] = max(peak[0], float(held or 0.0))
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        accepted: list[str] = []
        next_kill, killed = time.monotonic() + kill_every, 0

        def maybe_kill() -> None:
            nonlocal next_kill, killed, made
            if time.monotonic() < next_kill:
                return
            live.pop(random.randrange(len(live))).kill()  # SIGKILL: its leases wait out their TTL
            killed += 1
            live.append(_replica(root, made, url, head.dashboard_url, token))
            made += 1
            next_kill = time.monotonic() + kill_every

        for n in range(jobs):
            maybe_kill()
            try:
                r = httpx.post(live[n % len(live)].url + "/v1/jobs", json=SPEC, timeout=30)
                if r.status_code == 202:
                    accepted.append(r.json()["id"])
            except httpx.HTTPError:
                pass  # not accepted: nothing owed
            time.sleep(PACE_S)
        deadline = time.monotonic() + 60 + 30 * jobs / cpus
        while time.monotonic() < deadline:
            with engine.connect() as c:
                unended = c.scalar(
                    select(func.count()).where(JobRow.id.in_(accepted), JobRow.status.in_([*ACTIVE, "QUEUED"]))
                )
            if not unended:
                break
            maybe_kill()  # replicas die while the jobs run too
            time.sleep(1)
        stop.set()
        sampler.join(5)
        with engine.connect() as c:
            succeeded = c.scalar(select(func.count()).where(JobRow.id.in_(accepted), JobRow.status == "SUCCEEDED"))
        ray = RayBackend(head.dashboard_url, auth_token=token.read_text().strip())
        per_job: dict[str, int] = {}
        for j in ray.list_jobs():
            if j.metadata.get("raydock_job") in set(accepted):
                per_job[j.metadata["raydock_job"]] = per_job.get(j.metadata["raydock_job"], 0) + 1
        print(f"# {len(accepted)} of {jobs} submits accepted, {killed} replicas killed, {made} started")
        row("peak CPUs committed to admitted jobs", f"{peak[0]:g}", f"<= {cpus} (the cluster's)", peak[0] <= cpus)
        row("accepted jobs that ended SUCCEEDED", f"{succeeded} of {len(accepted)}", "all", succeeded == len(accepted))
        once = sum(1 for i in accepted if per_job.get(i) == 1)
        row("accepted jobs run as exactly one Ray job", f"{once} of {len(accepted)}", "all", once == len(accepted))
    finally:
        for server in live:
            server.kill()
        head.stop()
        pg.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--cpus", type=int, default=4)
    p.add_argument("--kill-every", type=float, default=8.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    random.seed(args.seed)
    ROWS.clear()
    print("what | figure | bound | ok/FAIL")
    with tempfile.TemporaryDirectory(prefix="raydock-replicas-admission-") as tmp:
        run(Path(tmp), args.jobs, args.replicas, args.cpus, args.kill_every)
    return sum(1 for *_, ok in ROWS if not ok)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
