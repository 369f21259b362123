"""POST -> first metric of a 2-worker job, local ranks against Ray Train's worker actors.

    PYTHONPATH=$PWD .venv/bin/python -m bench.local_ranks [--repeats 3]

Starts one Ray head (2 CPUs) and two servers on it, one with ``RAYDOCK_LOCAL_RANKS=false``
(the controller and worker actors) and one with it on (ranks forked from the driver),
warms each up with one job, then runs the built-in digits MLP job and the user-code
fixture job (``userpkg.steps``) alternately on each, and prints the median seconds from
POST to: the driver's start, the worker group's start, the first metric as the job
reported it, and the first metric stored by the API. ``PYTHONPATH`` makes the head's
drivers import this checkout's ``trainers``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from api.schemas import parse_event
from bench.harness.servers import ServerProcess
from bench.job_timeline import SPECS
from service.cluster.local_cluster import start_head

JOBS = {"digits mlp": SPECS["builtin"], "user code": SPECS["user"]}  # the jobs bench.job_timeline times


def one_job(http: httpx.Client, spec: dict) -> dict[str, float]:
    t0 = time.time()
    job_id = http.post("/v1/jobs", json=spec).raise_for_status().json()["id"]
    marks: dict[str, float] = {}
    while True:
        job = http.get(f"/v1/jobs/{job_id}").json()
        if "first metric stored" not in marks and http.get(f"/v1/jobs/{job_id}/metrics").json():
            marks["first metric stored"] = time.time() - t0
        if job["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        time.sleep(0.05)
    if job["status"] != "SUCCEEDED":
        raise RuntimeError(f"job {job_id} {job['status']}: {job['error']}")
    lines = http.get(f"/v1/jobs/{job_id}/logs").text.splitlines()
    events = [parse_event(json.loads(x.split("RAYDOCK_EVENT ", 1)[1])) for x in lines if "RAYDOCK_EVENT {" in x]
    names = {"started": "driver started", "worker_group": "workers up", "metric": "first metric reported"}
    for e in events:
        if (name := names.get(e.type)) and name not in marks:
            marks[name] = e.ts - t0
    return marks


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        head = start_head(Path(tmp) / "ray", num_cpus=2)
        servers = {
            "worker actors": ServerProcess(
                Path(tmp) / "cold", head.dashboard_url, extra_env={"RAYDOCK_LOCAL_RANKS": "false"}
            ).start(),
            "local ranks": ServerProcess(
                Path(tmp) / "local", head.dashboard_url, extra_env={"RAYDOCK_LOCAL_RANKS": "true"}
            ).start(),
        }
        try:
            clients = {mode: httpx.Client(base_url=s.url, timeout=30) for mode, s in servers.items()}
            for http in clients.values():
                one_job(http, JOBS["user code"])  # warm-up: the head's first job pays for its caches
            for _ in range(args.repeats):
                for kind, spec in JOBS.items():
                    for mode, http in clients.items():
                        marks = one_job(http, spec)
                        results.setdefault((kind, mode), []).append(marks)
                        print(
                            f"{kind:11} {mode:14} {json.dumps({k: round(v, 2) for k, v in marks.items()})}", flush=True
                        )
        finally:
            for s in servers.values():
                s.stop()
            head.stop()
    columns = ["driver started", "workers up", "first metric reported", "first metric stored"]
    print(f"\nmedian seconds after POST ({args.repeats} runs each)")
    print(f"{'job':11} {'path':14} " + " ".join(f"{c:>22}" for c in columns))
    for (kind, mode), runs in results.items():
        cells = [statistics.median(r[c] for r in runs) if all(c in r for r in runs) else float("nan") for c in columns]
        print(f"{kind:11} {mode:14} " + " ".join(f"{v:22.2f}" for v in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
