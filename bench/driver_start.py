"""What the warm process saves per job: a driver's start, cold against forked, no Ray.

    .venv/bin/python -m bench.driver_start        # BENCH_ROUNDS=5 by default

Starts a warm process (``trainers.zygote.server``) on a socket laid out as a Ray
session dir's, then alternates the job entrypoint (``python -m trainers.zygote.client
train``) cold (``RAYDOCK_WARM_START=0``: a new Python importing torch, ray.train and the
driver) and warm (forked). The driver is given no job, so it ends right after its
imports: the wall time is the entrypoint's start-up. Prints each run and the medians.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainers.zygote.protocol import socket_path

REPO = Path(__file__).resolve().parent.parent


def entrypoint(session: Path, cold: bool) -> tuple[float, bool]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAYDOCK_WARM_START": "0" if cold else "1"}
    log = session / "logs" / f"job-driver-{time.monotonic_ns()}.log"
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        subprocess.run([sys.executable, "-m", "trainers.zygote.client", "train"], env=env, stdout=out, stderr=out)
    return time.perf_counter() - t0, "warm start, driver" in log.read_text()


def main() -> int:
    rounds = int(os.environ.get("BENCH_ROUNDS", "5"))
    with tempfile.TemporaryDirectory() as tmp:
        session = Path(tmp)
        (session / "logs").mkdir()
        path = socket_path(str(session))
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        warm = subprocess.Popen([sys.executable, "-m", "trainers.zygote.server", "--socket", path], env=env, cwd=tmp)
        try:
            while not os.path.exists(path):
                time.sleep(0.1)
            runs: dict[str, list[float]] = {"cold": [], "warm": []}
            for _ in range(rounds):
                for mode in ("cold", "warm"):
                    took, forked = entrypoint(session, cold=mode == "cold")
                    assert forked == (mode == "warm"), f"a {mode} run was not {mode}"
                    runs[mode].append(took)
                    print(f"{mode} {took:.3f}s", flush=True)
        finally:
            warm.terminate()
            warm.wait(30)
    cold, fork = statistics.median(runs["cold"]), statistics.median(runs["warm"])
    print(f"median entrypoint start-up: cold {cold:.3f}s, warm {fork:.3f}s, saved {cold - fork:.3f}s per job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
