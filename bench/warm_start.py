"""Cold against warm driver starts, side by side on one cluster.

    .venv/bin/python -m bench.warm_start          # BENCH_ROUNDS=3 by default

Starts one Ray head (2 CPUs) and two servers on it: one with ``RAYDOCK_WARM_START=false``
(every driver a new Python, as before) and one with warm starts (drivers forked from the
node's warm process). After a warm-up job on each and once the warm process is ready,
it alternates a cold and a warm 5-step, 2-worker user-code job (bench/job_timeline.py's
job) for BENCH_ROUNDS rounds and prints each phase's median, seconds after POST.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from api.schemas.events import PHASE_NAMES
from bench.harness.servers import ServerProcess
from bench.job_timeline import SPECS
from bench.jobs import run_job
from service.cluster.local_cluster import start_head

CLIENT = "first metric (client)"


def one_job(http: httpx.Client) -> dict[str, float]:
    """bench/job_timeline.py's user-code job: its start-up phases (seconds after POST, as
    the server stored them) and POST -> first metric as the client saw it."""
    timed = run_job(http, SPECS["user"])
    return {**(timed.job["start_phases"] or {}), CLIENT: timed.first_metric_s}


def wait_warm(http: httpx.Client, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p["ready"] for p in http.get("/v1/cluster").json().get("warm_pool", [])):
            return
        time.sleep(1)
    raise RuntimeError("the warm process did not come up")


def main() -> int:
    rounds = int(os.environ.get("BENCH_ROUNDS", "3"))
    runs: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        head = start_head(Path(tmp) / "ray", num_cpus=2)
        servers = {
            "cold": ServerProcess(Path(tmp) / "cold", head.dashboard_url, extra_env={"RAYDOCK_WARM_START": "false"}),
            "warm": ServerProcess(Path(tmp) / "warm", head.dashboard_url),
        }
        try:
            https = {mode: httpx.Client(base_url=s.start().url, timeout=30) for mode, s in servers.items()}
            for mode in ("warm", "cold"):
                one_job(https[mode])  # warm-up; the warm server's first job starts the pool
            wait_warm(https["warm"])
            for _ in range(rounds):
                for mode in ("cold", "warm"):
                    runs[mode].append(one_job(https[mode]))
        finally:
            for s in servers.values():
                s.stop()
            head.stop()
    print(f"{'phase (median s after POST)':30} {'cold':>7} {'warm':>7} {'saved':>7}")
    medians = {}
    phases = [p for p in (*PHASE_NAMES, CLIENT) if all(p in r for r in runs["cold"] + runs["warm"])]
    for phase in phases:
        cold = statistics.median(r[phase] for r in runs["cold"])
        warm = statistics.median(r[phase] for r in runs["warm"])
        medians[phase] = {"cold": cold, "warm": warm}
        print(f"{phase:30} {cold:7.2f} {warm:7.2f} {cold - warm:7.2f}")
    print(json.dumps({"rounds": rounds, "medians": medians, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
