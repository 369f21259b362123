"""Warm starts on the session's Ray cluster: a job's driver forked from its node's warm
process, the pool in GET /v1/cluster, a killed warm process replaced, a cancelled warm
job leaving no process, and a job in another Python started cold.

The first job of a session starts the pool (cold); ``warm_pool`` waits until the node's
warm process listens, so these tests see it whatever ran before them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

from api.client import Client
from bench.harness.waiting import wait_for
from service.cluster.local_cluster import LocalHead
from service.cluster.ray_backend import WARM_ENTRYPOINTS, RayBackend
from tests.support.warm import ensure_warm, is_alive, tiny, warm_pid

WARM_LINE = re.compile(r"raydock: warm start, driver (\d+) forked from warm process (\d+)")
REPO = Path(__file__).resolve().parent.parent


def test_a_job_is_forked_from_the_warm_process_and_the_pool_shows_it(client: Client, ray_head: LocalHead):
    zygote = ensure_warm(client, ray_head)
    job = client.submit(tiny())
    job.wait(timeout=180)
    assert job.status.value == "SUCCEEDED", job.info.error
    assert [m.metrics["step"] for m in job.metrics()] == [1, 2]
    forked = WARM_LINE.search(job.logs())
    assert forked and int(forked.group(2)) == zygote, job.logs()[-2000:]
    assert not is_alive(int(forked.group(1)))  # the driver's process ended with the job
    # GET /v1/cluster shows the monitor's snapshot of the pool (refreshed every 10 s).
    pool = wait_for(
        lambda: [p for p in client.cluster().warm_pool if p.running == 0 and p.jobs_served >= 1],
        30,
        "the pool at rest after the job",
    )
    assert len(pool) == 1 and pool[0].ready and pool[0].pid == zygote and pool[0].jobs_served >= 1
    assert pool[0].idle_since is not None and pool[0].idle_timeout_s == 600


def test_a_killed_warm_process_is_replaced_and_jobs_still_run(client: Client, ray_head: LocalHead):
    killed = ensure_warm(client, ray_head)
    os.kill(killed, signal.SIGKILL)
    job = client.submit(tiny())  # cold or warm, whichever the pool can give at that moment
    job.wait(timeout=180)
    assert job.status.value == "SUCCEEDED", job.info.error
    replaced = wait_for(lambda: (pid := warm_pid(ray_head)) not in (None, killed) and pid, 180, "a new warm process")
    wait_for(
        lambda: [p.restarts >= 1 and p.pid == replaced for p in client.cluster().warm_pool] == [True],
        30,
        "the pool listing the new warm process",
    )
    job = client.submit(tiny())
    job.wait(timeout=180)
    assert job.status.value == "SUCCEEDED", job.info.error
    assert (forked := WARM_LINE.search(job.logs())) and int(forked.group(2)) == replaced


def test_a_cancelled_warm_job_leaves_no_process(client: Client, ray_head: LocalHead):
    ensure_warm(client, ray_head)
    job = client.submit(tiny(steps=10_000, sleep_s=0.2))
    wait_for(lambda: job.metrics(), 180, "the job's first metric")
    # Its reports come pushed; its log is tailed from Ray a little later.
    forked = wait_for(lambda: WARM_LINE.search(job.logs()), 30, "the warm-start line in its log")
    driver = int(forked.group(1))
    job.cancel()
    job.wait(timeout=60)
    assert job.status.value == "CANCELLED"
    wait_for(lambda: not is_alive(driver) and not _group(driver), 60, "the driver and its process group gone")
    wait_for(lambda: [p.running for p in client.cluster().warm_pool] == [0], 30, "the pool with no job running")


def test_a_job_in_another_python_starts_cold_and_succeeds(ray_head: LocalHead, tmp_path):
    """A job whose ``python`` is another environment's (as with runtime_env pip or uv)
    is refused by the warm process before anything runs, and runs the cold driver."""
    zygote = wait_for(lambda: warm_pid(ray_head), 180, "the node's warm process")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site_dir = next((venv / "lib").glob("python3*/site-packages"))
    (site_dir / "parent.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    backend = RayBackend(ray_head.dashboard_url, auth_token=ray_head.auth_token())
    spec = tiny()
    spec.pop("working_dir")
    env = {
        "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
        "PYTHONPATH": f"{REPO / 'tests' / 'fixtures' / 'usercode'}:{REPO}",
        "RAYDOCK_JOB_ID": "other-python",
        "RAYDOCK_JOB_SPEC": json.dumps(spec),
        "RAYDOCK_STORAGE_PATH": str(tmp_path / "storage"),
    }
    sid = backend.jobs.submit_job(entrypoint=WARM_ENTRYPOINTS["train"], runtime_env={"env_vars": env})
    wait_for(lambda: backend.state(sid).status in ("SUCCEEDED", "FAILED", "STOPPED"), 180, "the Ray job's end")
    logs = backend.logs(sid)
    assert backend.state(sid).status == "SUCCEEDED", logs[-3000:]
    assert "warm start refused (another Python" in logs and not WARM_LINE.search(logs)
    assert '"type": "result"' in logs.replace("'", '"') or "RAYDOCK_EVENT" in logs
    assert warm_pid(ray_head) == zygote  # the warm process is still there for the next job


def _group(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().split(") ", 1)[1].split()
            except (FileNotFoundError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry))
    return members
