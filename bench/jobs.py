"""Run one raydock job over REST and time it, for the benchmarks that compare a job with
the same work done directly."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


@dataclass
class TimedJob:
    job: dict[str, Any]  # the final record
    points: list[dict[str, Any]]  # its metric series
    first_metric_s: float | None  # POST -> first stored metric
    wall_s: float  # POST -> terminal status


def run_job(http: httpx.Client, spec: dict[str, Any], poll_s: float = 0.05) -> TimedJob:
    """Submit ``spec``, wait for the end, and raise unless it SUCCEEDED."""
    t0 = time.perf_counter()
    job_id = http.post("/v1/jobs", json=spec).raise_for_status().json()["id"]
    first_metric = None
    while True:
        if first_metric is None and http.get(f"/v1/jobs/{job_id}/metrics").json():
            first_metric = time.perf_counter() - t0
        job = http.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in TERMINAL:
            break
        time.sleep(poll_s)
    wall = time.perf_counter() - t0
    if job["status"] != "SUCCEEDED":
        raise RuntimeError(f"job {spec.get('name', '')} {job['status']}: {job.get('error')}")
    return TimedJob(job, http.get(f"/v1/jobs/{job_id}/metrics").json(), first_metric, wall)
