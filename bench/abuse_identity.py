"""Attacks on identity and tenancy, measured against their bounds.

    .venv/bin/python -m bench.abuse_identity

Starts its own servers (real HTTP, SQLite, no Ray) and prints one row per figure,
``what | figure | bound | ok/FAIL``:

- the lifetime of tokens minted by a chain of user tokens, each made with the one before,
  starting from a 1-day token, and of a token asked for with no expiry;
- tokenless answers after local mode has ended and every other user was deleted;
- what /metrics gives a tokenless loopback client, and a non-admin user, once users hold tokens;
- another project's Idempotency-Keys: how many of its submits a second project's same keys
  are refused with or pointed to;
- the user names ``admin`` and ``system`` accepted;
- the time of a scrape with a server admin's user token (a token lookup per scrape).

``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from bench.figures import row, run_attacks
from bench.harness.identity_attacks import (
    lifetime_days,
    local_mode_after_users_left,
    mint,
    same_key_in_two_projects,
    scrape,
    start_local,
    take_the_admin_name,
)
from bench.harness.tenancy_world import start_world

CHAIN = 10  # tokens minted one from the other
KEYS = 50  # Idempotency-Keys the first project uses, then the second
SCRAPES = 20


def token_lifetimes(root: Path) -> None:
    world = start_world(root / "tokens")
    try:
        admin = world.tokens["admin"]
        made = mint(world.url, admin, "mate", expires_in_days=1, name="short").raise_for_status().json()
        longest = 0.0
        for i in range(CHAIN):  # each asks for no expiry: the longest it is allowed
            r = mint(world.url, made["token"], "mate", name=f"chain-{i}")
            if r.status_code != 201:
                break
            made = r.json()
            longest = max(longest, lifetime_days(made) or float("inf"))
        row(
            f"longest lifetime in a chain of {CHAIN} tokens from a 1-day one",
            f"{longest:.4f} days",
            "<= 1 day",
            0 < longest <= 1,
        )
        asked = [mint(world.url, made["token"], "mate", expires_in_days=d).status_code for d in (2, 30, 365)]
        row(
            "longer tokens asked of the last of them: refused 422",
            f"{asked.count(422)} of 3",
            "3 of 3",
            asked == [422] * 3,
        )
        capped = lifetime_days(mint(world.url, admin, "owner", name="no-expiry").raise_for_status().json())
        ok = capped is not None and capped <= 365
        row(
            "a token asked for with no expiry (admin, RAYDOCK_MAX_TOKEN_TTL_DAYS=365)",
            f"{capped} days",
            "<= 365 days",
            ok,
        )

        refused, other = scrape(world.url), scrape(world.url, world.tokens["owner"])
        leaked = len(refused.content) if refused.status_code == 200 else 0
        row(
            "/metrics bytes to a tokenless loopback client once users hold tokens",
            str(leaked),
            "0 (401)",
            leaked == 0 and refused.status_code == 401,
        )
        row(
            "/metrics to a project admin's token (not a server admin)",
            str(other.status_code),
            "401",
            other.status_code == 401,
        )
        times = []
        for _ in range(SCRAPES):
            t0 = time.perf_counter()
            scrape(world.url, admin).raise_for_status()
            times.append(time.perf_counter() - t0)
        med = statistics.median(times) * 1000
        row(f"/metrics with a server admin's user token, median of {SCRAPES}", f"{med:.1f} ms", "< 200 ms", med < 200)

        collisions = 0
        for i in range(KEYS):
            first, second, _ = same_key_in_two_projects(
                world.url, (world.tokens["owner"], "alpha"), (world.tokens["other"], "beta"), f"key-{i}"
            )
            collisions += second.status_code != 202 or second.json()["id"] == first.json()["id"]
        row(
            f"another project's Idempotency-Keys refused or answered with its job, of {KEYS}",
            str(collisions),
            "0",
            collisions == 0,
        )
        with world.http("admin") as http:
            reserved = [http.post("/v1/users", json={"name": n}).status_code for n in ("admin", "system")]
        row(
            "user names admin and system accepted",
            str(sum(c == 201 for c in reserved)),
            "0 (422)",
            reserved == [422, 422],
        )
    finally:
        world.stop()


def local_mode(root: Path) -> None:
    local = start_local(root / "local")
    try:
        seen = local_mode_after_users_left(local)
        row(
            "tokenless /v1/me: first start, users with tokens, all deleted",
            " / ".join(map(str, seen)),
            "200 / 401 / 401",
            seen == [200, 401, 401],
        )
        local.server.stop()
        local.server.start()
        again = local.tokenless_status()
        row("tokenless /v1/me after a restart", str(again), "401", again == 401)
        taken = take_the_admin_name(local)
        row("a user named admin once its user is deleted", str(taken.status_code), "422", taken.status_code == 422)
    finally:
        local.server.stop()


def main() -> int:
    return run_attacks("identity", token_lifetimes, local_mode)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
