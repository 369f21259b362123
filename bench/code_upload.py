"""What uploading a job's code costs, and what runtime_env.pip adds to a job's start.

    .venv/bin/python -m bench.code_upload          # BENCH_FILES=1000 BENCH_MB=8 by default

On a Ray head and server of its own: packs a synthetic project (BENCH_FILES small
modules plus BENCH_MB of incompressible text), uploads it, submits it again unchanged
(the server has it: nothing is sent), then times the same tiny user-code job without
`runtime_env.pip`, with a pinned requirement on a node that never installed it (a new
environment), and again (the node's cached environment).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

from api.client import Client
from api.code_package import build_package
from bench.harness.servers import ServerProcess
from bench.jobs import run_job
from service.cluster.local_cluster import start_head

FILES = int(os.environ.get("BENCH_FILES", "1000"))
MB = int(os.environ.get("BENCH_MB", "8"))
LOOP = "import ray.train\n\ndef main(config):\n    ray.train.report({'step': 1})\n"
PIP = ["text-unidecode==1.3"]


def make_project(root: Path) -> Path:
    pkg = root / "code" / "benchpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "loop.py").write_text(LOOP)
    for i in range(FILES):
        (pkg / f"m{i:05d}.py").write_text(f"VALUE_{i} = {i}\n" + "# filler line of a module\n" * 150)
    (root / "code" / "vocab.txt").write_bytes(os.urandom(MB * 2**20))
    return root / "code"


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        code = make_project(Path(tmp) / "project")
        head = start_head(Path(tmp) / "ray", num_cpus=2)
        server = ServerProcess(Path(tmp) / "server", head.dashboard_url, extra_env={"RAYDOCK_CODE_ROOT": ""}).start()
        try:
            package, pack_s = timed(lambda: build_package(code, max_bytes=2**30, max_files=10**6))
            package.discard()
            with Client(server.url) as client:
                first, first_s = timed(lambda: client.upload_code(code))
                second, second_s = timed(lambda: client.upload_code(code))
                http = httpx.Client(base_url=server.url, timeout=30)
                spec = {
                    "name": "bench-code",
                    "entrypoint": "benchpkg.loop:main",
                    "code": first.ref,
                    "scaling": {"num_workers": 1},
                }
                run_job(http, spec)  # warm-up: the node unpacks the package once
                plain = run_job(http, spec)
                cold = run_job(http, {**spec, "runtime_env": {"pip": PIP}})
                warm = run_job(http, {**spec, "runtime_env": {"pip": PIP}})
        finally:
            server.stop()
            head.stop()
    print(
        f"\nproject: {first.files} files, {first.content_bytes / 2**20:.1f} MiB; zip {first.size_bytes / 2**20:.1f} MiB"
    )
    print(f"{'step':44} {'seconds':>8} {'sent MiB':>9}")
    print(f"{'pack (deterministic zip + sha256)':44} {pack_s:8.2f}")
    print(f"{'first submit: pack + upload':44} {first_s:8.2f} {first.sent_bytes / 2**20:9.2f}   status {first.status}")
    print(
        f"{'second submit, unchanged: pack + HEAD':44} {second_s:8.2f} {second.sent_bytes / 2**20:9.2f}   status {second.status} (target: 0 MiB sent)"
    )
    print(f"{'job, no pip: POST -> SUCCEEDED':44} {plain.wall_s:8.2f}")
    print(
        f"{'job, pip ' + PIP[0] + ', new env':44} {cold.wall_s:8.2f}   (+{cold.wall_s - plain.wall_s:.1f} s: the start cost of a new requirement list)"
    )
    print(f"{'job, pip ' + PIP[0] + ', cached env':44} {warm.wall_s:8.2f}   (+{warm.wall_s - plain.wall_s:.1f} s)")
    return 0 if second.sent_bytes == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
