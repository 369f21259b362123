"""How soon one replica takes over another's background units, measured against the targets.

    .venv/bin/python -m bench.replicas [--rounds 3] [--ttl 12]

Real ``raydock serve`` replicas on one PostgreSQL server this script starts (as the test
suite does, bench/harness/databases.py), pointed at a Ray address where nothing listens: holding,
losing and taking over the units needs no Ray. Each round starts replica A, waits until it
holds every leased unit, starts B, then:

- SIGKILLs A and times until B holds every unit (``GET /v1/replicas``, polled every 50 ms):
  target <= 15 s with the default TTL (12 s; a holder renews every 3 s, a replica short of
  some unit claims every second);
- stops B gracefully (SIGTERM) beside a fresh replica C, times the stop, and then until C
  holds them all: B's leases are freed as it exits, so C takes them at its next claim
  (within a second).

It also times a wake across replicas (service/db/wakes.py): one replica's NOTIFY until
another's listener calls its monitor's wake, against the monitor's own poll interval (what
a submit on a replica that does not hold the monitor waited for without it).

One row per figure, ``what | figure | bound | ok/FAIL``; ``main()`` returns the rows that failed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.figures import ROWS, row
from bench.harness.databases import PostgresServer
from bench.harness.replicas import held_by, holder_of, replica
from bench.harness.waiting import wait_for
from service.background.runner import WAITING_EVERY_S
from service.db.engine import make_engine
from service.db.wakes import Wakes
from service.settings import ClusterSettings

TAKEOVER_TARGET_S = 15.0


def _until_held(server, holder: str) -> float:
    """Seconds until ``server`` sees every leased unit held by ``holder`` (polled every 50 ms)."""
    started = time.monotonic()
    wait_for(lambda: held_by(server, holder), 120, f"{holder} holds every unit", 0.05)
    return time.monotonic() - started


def one_round(root: Path, url: str, ttl_s: float) -> tuple[float, float, float]:
    servers = []
    try:
        a = replica(root / "a", url, ttl_s)
        servers.append(a)
        _until_held(a, holder_of(a))
        b = replica(root / "b", url, ttl_s)
        servers.append(b)
        b_id = holder_of(b)
        a.kill()
        killed = _until_held(b, b_id)
        c = replica(root / "c", url, ttl_s)
        servers.append(c)
        c_id = holder_of(c)
        began = time.monotonic()
        b.stop()
        stopping = time.monotonic() - began
        return killed, stopping, _until_held(c, c_id)
    finally:
        for server in servers:
            server.kill()


def wake_latencies(url: str, n: int = 50) -> list[float]:
    """Seconds from a NOTIFY on one engine until a listener on another is woken, ``n`` times."""
    sender, listener = Wakes(make_engine(url)), Wakes(make_engine(url))
    woken, stop, seen = threading.Event(), threading.Event(), []

    def listen() -> None:
        while not stop.is_set():
            listener.listen(woken.set)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    time.sleep(1.5)  # its connection made and listening
    try:
        for _ in range(n):
            woken.clear()
            began = time.perf_counter()
            sender.notify()
            if not woken.wait(10):
                raise RuntimeError("a wake never arrived")
            seen.append(time.perf_counter() - began)
    finally:
        stop.set()
        thread.join(5)
        listener.stop()
    return seen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ttl", type=float, default=12.0, help="RAYDOCK_LEASE_TTL_S of the replicas (default: the default)")
    args = p.parse_args(argv)
    ROWS.clear()
    pg = PostgresServer().start()
    kills, stops, handovers = [], [], []
    try:
        print("what | figure | bound | ok/FAIL")
        wakes = sorted(wake_latencies(pg.url(pg.create_database())))
        for n in range(args.rounds):
            url = pg.url(pg.create_database())
            with tempfile.TemporaryDirectory(prefix="raydock-replicas-") as tmp:
                killed, stopping, handed = one_round(Path(tmp), url, args.ttl)
            kills.append(killed)
            stops.append(stopping)
            handovers.append(handed)
            print(
                f"# round {n + 1}: take-over after SIGKILL {killed:.1f} s; graceful stop {stopping:.1f} s, "
                f"take-over after its exit {handed:.1f} s"
            )
    finally:
        pg.stop()
    poll_s = ClusterSettings().monitor_interval_s
    row(
        f"a submit on one replica wakes the monitor on another (NOTIFY to wake), p99 of {len(wakes)}",
        f"{wakes[int(len(wakes) * 0.99) - 1] * 1000:.1f} ms (median {statistics.median(wakes) * 1000:.1f} ms)",
        f"<= {poll_s * 1000 / 5:g} ms (a fifth of the monitor's poll, {poll_s:g} s)",
        wakes[int(len(wakes) * 0.99) - 1] <= poll_s / 5,
    )
    target = TAKEOVER_TARGET_S * args.ttl / 12.0
    row(
        f"take-over after SIGKILL of the holder (TTL {args.ttl:g} s), worst of {len(kills)}",
        f"{max(kills):.1f} s (median {statistics.median(kills):.1f} s)",
        f"<= {target:g} s",
        max(kills) <= target,
    )
    row(
        f"take-over after the holder's graceful stop (SIGTERM) ended, worst of {len(handovers)}",
        f"{max(handovers):.1f} s (median {statistics.median(handovers):.1f} s; the stop itself {max(stops):.1f} s)",
        f"<= {WAITING_EVERY_S + 0.5:g} s (the next claim of a replica short of units)",
        max(handovers) <= WAITING_EVERY_S + 0.5,
    )
    return sum(1 for *_, ok in ROWS if not ok)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
