"""Requests failed while two replicas behind HAProxy are restarted one at a time, against the
target (none).

    .venv/bin/python -m bench.rolling_restart [--rounds 2] [--clients 4]

Real ``raydock serve`` replicas on one PostgreSQL server this script starts (as the test
suite does, bench/harness/databases.py), pointed at a Ray address where nothing listens
(submitted jobs wait in the queue), behind HAProxy running docker/haproxy.cfg itself
(bench/harness/proxy.py; ``apt-get install haproxy``). ``--clients`` threads send, through
the proxy, a mix of reads (the job list, one job) and submits for the whole run, while each
round restarts every replica in turn: SIGTERM (the server's graceful stop), started again
on its port, and the next one only once the proxy sends it requests again.

Figures: requests failed (any error or answer other than 2xx; target 0), accepted submits
missing from the store afterwards (target 0), jobs in the store beyond those accepted (a
submit retried twice; target 0). One row per figure, ``what | figure | bound | ok/FAIL``;
``main()`` returns the rows that failed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx

from bench.figures import ROWS, row
from bench.harness.databases import PostgresServer
from bench.harness.proxy import Proxy
from bench.harness.replicas import replica
from bench.harness.rolling import TTL_S, Load, restart_all
from bench.harness.waiting import wait_for


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="rolling restarts of both replicas")
    p.add_argument("--clients", type=int, default=4)
    args = p.parse_args(argv)
    ROWS.clear()
    pg = PostgresServer().start()
    servers, proxy = [], None
    try:
        url = pg.url(pg.create_database())
        with tempfile.TemporaryDirectory(prefix="raydock-rolling-") as tmp:
            root = Path(tmp)
            servers = [replica(root / name, url, TTL_S) for name in ("a", "b")]
            proxy = Proxy(root, [s.port for s in servers]).start()
            wait_for(lambda: proxy.up() == {"r0", "r1"}, 60, "the proxy sends both replicas requests", 0.1)
            load = Load(proxy.url, args.clients).start()
            began = time.monotonic()
            for _ in range(args.rounds):
                restart_all(servers, proxy)
            load.stop()
            took = time.monotonic() - began
            listed = httpx.get(f"{servers[0].url}/v1/jobs", params={"limit": 1}, timeout=30).json()["total"]
            missing = [
                j for j in load.accepted if httpx.get(f"{servers[1].url}/v1/jobs/{j}", timeout=30).status_code != 200
            ]
            sent = sum(load.sent.values())
            print("what | figure | bound | ok/FAIL")
            print(
                f"# {args.rounds} rolling restarts of 2 replicas in {took:.1f} s; {sent} requests ({dict(load.sent)})"
            )
            row("requests failed during the rolling restarts", f"{len(load.failed)} of {sent}", "0", not load.failed)
            row("accepted submits missing afterwards", f"{len(missing)} of {len(load.accepted)}", "0", not missing)
            doubled = listed - len(load.accepted)
            row("jobs in the store beyond those accepted", str(doubled), "0", doubled == 0)
            for failure in load.failed[:10]:
                print(f"# failed: {failure}")
    finally:
        for server in servers:
            server.kill()
        if proxy is not None:
            proxy.stop()
        pg.stop()
    return sum(1 for *_, ok in ROWS if not ok)


if __name__ == "__main__":
    raise SystemExit(main())
