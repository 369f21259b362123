"""The supervisor of a node's warm process: a detached, named Ray actor per node.

``python -m trainers.zygote.supervisor --socket PATH`` (started in the background by a
cold driver, ``trainers.zygote.pool``) connects to the cluster and creates the actor
``raydock-warm-<node id>`` in namespace ``raydock`` on this node unless it exists. The
actor holds no resources (``num_cpus=0``), so the pool never takes capacity a queued
job needs; it runs the warm process (``trainers.zygote.server``) as its child, starts a
new one when it dies, and exits with it after ``RAYDOCK_WARM_IDLE_S`` without a job.

Each change of the pool's facts (node, started, jobs served, running, idle since) is
printed as one ``RAYDOCK_WARM_POOL {json}`` line on the actor's stdout: the server reads
the latest through the dashboard's log API for ``GET /v1/cluster``, without joining the
cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import ray
from pydantic import ValidationError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from api.cluster_contract import WARM_FACTS_PREFIX, WARM_NAMESPACE, warm_actor_name
from api.schemas.launch import WarmPoolFacts
from trainers.zygote.pool import IDLE_ENV, idle_s
from trainers.zygote.server import ALREADY_SERVED, PATH_TAKEN

POLL_S = 0.5
MAX_RESTARTS_PER_MINUTE = 5


class Supervisor:
    def __init__(self, socket_path: str, idle_timeout_s: float):
        self.socket_path, self.idle_timeout_s = socket_path, idle_timeout_s
        self.stats_path = os.path.join(os.path.dirname(socket_path), "stats.json")
        self.node_id = ray.get_runtime_context().get_node_id()
        self.started = time.time()
        self.restarts: list[float] = []  # start times in the last minute
        self.starts = 0
        self.proc: subprocess.Popen | None = None
        self.facts: dict = {}
        threading.Thread(target=self._keep, name="raydock-warm-keeper", daemon=True).start()

    def ping(self) -> dict:
        return self.facts

    def _spawn(self) -> subprocess.Popen:
        env = dict(os.environ)
        env[IDLE_ENV] = str(self.idle_timeout_s)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.stats_path)
        return subprocess.Popen(
            [sys.executable, "-m", "trainers.zygote.server", "--socket", self.socket_path, "--stats", self.stats_path]
            + ["--parent", str(os.getpid())],
            env=env,
            cwd=os.path.dirname(self.socket_path),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _keep(self) -> None:
        while True:
            if self.proc is None or self.proc.poll() is not None:
                if self.proc is not None and self.proc.returncode == ALREADY_SERVED:
                    self._leave("another warm process serves this node")
                if self.proc is not None and self.proc.returncode == PATH_TAKEN:
                    self._leave(f"another process took the warm socket path {self.socket_path}")
                now = time.time()
                self.restarts = [t for t in self.restarts if now - t < 60] + [now]
                if len(self.restarts) > MAX_RESTARTS_PER_MINUTE:
                    self._leave(f"the warm process died {len(self.restarts)} times in a minute")
                self.proc = self._spawn()
                self.starts += 1
            stats = self._stats()
            self._publish(stats)
            idle_since = stats.get("idle_since")
            if stats.get("running") == 0 and idle_since and time.time() - idle_since > self.idle_timeout_s:
                self._leave(f"idle for {self.idle_timeout_s:.0f}s")
            time.sleep(POLL_S)

    def _stats(self) -> dict:
        try:
            with open(self.stats_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def _publish(self, stats: dict) -> None:
        base = {"node_id": self.node_id, "started": self.started, "restarts": self.starts - 1}
        try:
            facts = WarmPoolFacts(
                **base,
                pid=stats.get("pid"),
                ready=bool(stats),
                jobs_served=stats.get("jobs_served", 0),
                running=stats.get("running", 0),
                idle_since=stats.get("idle_since"),
                idle_timeout_s=self.idle_timeout_s,
            ).model_dump()
        except ValidationError:  # the stats file sits where jobs can write: not ready, rather than facts it made up
            facts = WarmPoolFacts(**base, idle_timeout_s=self.idle_timeout_s).model_dump()
        if facts != self.facts:
            self.facts = facts
            print(WARM_FACTS_PREFIX + json.dumps(facts), flush=True)

    def _leave(self, why: str) -> None:
        print(f"warm pool of node {self.node_id} exits: {why}", flush=True)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
        time.sleep(60)  # the kill ends this process


def start(socket_path: str) -> dict:
    """Create this node's supervisor unless it exists; its facts."""
    node_id = ray.get_runtime_context().get_node_id()
    actor = (
        ray.remote(Supervisor)
        .options(
            name=warm_actor_name(node_id),
            namespace=WARM_NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )
        .remote(socket_path, idle_s())
    )
    return ray.get(actor.ping.remote(), timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="start this node's warm pool")
    parser.add_argument("--socket", required=True)
    args = parser.parse_args(argv)
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), namespace=WARM_NAMESPACE, log_to_driver=False)
    print(json.dumps(start(args.socket)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
