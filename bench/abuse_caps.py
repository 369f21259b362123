"""One tenant against the server-wide caps, measured against their shares.

    .venv/bin/python -m bench.abuse_caps

Starts its own servers (real HTTP, SQLite, no Ray: jobs are put RUNNING in the store,
``harness/caps_attacks.py``) with the default shares (a project half of each cap, a user a
quarter) and prints one row per figure, ``what | figure | bound | ok/FAIL``:

- streams one viewer holds when it opens as many as the server has, a second user of its
  project, a third (past the project's share), and whether another project is served;
- code uploads one member holds when it opens as many as the server takes, and whether
  another project's upload gets through meanwhile;
- how long a follow of a QUEUED job stays open (RAYDOCK_STREAM_IDLE_S=2), and a stream
  whose token is revoked (RAYDOCK_STREAM_RECHECK_S=0.5);
- how long an upload trickling 200 bytes/s is held (least rate 1,000 bytes/s after 1 s);
- what an upload past the project's code quota gets.

Every loop is bounded. ``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.figures import row, run_attacks
from bench.harness import attacks, caps_attacks
from bench.harness.code_attacks import package
from bench.harness.tenancy_world import start_world

STREAMS, UPLOADS = 64, 8
ENV = {
    "RAYDOCK_MAX_STREAMS": str(STREAMS),
    "RAYDOCK_MAX_CONCURRENT_UPLOADS": str(UPLOADS),
    "RAYDOCK_STREAM_IDLE_S": "2",
    "RAYDOCK_STREAM_RECHECK_S": "0.5",
    "RAYDOCK_UPLOAD_GRACE_S": "120",
}


def shares(root: Path) -> None:
    world = start_world(root / "shares", **ENV)
    try:
        alpha, beta = caps_attacks.running_job(world, "alpha"), caps_attacks.running_job(world, "beta")
        with ExitStack() as stack:
            viewer = caps_attacks.open_follows(world, "viewer", alpha, STREAMS, stack)
            mate = caps_attacks.open_follows(world, "mate", alpha, STREAMS, stack)
            owner = caps_attacks.open_follows(world, "owner", alpha, STREAMS, stack)
            other = caps_attacks.open_follows(world, "other", beta, 1, stack)
        row(
            f"streams one viewer holds of {STREAMS} it opens",
            str(viewer.served),
            f"{STREAMS // 4} (a quarter)",
            viewer.served == STREAMS // 4,
        )
        row(
            "streams a second user of the project holds",
            str(mate.served),
            f"{STREAMS // 4}",
            mate.served == STREAMS // 4,
        )
        row("streams a third user holds (project at half)", str(owner.served), "0", owner.served == 0)
        row("another project's stream meanwhile", str(other.codes[0]), "200", other.codes == [200])
        held = caps_attacks.hold_uploads(world, "mate", "alpha", UPLOADS)
        try:
            body, _ = caps_attacks.code_body("beta-meanwhile")
            r = caps_attacks.upload(world, "other", "beta", body)
        finally:
            held.release()
        n = len(held.socks)
        row(f"uploads one member holds of {UPLOADS} it opens", str(n), f"{UPLOADS // 4} (a quarter)", n == UPLOADS // 4)
        row("another project's upload meanwhile", str(r.status_code), "201", r.status_code == 201)
        t0 = time.monotonic()
        queued = world.fresh_job("alpha")
        text = caps_attacks.read_to_end(world, "viewer", f"/v1/jobs/{queued}/logs", {"follow": "true"})
        took = time.monotonic() - t0
        ok = "[raydock]" in text and took < 4
        row("follow of a QUEUED job open for (RAYDOCK_STREAM_IDLE_S=2)", f"{took:.1f} s", "< 4 s, closing line", ok)
        after = revoked_stream_s(world, alpha)
        row("revoked token's stream open for after revocation", f"{after:.1f} s", "< 2 s", after < 2)
    finally:
        world.stop()


def revoked_stream_s(world, job_id: str) -> float:
    with world.http("admin") as admin:
        name = f"bench-{time.monotonic_ns()}"
        admin.post("/v1/users", json={"name": name, "project": "alpha", "role": "viewer"}).raise_for_status()
        made = admin.post(f"/v1/users/{name}/tokens", json={"name": "t"}).raise_for_status().json()
        ended = threading.Event()

        def follow() -> None:
            headers = {"Authorization": f"Bearer {made['token']}"}
            with httpx.stream(
                "GET", f"{world.url}/v1/jobs/{job_id}/logs", params={"follow": "true"}, headers=headers, timeout=30
            ) as r:
                opened.set()
                r.read()
            ended.set()

        opened = threading.Event()
        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        opened.wait(10)
        t0 = time.monotonic()
        admin.delete(f"/v1/users/{name}/tokens/{made['id']}").raise_for_status()
        ended.wait(30)
        return time.monotonic() - t0


def slow_upload_and_quota(root: Path) -> None:
    body_a, body_b = package({"a.py": b"a = 1\n" * 2000}), package({"b.py": b"b = 2\n" * 3000})
    env = {
        "RAYDOCK_UPLOAD_MIN_BYTES_PER_S": "1000",
        "RAYDOCK_UPLOAD_GRACE_S": "1",
        "RAYDOCK_CODE_QUOTA_BYTES": str(len(body_a) + len(body_b) - 1),
    }
    slow = {k: env.pop(k) for k in ("RAYDOCK_UPLOAD_MIN_BYTES_PER_S", "RAYDOCK_UPLOAD_GRACE_S")}
    target = attacks.start_target(root / "slow", **slow)
    try:
        t0 = time.monotonic()
        answer, closed = caps_attacks.trickle_upload(target.url, os.urandom(50_000), chunk=100, every_s=0.5, wait_s=30)
        took = time.monotonic() - t0  # to the connection's close
        ok = answer.startswith(b"HTTP/1.1 408") and closed and took < 4
        row(
            "upload trickling 200 B/s: connection held for (least 1000 B/s after 1 s)",
            f"{took:.1f} s",
            "< 4 s, 408, closed",
            ok,
        )
    finally:
        target.stop()
    target = attacks.start_target(root / "quota", **env)
    try:
        codes = []
        for body in (body_a, body_b):
            r = httpx.put(f"{target.url}/v1/code/{hashlib.sha256(body).hexdigest()}", content=body, timeout=30)
            codes.append(r.json().get("error", {}).get("code", r.status_code))
        row(
            "uploads within / past the project's code quota",
            " / ".join(map(str, codes)),
            "201 / code_quota_exceeded",
            codes == [201, "code_quota_exceeded"],
        )
    finally:
        target.stop()


def main() -> int:
    return run_attacks("caps", shares, slow_upload_and_quota)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
