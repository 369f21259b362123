"""Where the wall time of one small raydock job goes, phase by phase.

    .venv/bin/python -m bench.job_timeline

Starts a Ray head and a server, runs a warm-up job, then a 5-step user-code job, and
prints the time from POST to: Ray job submitted, driver started, first metric stored,
last report, driver's result, SUCCEEDED seen by the API.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

from api.schemas import parse_event
from service.cluster.local_cluster import start_head
from service.cluster.ray_backend import RayBackend
from tests.servers import ServerProcess

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "usercode"


def one_job(http: httpx.Client, backend: RayBackend) -> dict[str, float]:
    spec = {
        "name": "timeline",
        "entrypoint": "userpkg.steps:train",
        "working_dir": str(FIXTURES),
        "config": {"steps": 5},
        "scaling": {"num_workers": 2},
    }
    t0 = time.time()
    job_id = http.post("/v1/jobs", json=spec).raise_for_status().json()["id"]
    marks: dict[str, float] = {}
    while True:
        job = http.get(f"/v1/jobs/{job_id}").json()
        if "first metric stored" not in marks and http.get(f"/v1/jobs/{job_id}/metrics").json():
            marks["first metric stored"] = time.time() - t0
        if job["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            marks[f"{job['status']} in API"] = time.time() - t0
            break
        time.sleep(0.05)
    info = backend.jobs.get_job_info(job["ray_job_id"])
    marks["ray job start"] = info.start_time / 1000 - t0
    marks["ray job end"] = info.end_time / 1000 - t0
    lines = http.get(f"/v1/jobs/{job_id}/logs").text.splitlines()
    events = [
        parse_event(json.loads(line.split("RAYDOCK_EVENT ", 1)[1])) for line in lines if "RAYDOCK_EVENT {" in line
    ]
    for e in events:
        key = {"started": "driver started", "result": "driver result"}.get(e.type)
        if key:
            marks[key] = e.ts - t0
    metric_ts = [e.ts for e in events if e.type == "metric"]
    marks["first report (controller)"] = metric_ts[0] - t0
    marks["last report (controller)"] = metric_ts[-1] - t0
    return dict(sorted(marks.items(), key=lambda kv: kv[1]))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        head = start_head(Path(tmp) / "ray", num_cpus=2)
        server = ServerProcess(Path(tmp) / "server", head.dashboard_url).start()
        try:
            http = httpx.Client(base_url=server.url, timeout=30)
            backend = RayBackend(head.dashboard_url)
            one_job(http, backend)  # warm-up
            marks = one_job(http, backend)
        finally:
            server.stop()
            head.stop()
    print(f"{'phase (seconds after POST)':32} {'t':>7}")
    for name, t in marks.items():
        print(f"{name:32} {t:7.2f}")
    print(json.dumps(marks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
