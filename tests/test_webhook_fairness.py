"""A job's slow webhook receivers hold up nobody else's webhooks, against a real server
(real HTTP, SQLite, no Ray: jobs stay QUEUED, their ``submitted`` event is what is posted)
and real receivers on loopback: one honest, one dripping a byte every half second for ever
(a post to it never ends by itself; each read comes well within the timeout).

Two hostile jobs hold every job slot (RAYDOCK_WEBHOOK_CONCURRENCY=2) with five dripping
subscriptions. Another job's post still arrives while the drips go on, the server's
webhook arrives before any drip open at that time ends, each dripping post is cut off at
RAYDOCK_WEBHOOK_TIMEOUT_S whole (not per read), a job has one post under way at a time, and
a cut post is tried again after its backoff."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from bench.harness.jobstore import dead_ray
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from bench.harness.waiting import wait_for
from bench.harness.webhook_receiver import DripReceiver, Receiver
from service.eventlog.deliverer import backoff_s

TIMEOUT_S, BACKOFF_S = 4.0, 0.5


@pytest.fixture()
def receivers():
    with Receiver() as honest, DripReceiver(interval_s=0.5) as drip:
        yield honest, drip


@pytest.fixture()
def server(tmp_path, receivers):
    honest, _ = receivers
    hooks = [{"name": "ops", "url": honest.url + "/ops", "events": ["submitted"], "secret": "ops-secret-0123456789"}]
    env = {
        "RAYDOCK_WEBHOOK_ALLOW_PRIVATE": "1",
        "RAYDOCK_WEBHOOK_TIMEOUT_S": str(TIMEOUT_S),
        "RAYDOCK_WEBHOOK_BACKOFF_S": str(BACKOFF_S),
        "RAYDOCK_WEBHOOK_CONCURRENCY": "2",
        "RAYDOCK_WEBHOOKS": json.dumps(hooks),
    }
    proc = ServerProcess(tmp_path, dead_ray(), extra_env=env).start()
    yield proc
    proc.stop()


def _submit(server: ServerProcess, name: str, urls: list[str]) -> str:
    notify = [{"url": url, "events": ["submitted"]} for url in urls]
    r = httpx.post(server.url + "/v1/jobs", json=digits_spec(name=name, notify=notify), timeout=30)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def test_a_jobs_dripping_receivers_hold_up_no_other_webhook(server, receivers):
    honest, drip = receivers
    hostile = [
        _submit(server, "drip-a", [f"{drip.url}/a{i}" for i in range(3)]),
        _submit(server, "drip-b", [f"{drip.url}/b{i}" for i in range(2)]),
    ]
    # Both job slots are taken by drips (the old deliverer: by job a's alone).
    drip.wait_for(lambda tries: sum(t.end is None for t in tries) >= 2, timeout=60)
    mine = _submit(server, "honest", [honest.url + "/mine"])
    with drip.lock:
        open_then = [t for t in drip.tries if t.end is None]

    ops = honest.wait_for("/ops", lambda posts: any(p.event["job_id"] == mine for p in posts), timeout=60)
    ops_at = next(p.at for p in ops if p.event["job_id"] == mine)
    [post] = honest.wait_for("/mine", lambda posts: len(posts) == 1, timeout=60)
    # The drips go on after it arrived: it did not wait for them to end.
    tries = drip.wait_for(lambda tries: any(t.start > post.at for t in tries), timeout=60)
    assert any(t.start < post.at for t in tries)
    # The server's webhook has a lane of its own: it did not wait for a job slot.
    assert all(t.end is None or ops_at < t.end for t in open_then), (ops_at, open_then)

    # Each dripping post is cut off at the deadline, and tried again after its backoff.
    tries = drip.wait_for(lambda tries: sum(t.path == "/a0" and t.end is not None for t in tries) >= 2, timeout=120)
    ended = [t for t in tries if t.end is not None]
    assert ended and all(t.cut for t in ended)
    a0 = [t for t in ended if t.path == "/a0"]
    assert a0[0].event_id == a0[1].event_id
    assert a0[1].start - a0[0].end >= 0.9 * backoff_s(1, BACKOFF_S, 60)
    # One post of a job at a time, whichever of its subscriptions it is for.
    for prefix in ("/a", "/b"):
        own = sorted((t for t in tries if t.path.startswith(prefix)), key=lambda t: t.start)
        assert all(later.start >= earlier.end for earlier, later in zip(own, own[1:]) if earlier.end), own
    with httpx.Client(base_url=server.url, timeout=30) as c:
        [first] = c.get(f"/v1/webhooks/{hostile[0]}-1/deliveries").json()["items"]
    assert first["state"] == "pending" and first["attempts"] >= 2 and first["last_status"] is None
    assert "RAYDOCK_WEBHOOK_TIMEOUT_S" in first["last_error"]


def _tried(c: httpx.Client, subscription: str, error: str | None = None) -> list[dict] | None:
    """The subscription's deliveries once the first was tried (``error``: once it was put off with it)."""
    items = c.get(f"/v1/webhooks/{subscription}/deliveries").json()["items"]
    if error is not None:
        return items if items and error in (items[0]["last_error"] or "") else None
    return items if items and items[0]["attempts"] >= 1 else None


