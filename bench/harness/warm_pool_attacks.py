"""Jobs that create actors named like the warm pool's and fill their logs, for the listing
test (tests/test_warm_pool_listing.py) and its figures (bench/abuse_cluster.py). Needs a Ray
cluster: each helper runs a driver of its own against it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import httpx

from service.cluster.local_cluster import SINGLE_MACHINE_ENV, LocalHead

SQUAT = r"""
import json, os, sys, ray
ray.init(address=os.environ["RAY_ADDRESS"], namespace="raydock", log_to_driver=False)
node = ray.get_runtime_context().get_node_id()

@ray.remote(num_cpus=0)
class Squatter:
    def fill(self, mib):
        facts = {"node_id": "planted", "ready": True, "pid": os.getpid(), "pad": "a" * (1 << 20)}
        for _ in range(mib):
            print("RAYDOCK_WARM_POOL " + json.dumps(facts), flush=True)
        return os.getpid()

names = ["raydock-warm-" + os.urandom(28).hex() for _ in range(int(sys.argv[1]))]
try:
    ray.get_actor("raydock-warm-" + node, namespace="raydock")
except ValueError:
    names.append("raydock-warm-" + node)  # no pool on this node yet: take its exact name too
actors = [Squatter.options(name=n, lifetime="detached").remote() for n in names]
ray.get([a.fill.remote(int(sys.argv[2])) for a in actors])
print("SQUATTED " + json.dumps(names), flush=True)
"""

KILL = r"""
import json, os, sys, ray
ray.init(address=os.environ["RAY_ADDRESS"], namespace="raydock", log_to_driver=False)
for name in json.loads(sys.argv[1]):
    try:
        ray.kill(ray.get_actor(name, namespace="raydock"), no_restart=True)
    except ValueError:
        pass
"""


def ray_driver(head: LocalHead, code: str, *args: str) -> str:
    env = {**os.environ, **SINGLE_MACHINE_ENV, "RAY_ADDRESS": head.gcs_address}
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def log_figures(url: str) -> tuple[float, float] | None:
    """(log reads, log bytes) the server counted; None when it counts none."""
    text = httpx.get(url + "/metrics").text
    reads = re.search(r"^raydock_warm_pool_log_reads_total (\S+)$", text, re.M)
    read_bytes = re.search(r"^raydock_warm_pool_log_bytes_total (\S+)$", text, re.M)
    return (float(reads.group(1)), float(read_bytes.group(1))) if reads and read_bytes else None


def squat(head: LocalHead, lookalikes: int, mib: int) -> list[str]:
    """Create look-alike pool actors (and the node's exact name when no pool holds it), each
    logging ``mib`` lines of 1 MiB; their names."""
    said = ray_driver(head, SQUAT, str(lookalikes), str(mib))
    return json.loads(next(line for line in said.splitlines() if line.startswith("SQUATTED "))[len("SQUATTED ") :])


def unsquat(head: LocalHead, names: list[str]) -> None:
    ray_driver(head, KILL, json.dumps(names))
