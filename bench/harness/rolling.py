"""Load through a proxy while replicas restart, for tests and benchmarks: client threads
reading and submitting until stopped (what failed, what was accepted), and a rolling
restart of the replicas one at a time, each waited for until the proxy sends it requests
again (bench/harness/proxy.py)."""

from __future__ import annotations

import threading
from collections import Counter

import httpx

from bench.harness.proxy import Proxy
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