class SilentNameServer:
    """A name server on a loopback address of its own that takes every query and never
    answers: the system's resolver, pointed at it, waits its whole timeout."""

    def __init__(self) -> None:
        self.address = f"127.{secrets.randbelow(200) + 20}.{secrets.randbelow(250) + 1}.{secrets.randbelow(250) + 1}"
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((self.address, 53))
        self.queries: list[tuple[float, str]] = []  # (time.perf_counter(), the name asked for)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError:
                return
            labels, i = [], 12
            while i < len(data) and data[i]:
                labels.append(data[i + 1 : i + 1 + data[i]].decode("ascii", "replace"))
                i += 1 + data[i]
            self.queries.append((time.perf_counter(), ".".join(labels)))

    def close(self) -> None:
        self.sock.close()


def _unshare_unavailable() -> str | None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "a mount namespace (for the server's own resolv.conf) needs root and unshare"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, timeout=30)
    return None if probe.returncode == 0 else f"unshare -m failed: {probe.stderr.decode()[:200]}"


@pytest.mark.skipif(_unshare_unavailable() is not None, reason=str(_unshare_unavailable()))
def test_a_name_that_never_resolves_holds_up_no_other_webhook(tmp_path, receivers):
    """The server resolves names through a name server that never answers (its own
    resolv.conf, in a mount namespace of its own; 30 s a try): a job's four webhooks on
    such names hold one lookup at a time, each post is cut off at the deadline, and the
    other webhooks arrive before the resolver even tries that name again. Another job's
    name, finding the lane's one lookup thread taken, is put off without losing a try."""
    honest, _ = receivers
    names = SilentNameServer()
    conf = tmp_path / "resolv.conf"
    conf.write_text(f"nameserver {names.address}\noptions timeout:30 attempts:2\n")
    hooks = [{"name": "ops", "url": honest.url + "/ops", "events": ["submitted"], "secret": "ops-secret-0123456789"}]
    env = {
        "RAYDOCK_WEBHOOK_ALLOW_PRIVATE": "1",
        "RAYDOCK_WEBHOOK_TIMEOUT_S": "2",
        "RAYDOCK_WEBHOOK_BACKOFF_S": "30",  # each webhook is tried once here: its error stays to be read
        "RAYDOCK_WEBHOOK_CONCURRENCY": "1",  # and the jobs' lane has one lookup thread
        "RAYDOCK_WEBHOOKS": json.dumps(hooks),
    }
    serve = f"mount --bind {conf} /etc/resolv.conf && exec {sys.executable} -m service.cli serve"
    argv = ["-m", "--propagation", "private", "sh", "-c", serve]
    server = ServerProcess(tmp_path / "data", dead_ray(), extra_env=env, python="unshare", argv=argv).start()
    try:
        hostile = _submit(server, "no-answer", [f"http://slow{i}.dns.test/hook" for i in range(4)])
        wait_for(lambda: names.queries, 60, "the first lookup")
        mine = _submit(server, "honest", [honest.url + "/mine"])
        ops = honest.wait_for("/ops", lambda posts: any(p.event["job_id"] == mine for p in posts), timeout=60)
        [post] = honest.wait_for("/mine", lambda posts: len(posts) == 1, timeout=60)
        first_at, first_name = names.queries[0]
        retried = [at for at, name in names.queries if name == first_name and at > first_at + 1]
        # Both arrived while the first lookup still waited for its first answer.
        assert not retried or max(post.at, *(p.at for p in ops)) < retried[0]
        with httpx.Client(base_url=server.url, timeout=30) as c:
            pages = [wait_for(lambda i=i: _tried(c, f"{hostile}-{i}"), 30, f"a try of {hostile}-{i}") for i in (1, 2)]
            # Another job's name waits for the lookup thread, and that costs it no try.
            later = _submit(server, "named", ["http://other.dns.test/hook"])
            [busy] = wait_for(lambda: _tried(c, f"{later}-1", "lookups are under way"), 30, "a lookup refused")
    finally:
        server.stop()
        names.close()
    assert {name for _, name in names.queries} == {first_name}  # one lookup of the job at a time
    [cut], [waited] = pages
    assert cut["state"] == "pending" and "RAYDOCK_WEBHOOK_TIMEOUT_S" in cut["last_error"], cut
    assert waited["state"] == "pending" and "has not finished" in waited["last_error"], waited
    assert (busy["state"], busy["attempts"]) == ("pending", 0), busy
