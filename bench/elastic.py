"""How fast capacity reaches an elastic job, and how fast it recovers from a lost node.

    .venv/bin/python -m bench.elastic [--max-workers 2] [--resize-check-s 5]

Starts an autoscaling Ray cluster on this machine (Ray's fake multi-node provider: a
head with no CPUs, worker nodes of 1 CPU added and removed by the autoscaler) and a
raydock server, then submits an elastic digits job ``{min: 1, max: N}``. Nothing can
train until the autoscaler adds nodes, so it prints, from the submit:

- each worker node joining the cluster,
- the first training step (first report) and the world size it ran at,
- the first report of the grown worker group (world size N).

Then it kills one worker node's raylet (SIGKILL; its workers and agents go with it)
while the job trains and prints, from the kill: the worker failure reaching the job,
the restarted worker group and its size, and the first report after the loss. (The
fake provider keeps a killed node on its books, so the autoscaler does not replace it.)

Ray's defaults except the autoscaler loop period (1 s). After a loss Ray Train restarts
the group at once, sized from the nodes Ray still lists as alive; until Ray's health
checks mark the lost node dead that includes it, and such a start waits out
``RAYDOCK_WORKER_START_TIMEOUT_S`` (default 60 s) before the next one fits what is left.
``--worker-start-timeout-s`` sets it for this run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import httpx

from bench.harness.clusters import start_fake_autoscaling_head
from bench.harness.servers import ServerProcess
from service.cluster.local_cluster import _session_pids


class Timeline:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, float]] = []

    def mark(self, phase: str, what: str, seconds: float) -> None:
        self.rows.append((phase, what, seconds))
        print(f"  {phase:<8} {what:<48} {seconds:7.1f} s", flush=True)


def node_processes(head_session: int, node_id: str) -> list[int]:
    """The raylet and agents of one fake node: processes of the head's session whose
    command line names the node."""
    pids = []
    for pid in _session_pids(head_session):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if node_id in cmdline:
            pids.append(pid)
    return pids


def poll(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(interval)
    raise SystemExit(f"gave up after {timeout:g}s waiting for {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--max-workers", type=int, default=2, help="worker nodes the autoscaler may add, and the job's max"
    )
    parser.add_argument("--resize-check-s", type=float, default=5.0, help="the job's scaling.resize_check_interval_s")
    parser.add_argument(
        "--worker-start-timeout-s", type=float, default=None, help="RAYDOCK_WORKER_START_TIMEOUT_S for the server"
    )
    parser.add_argument(
        "--keep", action="store_true", help="print the Train controller's decisions and keep the work directory"
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="rdk-bench-elastic-"))
    started = time.monotonic()
    head, config = start_fake_autoscaling_head(
        work / "ray", worker_cpus=1, max_workers=args.max_workers, idle_timeout_s=30
    )
    env = {"RAYDOCK_AUTOSCALER_CONFIG": str(config)}
    if args.worker_start_timeout_s is not None:
        env["RAYDOCK_WORKER_START_TIMEOUT_S"] = str(args.worker_start_timeout_s)
    server = ServerProcess(work / "server", head.dashboard_url, extra_env=env)
    try:
        server.start()
        print(
            f"cluster and server up in {time.monotonic() - started:.1f} s (head {head.dashboard_url}, pid {head.pid})"
        )
        run(httpx.Client(base_url=server.url, timeout=30), head.pid, args)
    finally:
        server.stop()
        head.stop()
        shutil.rmtree(head.temp_dir, ignore_errors=True)
        if args.keep:
            print(f"work directory (server database and logs, Ray's config): {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(http: httpx.Client, head_session: int, args) -> None:
    n = args.max_workers
    head_id = next(x["node_id"] for x in http.get("/v1/cluster").json()["nodes"] if x["is_head"])

    def workers_alive() -> list[str]:
        return [x["node_id"] for x in http.get("/v1/cluster").json()["nodes"] if x["alive"] and x["node_id"] != head_id]

    def reports() -> list[dict]:
        return http.get(f"/v1/jobs/{job_id}/metrics").json()

    def groups() -> list[dict]:
        return http.get(f"/v1/jobs/{job_id}/worker-groups").json()

    spec = {
        "name": "bench-elastic",
        "model": {"type": "mlp", "hidden_sizes": [64]},
        "batch_size": 32,
        "epochs": 100_000,  # trains until cancelled
        "scaling": {"num_workers": {"min": 1, "max": n}, "resize_check_interval_s": args.resize_check_s},
    }
    t = Timeline()
    print(f"\ngrowth: elastic job {{min: 1, max: {n}}} on a cluster with no worker nodes")
    t0 = time.time()
    job_id = http.post("/v1/jobs", json=spec).raise_for_status().json()["id"]
    seen_nodes = 0
    while seen_nodes < n:
        alive = poll(lambda: len(workers_alive()) > seen_nodes and workers_alive(), 600, "a worker node")
        for _ in range(len(alive) - seen_nodes):
            seen_nodes += 1
            t.mark("growth", f"worker node {seen_nodes} joined", time.time() - t0)
    start = poll(groups, 600, "the first worker group")[0]
    t.mark("growth", f"first worker group started (world size {start['world_size']})", start["ts"] - t0)
    first = poll(reports, 600, "the first report")[0]
    t.mark("growth", f"first training step (world size {first['metrics']['world_size']})", first["ts"] - t0)
    grown = poll(lambda: [p for p in reports() if p["metrics"]["world_size"] == n], 600, f"a report from {n} workers")[
        0
    ]
    group = next(g for g in groups() if g["world_size"] == n)
    if group["seq"] != start["seq"]:
        t.mark("growth", f"worker group of {n} started", group["ts"] - t0)
    t.mark("growth", f"first training step on {n} workers", grown["ts"] - t0)

    print(f"\nloss: SIGKILL one worker node's raylet while the job trains on {n}")
    victim = group["nodes"][-1]["node_id"]  # the last rank's node
    pids = node_processes(head_session, victim)
    t1 = time.time()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    job = poll(lambda: (j := http.get(f"/v1/jobs/{job_id}").json())["restarts"] and j, 600, "the worker failure")
    t.mark("loss", "worker failure recorded", job["restarts"][-1]["at"] - t1)
    regroup = poll(lambda: [g for g in groups() if g["ts"] > t1], 600, "a restarted worker group")[0]
    t.mark("loss", f"worker group restarted (world size {regroup['world_size']})", regroup["ts"] - t1)
    resumed = poll(lambda: [p for p in reports() if p["ts"] > regroup["ts"]], 600, "a report after the loss")[0]
    t.mark(
        "loss",
        f"first training step after the loss (world size {resumed['metrics']['world_size']})",
        resumed["ts"] - t1,
    )
    http.post(f"/v1/jobs/{job_id}/cancel")
    poll(lambda: http.get(f"/v1/jobs/{job_id}").json()["status"] == "CANCELLED", 120, "the job to stop")
    print(f"\nkilled node {victim[-8:]}: {len(pids)} process(es) naming it (its raylet; its workers and agents follow)")
    if args.keep:
        print("controller decisions, in order:")
        for line in http.get(f"/v1/jobs/{job_id}/logs").text.splitlines():
            if any(k in line for k in ("Detected", "timed out after", "[FailurePolicy]", "Attempting to start")):
                print("   ", line.split("m ", 1)[-1][:160])


if __name__ == "__main__":
    main()
