"""Replicas of the server for tests and benchmarks: real ``raydock serve`` processes on one
PostgreSQL database, pointed at a Ray address where nothing listens (their background
units run; none of them needs Ray to be claimed, held and handed over), with a short
lease TTL; and what their ``GET /v1/replicas`` and ``/metrics`` say."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from bench.harness.jobstore import dead_ray
from bench.harness.servers import ServerProcess

# The units one replica holds at a time (the warm pool's snapshot runs on every replica).
LEASED = ["code-collection", "monitor", "retention", "schedules", "tracking-export", "usage", "webhooks"]


def replica(data_dir: Path, database_url: str, ttl_s: float) -> ServerProcess:
    """A started replica on ``database_url`` (its own data dir and port)."""
    env = {"RAYDOCK_DATABASE_URL": database_url, "RAYDOCK_LEASE_TTL_S": str(ttl_s)}
    return ServerProcess(data_dir, dead_ray(), extra_env=env).start()


def replicas(server: ServerProcess) -> dict:
    r = httpx.get(server.url + "/v1/replicas", timeout=10)
    r.raise_for_status()
    return r.json()


def holder_of(server: ServerProcess) -> str:
    """How ``server`` is named as a holder: host/pid/random."""
    return next(r["id"] for r in replicas(server)["replicas"] if r["id"].split("/")[1] == str(server.proc.pid))


def holders(view: dict) -> dict[str, str | None]:
    """Each leased unit's live holder (None: free or expired)."""
    return {
        lease["name"]: lease["holder"] if lease["expires_in_s"] > 0 else None
        for lease in view["leases"]
        if lease["name"] in LEASED
    }


def tokens(view: dict) -> dict[str, int]:
    return {lease["name"]: lease["token"] for lease in view["leases"] if lease["name"] in LEASED}


def held_by(server: ServerProcess, holder: str) -> bool:
    """Whether every leased unit is held by ``holder``, as ``server`` sees it."""
    return set(holders(replicas(server)).values()) == {holder} and len(holders(replicas(server))) == len(LEASED)


RUNS = re.compile(r'^raydock_background_runs_total\{outcome="(\w+)",unit="([\w-]+)"\} ([0-9.e+]+)$', re.M)


def runs(server: ServerProcess) -> dict[str, float]:
    """Runs of each background unit on ``server`` so far (its /metrics)."""
    r = httpx.get(server.url + "/metrics", timeout=10)
    r.raise_for_status()
    out: dict[str, float] = {}
    for _outcome, unit, n in RUNS.findall(r.text):
        out[unit] = out.get(unit, 0.0) + float(n)
    return out
