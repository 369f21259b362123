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
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.figures import ROWS, row
from bench.harness.databases import PostgresServer
from bench.harness.proxy import Proxy
from bench.harness.replicas import replica
from bench.harness.specs import digits_spec
from bench.harness.waiting import wait_for

TTL_S = 12.0  # the default lease TTL


class Load:
    """Client threads sending reads and submits through the proxy until stopped."""

    def __init__(self, url: str, clients: int) -> None:
        self.url, self.clients = url, clients
        self.sent: Counter[str] = Counter()
        self.failed: list[str] = []
        self.accepted: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def _client(self, n: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as c:
            i = 0
            while not self._stop.is_set():
                i += 1
                what = "submit" if i % 4 == 0 else "list" if i % 2 else "get"
                try:
                    if what == "submit":
                        r = c.post("/v1/jobs", json=digits_spec(name=f"roll-{n}-{i}"))
                    elif what == "get" and self.accepted:
                        r = c.get(f"/v1/jobs/{self.accepted[-1]}")
                    else:
                        r = c.get("/v1/jobs", params={"limit": 5})
                    self.sent[what] += 1
                    if r.status_code >= 300:
                        self.failed.append(f"{what}: {r.status_code} {r.text[:200]}")
                    elif what == "submit":
                        self.accepted.append(r.json()["id"])
                except httpx.HTTPError as exc:
                    self.sent[what] += 1
                    self.failed.append(f"{what}: {type(exc).__name__}: {exc}")

    def start(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def restart_all(replicas: list, proxy: Proxy) -> None:
    """Each replica in turn: a graceful stop, a start on its port, until the proxy sends it requests."""
    for i, server in enumerate(replicas):
        server.stop()
        server.start()
        wait_for(lambda name=f"r{i}": name in proxy.up(), 60, f"the proxy sends r{i} requests again", 0.1)


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
