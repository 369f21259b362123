"""Soak: many small jobs submitted concurrently while training workers and the API
process are killed at random; at the end, count what became of every submission.

    .venv/bin/python -m bench.soak [--jobs 16] [--api-kills 3] [--worker-kills 4] [--seed 0]

Every submission carries an Idempotency-Key and is retried until the server answers
(the API may be down at that moment). Jobs checkpoint every few steps and allow
retries, so a killed worker costs a retry from the last checkpoint. Prints one
`name N` pair per line: submitted, succeeded, failed (with causes), lost, duplicated,
and `extra_ray_jobs`: Ray jobs beyond one per counted attempt (a driver run twice, or
one left running untracked), read from the cluster itself.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.harness.servers import ServerProcess
from service.cluster.local_cluster import _session_pids, start_head

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "usercode"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def job_spec(i: int, run: str) -> dict:
    return {
        "name": f"soak-{i}",
        "labels": {"soak": run},
        "entrypoint": "userpkg.ckpt_steps:train",
        "working_dir": str(FIXTURES),
        "config": {"steps": 12, "every": 3, "sleep_s": 0.2},
        "scaling": {"num_workers": 2},
        "failure": {"max_retries": 3},
    }


def submit_until_accepted(url: str, spec: dict, key: str, deadline: float) -> str | None:
    while time.monotonic() < deadline:
        try:
            r = httpx.post(url + "/v1/jobs", json=spec, headers={"Idempotency-Key": key}, timeout=10)
            if r.status_code in (200, 202):
                return r.json()["id"]
        except httpx.HTTPError:
            pass  # the API is down: retry with the same key
        time.sleep(0.5)
    return None


def train_worker_pids(head_pid: int) -> list[int]:
    """Ray Train workers of this benchmark's own cluster (its head's process session)."""
    pids = []
    for pid in _session_pids(head_pid):
        try:
            if b"RayTrainWorker" in (Path("/proc") / str(pid) / "cmdline").read_bytes():
                pids.append(pid)
        except OSError:
            pass
    return pids


def ray_jobs_by_job(head) -> Counter:
    """Ray jobs per raydock job, from the metadata the server gives each submit."""
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(head.dashboard_url, headers=head.headers).list_jobs()
    return Counter((j.metadata or {}).get("raydock_job") for j in jobs if (j.metadata or {}).get("raydock_job"))


def chaos(
    server: ServerProcess,
    head_pid: int,
    api_kills: int,
    worker_kills: int,
    stop: threading.Event,
    rng: random.Random,
    log: list[str],
) -> None:
    actions = ["api"] * api_kills + ["worker"] * worker_kills
    rng.shuffle(actions)
    for action in actions:
        if stop.wait(rng.uniform(5, 15)):
            return
        if action == "api":
            server.kill()
            time.sleep(rng.uniform(1, 4))
            server.start()
            log.append("api killed and restarted")
        elif pids := train_worker_pids(head_pid):
            pid = rng.choice(pids)
            try:
                os.kill(pid, signal.SIGKILL)
                log.append(f"train worker {pid} killed")
            except OSError:
                pass


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--api-kills", type=int, default=3)
    ap.add_argument("--worker-kills", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1500)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    run = f"r{int(time.time())}"

    with tempfile.TemporaryDirectory() as tmp:
        head = start_head(Path(tmp) / "ray", num_cpus=4)
        server = ServerProcess(Path(tmp) / "server", head.dashboard_url).start()
        stop, chaos_log = threading.Event(), []
        deadline = time.monotonic() + args.timeout
        chaos_thread = threading.Thread(
            target=chaos, args=(server, head.pid, args.api_kills, args.worker_kills, stop, rng, chaos_log)
        )
        chaos_thread.start()
        try:
            with ThreadPoolExecutor(8) as pool:
                keys = [f"{run}-{i}" for i in range(args.jobs)]
                accepted = list(
                    pool.map(
                        lambda i: submit_until_accepted(server.url, job_spec(i, run), keys[i], deadline),
                        range(args.jobs),
                    )
                )
            jobs: list[dict] = []
            while time.monotonic() < deadline:
                try:
                    jobs = httpx.get(
                        server.url + "/v1/jobs", params={"label": f"soak={run}", "limit": 1000}, timeout=10
                    ).json()["items"]
                    if len(jobs) >= len([a for a in accepted if a]) and all(j["status"] in TERMINAL for j in jobs):
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(2)
            ray_jobs = ray_jobs_by_job(head)
        finally:
            stop.set()
            chaos_thread.join()
            server.stop()
            head.stop()

    names = Counter(j["name"] for j in jobs)
    by_status = Counter(j["status"] for j in jobs)
    causes = Counter(j["failure_cause"] for j in jobs if j["status"] == "FAILED")
    recorded = {j["id"] for j in jobs}
    lost = sum(1 for a in accepted if a is None or a not in recorded) + sum(
        1 for j in jobs if j["status"] not in TERMINAL
    )
    print("\n".join(f"# {line}" for line in chaos_log))
    print(f"submitted {args.jobs}")
    print(f"succeeded {by_status['SUCCEEDED']}")
    print(
        f"failed {by_status['FAILED']}" + (f"  ({', '.join(f'{c}: {n}' for c, n in causes.items())})" if causes else "")
    )
    print(f"cancelled {by_status['CANCELLED']}")
    print(f"lost {lost}")
    print(f"duplicated {sum(n - 1 for n in names.values() if n > 1)}")
    print(f"restarts {sum(len(j['restarts']) for j in jobs)}")
    extra = sum(max(0, ray_jobs.get(j["id"], 0) - j["attempt"]) for j in jobs)
    print(f"extra_ray_jobs {extra}")
    return 0 if lost == 0 and extra == 0 and all(n == 1 for n in names.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
