"""How long a checkpoint stops training, written in the loop's thread (``checkpoint.upload:
sync``) against a CPU snapshot uploaded behind it (``async``), beside the issue's targets.

    PYTHONPATH=. python bench/checkpoint_upload.py [--steps 24] [--every 8] [--skip-jobs]

Three tables, each row ``what | figure | target | ok/FAIL`` (``bench/figures.py``):

1. blocked per checkpoint: the built-in GPT at two sizes on CPU, 2 gloo workers, DDP,
   training with a checkpoint every ``--every`` steps through ``trainers.checkpoint_writer``
   exactly as ``trainers.reporter`` drives it (async: wait for the pending write, snapshot,
   write in a thread); to a local folder and to moto's S3 server. Target: async blocks
   <= 1 s or <= 10% of sync. Async's figure includes waiting for the previous upload
   when checkpoints come faster than uploads finish (printed apart).
2. upload throughput to the S3 endpoint: one 32 MiB object through pyarrow, and the
   checkpoint bytes per second of the async writes.
3. a whole job's wall time (``trainers.ranks.RankRunner``: the local-ranks driver, 2
   ranks, the small GPT, a checkpoint every ``--every`` steps), local against S3, sync
   against async. No target: the figures say what a checkpoint cadence costs.

What moto does not emulate: it keeps objects in memory in the same machine, so an
"upload" is a loopback copy with no network bandwidth, latency or throttling (a real
store's figures for sync are worse, which is the case async is for); its multipart
uploads fail beyond ~256 MiB at pyarrow's default request timeout (a real store takes
them); there is no durability or consistency window to wait out. Figures measured on a
loaded machine move with the load: compare rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from bench.figures import ROWS, row
from bench.harness.parallel import run_workers

SIZES = {  # the built-in GPT at two sizes a CPU trains in seconds per step
    "gpt-small": {"n_layer": 2, "n_head": 2, "d_model": 128, "seq_len": 64},
    "gpt-medium": {"n_layer": 6, "n_head": 6, "d_model": 384, "seq_len": 64},
}
BUCKET = "raydock-bench"
BLOCK_TARGET_S = 1.0
BLOCK_TARGET_SHARE = 0.10


def spec_of(size: str, steps: int, every: int, upload: str = "sync") -> dict:
    return {
        "name": f"bench-{size}",
        "model": {"type": "gpt", **SIZES[size]},
        "data": {"source": "text"},
        "optimizer": {"name": "adamw", "lr": 1e-3},
        "batch_size": 8,
        "max_steps": steps,
        "seed": 0,
        "scaling": {"num_workers": 2},
        "checkpoint": {"every_n_steps": every, "keep": 2, "upload": upload},
    }


def blocked_worker(rank, world_size, size, steps, every, base, env, mode):
    """Train ``steps`` steps, checkpointing every ``every``; the seconds each checkpoint
    held the loop, the seconds each write took, and the bytes written."""
    os.environ.update(env)
    from api import object_store
    from api.schemas import TrainSpec
    from trainers import checkpoint, checkpoint_writer
    from trainers.lm_loop import TextBatches, gpt_config
    from trainers.models.gpt import build_gpt
    from trainers.parallel import build_mesh, parallelize
    from trainers.skeleton import optimizer_factory

    spec = TrainSpec.model_validate(spec_of(size, steps, every))
    pm = parallelize(
        build_gpt(gpt_config(spec.model), seed=0),
        build_mesh(spec.parallelism),
        spec.parallelism,
        optimizer_factory=optimizer_factory(spec),
    )
    data = TextBatches(spec, pm)
    fs, root = object_store.filesystem(base)
    group = checkpoint_writer.writer_group()
    blocked, waited, writes, sizes = [], [], [], []
    pending: threading.Thread | None = None
    for number in range(1, steps + 1):
        pm.local_step(*data.batch(data.train, number - 1))
        if number % every:
            continue
        t0 = time.perf_counter()
        if pending is not None:
            pending.join()  # one write in flight, as trainers.reporter keeps it
        waited.append(time.perf_counter() - t0)
        snap = checkpoint_writer.snapshot(pm, checkpoint.describe(spec, pm, epoch=0), group)
        dest = f"{root.rstrip('/')}/{mode}-{size}-{number}"

        def write(snap=snap, dest=dest) -> None:
            w0 = time.perf_counter()
            files = checkpoint_writer.write(snap, fs, dest)
            writes.append(time.perf_counter() - w0)
            sizes.append(sum(files.values()))

        if mode == "sync":
            write()
        else:
            pending = threading.Thread(target=write)
            pending.start()
        blocked.append(time.perf_counter() - t0)
    if pending is not None:
        pending.join()
    return {"blocked": blocked, "waited": waited, "writes": writes, "bytes": sizes}


def blocked_table(args, stores: dict[str, tuple[str, dict]]) -> dict[str, float]:
    print("\n# 1. seconds the step loop is blocked per checkpoint (median over the run)")
    rates = {}
    for size in SIZES:
        for store, (base_of, env) in stores.items():
            medians = {}
            for mode in ("sync", "async"):
                base = base_of()
                r = run_workers(blocked_worker, 2, size, args.steps, args.every, base, env, mode, timeout_s=1200)
                medians[mode] = _median_of_slowest(r, "blocked")
                if mode == "async" and store == "s3":
                    rates[size] = sum(r[0]["bytes"]) / max(sum(r[0]["writes"]), 1e-9)
                total = r[0]["bytes"][-1]
                row(
                    f"{size} {store} {mode}: blocked per checkpoint ({total / 2**20:.1f} MiB)",
                    f"{medians[mode]:.3f} s",
                    "-",
                    True,
                )
                if mode == "async":
                    wait = _median_of_slowest(r, "waited")
                    row(f"{size} {store} async: of which waiting for the previous upload", f"{wait:.3f} s", "-", True)
            bound = max(BLOCK_TARGET_S, BLOCK_TARGET_SHARE * medians["sync"])
            row(
                f"{size} {store}: async blocked / sync blocked",
                f"{medians['async']:.3f} s / {medians['sync']:.3f} s = {medians['async'] / medians['sync']:.0%}",
                f"<= {BLOCK_TARGET_S:g} s or <= {BLOCK_TARGET_SHARE:.0%}",
                medians["async"] <= bound,
            )
    return rates


def _median_of_slowest(results: list[dict], key: str) -> float:
    """The median over checkpoints of the slowest worker's figure (a report waits for it)."""
    return statistics.median(max(w[key][i] for w in results) for i in range(len(results[0][key])))


