"""The session's warm pool as the warm-start tests see it: the node's warm process, its
folder, and the tiny user-code job that starts it."""

from __future__ import annotations

import json
from pathlib import Path

from api.client import Client
from bench.harness.waiting import wait_for
from service.cluster.local_cluster import LocalHead
from tests.support.specs import user_spec


def pool_dir(head: LocalHead) -> Path:
    return Path(head.temp_dir) / "r" / "session_latest" / "raydock"


def warm_pid(head: LocalHead) -> int | None:
    """The node's warm process, once it listens."""
    try:
        stats = json.loads((pool_dir(head) / "stats.json").read_text())
    except (OSError, ValueError):
        return None
    return stats["pid"] if (pool_dir(head) / "zygote.sock").exists() and is_alive(stats["pid"]) else None


def ensure_warm(client: Client, head: LocalHead) -> int:
    if warm_pid(head) is None and not (pool_dir(head) / "starter.log").exists():
        job = client.submit(tiny())  # no job ran on this cluster yet: this one starts the pool
        job.wait(timeout=180)
    return wait_for(lambda: warm_pid(head), 180, "the node's warm process")


def tiny(**config) -> dict:
    return user_spec("userpkg.steps:train", config={"steps": 2, **config}, scaling={"num_workers": 1})


def is_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
