"""What knowing the caller costs a request: `GET /v1/jobs/{id}` over real HTTP (one
keep-alive connection of ``http.client``) as a project member (token lookup, then the
job's project checked) and as the server admin (token lookup only), side by side on one
server (SQLite, no Ray; harness/tenancy_world.py builds it), alternating rounds.

    .venv/bin/python -m bench.tenancy_auth [--requests 2000]
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from bench.harness.tenancy_world import start_world


def timed(url: str, token: str, path: str, n: int) -> list[float]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port)
    headers = {"Authorization": f"Bearer {token}"}
    out = []
    for _ in range(n):
        t = time.perf_counter()
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        r.read()
        out.append(time.perf_counter() - t)
        assert r.status == 200, r.status
    conn.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    args = ap.parse_args()
    world = start_world(Path(tempfile.mkdtemp(prefix="tenancy-bench-")))
    try:
        path = f"/v1/jobs/{world.job}"
        times: dict[str, list[float]] = {"member": [], "server admin": []}
        for _ in range(4):  # alternating rounds: both see the same machine load
            for who, token in (("member", world.tokens["mate"]), ("server admin", world.tokens["admin"])):
                times[who] += timed(world.url, token, path, args.requests // 4)
        print(f"GET {path}, {args.requests} requests each")
        print(f"{'caller':14} {'median ms':>10} {'p99 ms':>8}")
        for who, ts in times.items():
            ts.sort()
            print(f"{who:14} {statistics.median(ts) * 1e3:10.2f} {ts[int(len(ts) * 0.99)] * 1e3:8.2f}")
    finally:
        world.stop()


if __name__ == "__main__":
    main()
