"""Attacks on the HTTP server itself, measured against their bounds.

    .venv/bin/python -m bench.abuse_http

Starts its own servers (real sockets, no Ray) and prints one row per figure,
``what | figure | bound | ok/FAIL``:

- /healthz while 1,100 connections hold half-sent requests (heads without their end,
  bodies stopped after one byte), the server limited to 1,024 file descriptors, and the
  descriptors it holds meanwhile (M8);
- how long a half-sent request head is held before the server answers 408 (M8);
- how long a POST without the token waits for its body before the 401 (M8).

Every loop is bounded. ``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests import http_attacks

ROWS: list[tuple[str, str, str, bool]] = []


def row(what: str, figure: str, bound: str, ok: bool) -> None:
    ROWS.append((what, figure, bound, ok))
    print(f"{what} | {figure} | {bound} | {'ok' if ok else 'FAIL'}", flush=True)


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


def main() -> int:
    ROWS.clear()
    print("what | figure | bound | ok/FAIL")
    with tempfile.TemporaryDirectory(prefix="raydock-abuse-http-") as tmp:
        root = Path(tmp)
        for attack in (slowloris, head_timeout, token_before_body):
            attack(root)
    return sum(1 for *_, ok in ROWS if not ok)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
