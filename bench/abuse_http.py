"""Attacks on the HTTP server itself, measured against their bounds.

    .venv/bin/python -m bench.abuse_http

Starts its own servers (real sockets, no Ray) and prints one row per figure,
``what | figure | bound | ok/FAIL``:

- /healthz while 1,100 connections hold half-sent requests (heads without their end,
  bodies stopped after one byte), the server limited to 1,024 file descriptors, and the
  descriptors it holds meanwhile (M8);
- how long a half-sent request head is held before the server answers 408 (M8);
- how long a POST without the token waits for its body before the 401 (M8);
- POST /v1/jobs:cancel of 200 running jobs while the Ray dashboard hangs (L);
- streams opened past RAYDOCK_MAX_STREAMS: each answered 429, and /healthz meanwhile (L).

Every loop is bounded. ``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.figures import row, run_attacks
from bench.harness import attacks, http_attacks
from bench.harness.jobstore import job_service, set_columns, submit
from bench.harness.servers import ServerProcess


def slowloris(root: Path) -> None:
    server = http_attacks.start_server(root / "m8", nofile=1024)
    try:
        f = http_attacks.slowloris(server, connections=1100)
        row(
            "/healthz with 1,100 half-sent requests held (ulimit -n 1024)",
            f"{f.healthz_s:.2f} s",
            "< 3 s",
            f.healthz_s < 3,
        )
        row("server file descriptors meanwhile", str(f.server_fds), "< 1024", f.server_fds < 1024)
        after = http_attacks.healthz_s(server, 5.0)
        row("/healthz once the attackers are gone", f"{after:.2f} s", "< 3 s", after < 3)
    finally:
        server.stop()


def head_timeout(root: Path) -> None:
    server = http_attacks.start_server(root / "m8-head", RAYDOCK_HEADER_TIMEOUT_S="2")
    try:
        took, answer = http_attacks.head_timeout(server, wait=10.0)
        ok = answer.startswith(b"HTTP/1.1 408") and took < 4
        row("half-sent head held until 408 (RAYDOCK_HEADER_TIMEOUT_S=2)", f"{took:.2f} s", "< 4 s, 408", ok)
    finally:
        server.stop()


def token_before_body(root: Path) -> None:
    server = http_attacks.start_server(root / "m8-token", RAYDOCK_API_TOKEN="bench-token")
    try:
        took, answer = http_attacks.unauthenticated_post_answer(server, wait=10.0)
        ok = answer.startswith(b"HTTP/1.1 401") and took < 1
        row("POST without the token, body never sent: 401 after", f"{took:.3f} s", "< 1 s, 401", ok)
    finally:
        server.stop()


def bulk_cancel_with_a_hung_dashboard(root: Path) -> None:
    data = root / "cancel"
    with ExitStack() as stack:
        hung = http_attacks.hung_dashboard(stack)
        url = f"sqlite:///{data / 'raydock.db'}"
        data.mkdir()
        service = job_service(url, data)
        ids = [submit(service) for _ in range(200)]
        for i, job_id in enumerate(ids):
            set_columns(service, job_id, status="RUNNING", attempt=1, ray_job_id=f"raysubmit_{i}")
        server = ServerProcess(data, hung, extra_env={"RAYDOCK_DATABASE_URL": url}).start()
        stack.callback(server.stop)
        took, r = http_attacks.bulk_cancel_s(server.url, ids, timeout=30.0)
        ok = r is not None and r.status_code == 200 and len(r.json()["cancelled"]) == 200 and took < 2
        row("POST /v1/jobs:cancel of 200 running jobs, dashboard hung", f"{took:.2f} s", "< 2 s, all cancelled", ok)


def streams_past_the_cap(root: Path) -> None:
    target = attacks.start_target(root / "streams", RAYDOCK_MAX_STREAMS="50")
    try:
        base = f"{target.url}/v1/jobs/{target.running_job()}"
        with ExitStack() as stack:
            client = stack.enter_context(httpx.Client(timeout=30, limits=httpx.Limits(max_connections=200)))
            codes = [
                stack.enter_context(client.stream("GET", f"{base}/logs?follow=true")).status_code for _ in range(80)
            ]
            took = http_attacks.healthz_s(target.server, 5.0)
        served, refused = codes.count(200), codes.count(429)
        row(
            "streams served / refused 429 of 80 (RAYDOCK_MAX_STREAMS=50)",
            f"{served} / {refused}",
            "50 / 30",
            (served, refused) == (50, 30),
        )
        row("/healthz with 50 streams open", f"{took:.2f} s", "< 1 s", took < 1)
    finally:
        target.stop()


def main() -> int:
    return run_attacks(
        "http", slowloris, head_timeout, token_before_body, bulk_cancel_with_a_hung_dashboard, streams_past_the_cap
    )


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
