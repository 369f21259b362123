"""A job's slow webhook receivers against everyone else's webhooks, measured against
their bounds.

    .venv/bin/python -m bench.abuse_webhooks

Starts its own servers (real HTTP, SQLite, no Ray: jobs stay QUEUED and their
``submitted`` event is what is posted) with two receivers on loopback: an honest one, and
one that answers a byte every half second for ever. Prints ``what | figure | bound | ok/FAIL``:

- one job with four webhooks on the dripping receiver (RAYDOCK_WEBHOOK_CONCURRENCY=4):
  how long another job's post and the server's webhook take to arrive, and the most
  posts of the dripping job under way at once;
- four jobs, one dripping webhook each, holding every job slot: the same two figures,
  and how long a dripping post is held before it is cut off (RAYDOCK_WEBHOOK_TIMEOUT_S=5).

Every wait is bounded. ``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from bench.figures import row, run_attacks
from bench.harness.jobstore import dead_ray
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from bench.harness.webhook_receiver import DripReceiver, Receiver

TIMEOUT_S = 5.0


def _server(root: Path, honest: Receiver) -> ServerProcess:
    hooks = [{"name": "ops", "url": honest.url + "/ops", "events": ["submitted"], "secret": "ops-secret-0123456789"}]
    env = {
        "RAYDOCK_WEBHOOK_ALLOW_PRIVATE": "1",
        "RAYDOCK_WEBHOOK_TIMEOUT_S": str(TIMEOUT_S),
        "RAYDOCK_WEBHOOK_BACKOFF_S": "0.5",
        "RAYDOCK_WEBHOOK_CONCURRENCY": "4",
        "RAYDOCK_WEBHOOKS": json.dumps(hooks),
    }
    return ServerProcess(root, dead_ray(), extra_env=env).start()


def _submit(server: ServerProcess, name: str, urls: list[str]) -> str:
    notify = [{"url": url, "events": ["submitted"]} for url in urls]
    r = httpx.post(server.url + "/v1/jobs", json=digits_spec(name=name, notify=notify), timeout=60)
    r.raise_for_status()
    return r.json()["id"]


def _honest_arrivals(server: ServerProcess, honest: Receiver) -> tuple[float, float]:
    """Seconds from another job's submit to its own post, and to the server webhook's."""
    t0 = time.perf_counter()
    job = _submit(server, "honest", [honest.url + "/mine"])
    ops = honest.wait_for("/ops", lambda posts: any(p.event["job_id"] == job for p in posts), timeout=120)
    [mine] = honest.wait_for("/mine", lambda posts: len(posts) == 1, timeout=120)
    return mine.at - t0, next(p.at for p in ops if p.event["job_id"] == job) - t0


def _most_open(tries, prefix: str) -> int:
    """The most tries under ``prefix`` open at one time."""
    edges = sorted(
        [(t.start, 1) for t in tries if t.path.startswith(prefix)]
        + [(t.end, -1) for t in tries if t.path.startswith(prefix) and t.end is not None]
    )
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def one_job_four_drips(root: Path) -> None:
    with Receiver() as honest, DripReceiver(interval_s=0.5) as drip:
        server = _server(root / "one-job", honest)
        try:
            _submit(server, "drip", [f"{drip.url}/d{i}" for i in range(4)])
            drip.wait_for(lambda tries: len(tries) >= 1, timeout=60)
            mine_s, ops_s = _honest_arrivals(server, honest)
            tries = drip.wait_for(lambda tries: sum(t.end is not None for t in tries) >= 2, timeout=120)
        finally:
            server.stop()
    row("one job, 4 dripping webhooks: another job's post arrives after", f"{mine_s:.2f} s", "< 2 s", mine_s < 2)
    row("one job, 4 dripping webhooks: the server's webhook arrives after", f"{ops_s:.2f} s", "< 2 s", ops_s < 2)
    most = _most_open(tries, "/d")
    row("one job, 4 dripping webhooks: its posts under way at once, at most", str(most), "1", most == 1)


def four_jobs_hold_every_slot(root: Path) -> None:
    with Receiver() as honest, DripReceiver(interval_s=0.5) as drip:
        server = _server(root / "four-jobs", honest)
        try:
            for i in range(4):
                _submit(server, f"drip-{i}", [f"{drip.url}/j{i}"])
            drip.wait_for(lambda tries: sum(t.end is None for t in tries) >= 4, timeout=60)
            mine_s, ops_s = _honest_arrivals(server, honest)
            tries = drip.wait_for(lambda tries: sum(t.end is not None for t in tries) >= 4, timeout=120)
        finally:
            server.stop()
    bound = TIMEOUT_S + 2
    row(
        "4 jobs' dripping webhooks hold every job slot: another job's post arrives after",
        f"{mine_s:.2f} s",
        f"< {bound:g} s (one timeout)",
        mine_s < bound,
    )
    row("4 jobs' dripping webhooks: the server's webhook arrives after", f"{ops_s:.2f} s", "< 2 s", ops_s < 2)
    held = max(t.end - t.start for t in tries if t.end is not None)
    ok = held < TIMEOUT_S + 1 and all(t.cut for t in tries if t.end is not None)
    row(
        f"a dripping post held before it is cut off (timeout {TIMEOUT_S:g} s)",
        f"{held:.2f} s",
        f"< {TIMEOUT_S + 1:g} s",
        ok,
    )


def main() -> int:
    return run_attacks("webhooks", one_job_four_drips, four_jobs_hold_every_slot)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