def throughput_table(base: str, rates: dict[str, float]) -> None:
    import pyarrow.fs as pafs

    print("\n# 2. upload throughput to the S3 endpoint (moto)")
    fs, root = pafs.FileSystem.from_uri(base)
    blob = os.urandom(32 << 20)
    t0 = time.perf_counter()
    with fs.open_output_stream(f"{root}/throughput.bin") as out:
        out.write(blob)
    seconds = time.perf_counter() - t0
    row("one 32 MiB object through pyarrow", f"{len(blob) / 2**20 / seconds:.1f} MiB/s", "-", True)
    for size, rate in rates.items():
        row(f"{size}: async checkpoint writes (write + upload + verify)", f"{rate / 2**20:.1f} MiB/s", "-", True)


RUN_JOB = """
import json, sys, time
from api.schemas import TrainSpec
from trainers.ranks import RankRunner
spec = TrainSpec.model_validate(json.loads(sys.argv[1]))
t0 = time.perf_counter()
RankRunner(spec, sys.argv[2], sys.argv[3]).fit()
print("WALL", time.perf_counter() - t0)
"""


def job_table(args, stores: dict[str, tuple[str, dict]]) -> None:
    print(f"\n# 3. a job's wall time, {args.steps} steps, a checkpoint every {args.every} (gpt-small, 2 local ranks)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for store, (base_of, env) in stores.items():
        for mode in ("sync", "async"):
            spec = json.dumps(spec_of("gpt-small", args.steps, args.every, mode))
            done = subprocess.run(
                [sys.executable, "-c", RUN_JOB, spec, f"bench-{mode}", base_of()],
                env={**os.environ, **env, "PYTHONPATH": root},
                capture_output=True,
                text=True,
                timeout=1200,
            )
            wall = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("WALL ")]
            figure = f"{float(wall[0]):.1f} s" if wall else f"failed: {done.stderr[-300:]}"
            row(f"job wall time, {store}, {mode}", figure, "-", bool(wall))


def start_moto() -> tuple[subprocess.Popen, dict]:
    from service.cluster.local_cluster import free_ports

    port = free_ports(1)[0]
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    env = {
        "AWS_ACCESS_KEY_ID": "raydock-bench",
        "AWS_SECRET_ACCESS_KEY": "raydock-bench",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
    }
    import boto3
    import httpx

    for _ in range(200):
        try:
            httpx.get(endpoint, timeout=2)
            break
        except httpx.TransportError:
            time.sleep(0.1)
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    ).create_bucket(Bucket=BUCKET)
    return proc, env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--every", type=int, default=8, help="steps between checkpoints")
    parser.add_argument("--skip-jobs", action="store_true", help="leave out table 3")
    args = parser.parse_args()
    moto, env = start_moto()
    os.environ.update(env)
    try:
        with tempfile.TemporaryDirectory(prefix="raydock-bench-ckpt-") as tmp:
            stores = {
                "local": (lambda: os.path.join(tmp, uuid.uuid4().hex[:8]), {}),
                "s3": (lambda: f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}", env),
            }
            print("what | figure | target | ok/FAIL")
            rates = blocked_table(args, stores)
            throughput_table(f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}", rates)
            if not args.skip_jobs:
                job_table(args, stores)
    finally:
        moto.terminate()
        moto.wait(15)
    return sum(1 for *_, ok in ROWS if not ok)


if __name__ == "__main__":
    sys.exit(main())
