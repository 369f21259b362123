"""Overhead of raydock over raw Ray Train and vanilla torch DDP, measured side by side.

    .venv/bin/python -m bench.overhead            # BENCH_STEPS=400 by default

Runs one 2-worker DDP workload (bench/workload.py) on this machine as:
(a) vanilla torch DDP (2 processes, gloo), (b) a raw ``TorchTrainer.fit`` on a Ray
cluster, (c) a raydock job submitted over REST to a server on the same cluster, with
the model wrapped by Ray's ``prepare_model``, (d) the same with workers reniced to 0,
(e) the same job with the model placed by ``trainers.parallel.parallelize`` and stepped
by ``ParallelModel.local_step``, as raydock's built-in loops do. Prints walls,
steady-state step times, their ratios, and POST -> first metric latency on a warm
cluster (a job has run before). The first raydock job runs on the fresh cluster (cold),
(c) on a warm one: their walls, first metrics and start-up phases side by side, and the
ratio of each one's wall to vanilla DDP's (the same short job done by hand).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

from api.schemas.events import PHASE_NAMES
from bench import workload
from bench.harness.servers import ServerProcess
from bench.jobs import run_job
from service.cluster.local_cluster import SINGLE_MACHINE_ENV, free_ports, start_head
from service.cluster.ray_backend import ray_auth_token

BENCH_DIR = Path(__file__).resolve().parent


def vanilla() -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_ports(1)[0]
    t0 = time.perf_counter()
    procs = [ctx.Process(target=workload.vanilla_worker, args=(r, 2, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    result = out.get(timeout=600)
    for p in procs:
        p.join()
    return {"wall_s": time.perf_counter() - t0, **result}


def raw_trainer(gcs_address: str, storage: str) -> dict:
    os.environ.update(SINGLE_MACHINE_ENV)  # the head listens on 127.0.0.1 only; Ray reads this at import
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if ray_auth_token():
        os.environ.setdefault("RAY_AUTH_MODE", "token")  # the head enforces the token in ~/.ray/auth_token
    ray.init(address=gcs_address, log_to_driver=False)
    try:
        t0 = time.perf_counter()
        trainer = TorchTrainer(
            workload.ray_train_loop,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=storage, name=f"raw-{time.time_ns()}"),
        )
        result = trainer.fit()
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    return (
        {"wall_s": wall, **{k: result.metrics.get(k) for k in ("steady_step_s", "nice", "threads")}}
        if result.metrics
        else {"wall_s": wall}
    )


def raydock_job(url: str, **config) -> dict:
    http = httpx.Client(base_url=url, timeout=30)
    spec = {
        "name": "bench",
        "entrypoint": "bench.workload:ray_train_loop",
        "working_dir": str(BENCH_DIR.parent),
        "scaling": {"num_workers": 2},
        "config": config,
    }
    run = run_job(http, spec)
    last = run.points[-1]["metrics"]
    return {
        "wall_s": run.wall_s,
        "first_metric_s": run.first_metric_s,
        "start_phases": run.job.get("start_phases") or {},
        **{k: last.get(k) for k in ("steady_step_s", "nice", "threads")},
    }


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        head = start_head(Path(tmp) / "ray", num_cpus=2)
        server = ServerProcess(Path(tmp) / "server", head.dashboard_url).start()
        try:
            print(f"workload: 2 workers, {workload.STEPS} steps; warming the cluster...", flush=True)
            cold = raydock_job(server.url)  # the first job on the fresh cluster; warms the runtime env cache
            a = vanilla()
            b = raw_trainer(head.gcs_address, str(Path(tmp) / "storage"))
            c = raydock_job(server.url)
            d = raydock_job(server.url, renice=True)
            e = raydock_job(server.url, placement="parallelize")
        finally:
            server.stop()
            head.stop()
    rows = [
        ("(a) vanilla torch DDP", a),
        ("(b) raw TorchTrainer.fit", b),
        ("(c) raydock REST job", c),
        ("(d) (c) + workers at nice 0", d),
        ("(e) (c) via parallelize", e),
    ]
    print(f"\n{'variant':28} {'wall s':>8} {'steady step ms':>15} {'nice':>5} {'threads':>8}")
    for name, r in rows:
        print(
            f"{name:28} {r['wall_s']:8.2f} {1000 * (r.get('steady_step_s') or float('nan')):15.3f} {r.get('nice')!s:>5} {r.get('threads')!s:>8}"
        )
    print()
    print(f"wall (c)/(b)                  {c['wall_s'] / b['wall_s']:.3f}   (target <= 1.05)")
    print(f"steady step (c)/(a)           {c['steady_step_s'] / a['steady_step_s']:.3f}   (target <= 1.05)")
    print(f"steady step (b)/(a)           {b['steady_step_s'] / a['steady_step_s']:.3f}")
    print(f"steady step (d)/(a)           {d['steady_step_s'] / a['steady_step_s']:.3f}")
    print(f"steady step (e)/(a)           {e['steady_step_s'] / a['steady_step_s']:.3f}")
    print(
        f"steady step (e)/(c)           {e['steady_step_s'] / c['steady_step_s']:.3f}   (parallelize vs prepare_model)"
    )
    print(f"POST -> first metric          {c['first_metric_s']:.2f} s (target <= 5 s, warm cluster)")
    print(f"\n{'cold vs warm (raydock job)':28} {'cold':>8} {'warm (c)':>9}")
    print(f"{'wall s':28} {cold['wall_s']:8.2f} {c['wall_s']:9.2f}")
    print(f"{'wall / vanilla DDP wall':28} {cold['wall_s'] / a['wall_s']:8.3f} {c['wall_s'] / a['wall_s']:9.3f}")
    print(f"{'POST -> first metric s':28} {cold['first_metric_s']:8.2f} {c['first_metric_s']:9.2f}")
    for name in PHASE_NAMES:
        cells = [f"{r['start_phases'][name]:8.2f}" if name in r["start_phases"] else f"{'-':>8}" for r in (cold, c)]
        print(f"{'  ' + name:28} {cells[0]} {cells[1]:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
