"""Look-alike warm-pool actors against ``GET /v1/cluster``, measured against their bounds.

    .venv/bin/python -m bench.abuse_cluster

Unlike the other abuse benches this one needs Ray: it starts a Ray head of its own (on
free ports, token auth) and a server on it, then has a job create actors named like the
warm pool's (``raydock-warm-<anything>``, and the node's exact name when no pool holds
it), each logging megabytes (harness/warm_pool_attacks.py). One row per figure,
``what | figure | bound | ok/FAIL``:

- entries ``GET /v1/cluster`` lists beside the live nodes (one per look-alike before);
- bytes the server read of pool logs per refresh (each whole log's last 200 lines before);
- the server's resident memory after refreshes and GETs, beside before the actors.

``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx

from bench.figures import row, run_attacks
from bench.harness.servers import ServerProcess
from bench.harness.warm_pool_attacks import log_figures, squat, unsquat
from service.cluster.local_cluster import ensure_token, start_head
from service.cluster.warm_pool import MAX_LOG_BYTES

LOOKALIKES = 20
MIB_EACH = 8


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def lookalike_actors(root: Path) -> None:
    token = ensure_token(root / "auth" / "token")
    os.environ.pop("RAY_AUTH_TOKEN", None)  # the server and the attacking job use this head's token
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    head = start_head(root / "ray", num_cpus=2, auth_token_path=token)
    server = ServerProcess(root / "server", head.dashboard_url).start()
    names: list[str] = []
    try:
        before_rss = rss_mib(server.proc.pid)
        names = squat(head, LOOKALIKES, MIB_EACH)
        before = log_figures(server.url)
        deadline = time.monotonic() + 120
        while log_figures(server.url)[0] < before[0] + 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        info = httpx.get(server.url + "/v1/cluster", timeout=60).json()
        for _ in range(10):
            httpx.get(server.url + "/v1/cluster", timeout=60)
        after = log_figures(server.url)
        alive = sum(1 for n in info["nodes"] if n["alive"])
        listed = len(info["warm_pool"])
        row(
            f"warm_pool entries with {LOOKALIKES + 1} look-alike actors ({MIB_EACH} MiB of log each)",
            str(listed),
            f"<= {alive} (live nodes)",
            listed <= alive,
        )
        reads, read_bytes = after[0] - before[0], after[1] - before[1]
        per_read = read_bytes / reads if reads else 0.0
        row(
            "pool log bytes read per log",
            f"{per_read:,.0f} B ({reads:.0f} reads)",
            f"<= {MAX_LOG_BYTES:,} B",
            reads > 0 and per_read <= MAX_LOG_BYTES,
        )
        grown = rss_mib(server.proc.pid) - before_rss
        row("server RSS growth over refreshes and 11 GETs", f"{grown:.1f} MiB", "< 64 MiB", grown < 64)
    finally:
        if names:
            unsquat(head, names)
        server.stop()
        head.stop()


def main() -> int:
    return run_attacks("cluster", lookalike_actors)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
