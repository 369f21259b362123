"""Attacks on uploaded code and the job's package environment, measured against their bounds.

    .venv/bin/python -m bench.abuse_code

Starts its own servers (real HTTP, SQLite, no Ray: jobs stay QUEUED, and an attempt is
started in this process the way the server starts one, ``harness/code_attacks.py``) and
prints one row per figure, ``what | figure | bound | ok/FAIL``:

- the server's peak memory over a 94 MiB upload whose zip64 central directory claims
  1.9 million entries, at the default caps (M4), and how long the refusal took;
- uploads past RAYDOCK_MAX_CONCURRENT_UPLOADS: the status and Retry-After (M4);
- a package rewritten in storage: what HEAD answers, and whether the attempt reached Ray (M3);
- runtime_env entries that steer Ray's installer: how many got through (M2).

Every loop is bounded. ``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from bench.figures import row, run_attacks
from bench.harness import attacks, code_attacks
from bench.harness.code_attacks import INSTALLER_ATTACKS, job


def huge_directory(root: Path) -> None:
    target = attacks.start_target(root / "m4", RAYDOCK_CODE_ROOT="")  # the default caps: 100 MiB, 10,000 files
    try:
        body = code_attacks.huge_directory_zip(94 * 2**20)
        t0 = time.perf_counter()
        r, grew = code_attacks.upload_peak_growth_mib(target, body)
        took = time.perf_counter() - t0
        code = r.json().get("error", {}).get("code")
        row(
            "94 MiB upload, directory claims 1.9M entries: answer",
            f"{r.status_code} {code}",
            "422 code_too_large",
            code == "code_too_large",
        )
        row(
            "94 MiB upload, directory claims 1.9M entries: server peak memory",
            f"+{grew:.1f} MiB",
            "< 32 MiB",
            grew < 32,
        )
        row("94 MiB upload, directory claims 1.9M entries: time to refuse", f"{took:.1f} s", "< 10 s", took < 10)
        ok = httpx.get(f"{target.url}/healthz").status_code == 200
        row("server answers after it", "yes" if ok else "no", "yes", ok)
    finally:
        target.stop()


def concurrent_uploads(root: Path) -> None:
    target = attacks.start_target(root / "uploads", RAYDOCK_CODE_ROOT="", RAYDOCK_MAX_CONCURRENT_UPLOADS="4")
    try:
        body = code_attacks.package({"main.py": b"x = 1\n" * 50_000})
        held = code_attacks.hold_uploads(target, 4, body)
        try:
            _, r = code_attacks.upload(target.url, body)
        finally:
            code_attacks.release(held)
        retry = r.headers.get("Retry-After", "-")
        row(
            "5th upload while 4 are held open",
            f"{r.status_code} Retry-After {retry}",
            "429 with Retry-After",
            r.status_code == 429 and retry != "-",
        )
    finally:
        target.stop()


def rewritten_package(root: Path) -> None:
    target = attacks.start_target(root / "m3", RAYDOCK_CODE_ROOT="")
    try:
        body = code_attacks.package()
        sha, r = code_attacks.upload(target.url, body)
        victim = httpx.post(f"{target.url}/v1/jobs", json=job(sha), timeout=30).json()["id"]
        code_attacks.stored_package(target, sha).write_bytes(code_attacks.package({"main.py": b"import os\n"}))
        head = httpx.head(f"{target.url}/v1/code/{sha}").status_code
        row("HEAD of a package rewritten in storage", str(head), "404 (uploaded again)", head == 404)
        prepared = target.service.monitor.attempts.prepare(victim)
        info = target.service.reads.get(victim)
        fine = prepared is None and (info.error or "").startswith("code_package_altered")
        row(
            "attempt of a job whose package was rewritten",
            f"{info.status.value} {info.failure_cause.value if info.failure_cause else None}",
            "FAILED USER_CODE, nothing to Ray",
            fine,
        )
    finally:
        target.stop()


def installer_attacks(root: Path) -> None:
    target = attacks.start_target(root / "m2", RAYDOCK_CODE_ROOT="")
    try:
        sha, _ = code_attacks.upload(target.url, code_attacks.package())
        through = [
            w
            for w, env in INSTALLER_ATTACKS
            if httpx.post(f"{target.url}/v1/jobs", json=job(sha, **env), timeout=30).status_code != 422
        ]
        row(
            "installer-steering runtime_env entries accepted",
            f"{len(through)}/{len(INSTALLER_ATTACKS)}",
            "0",
            not through,
        )
    finally:
        target.stop()


def main() -> int:
    return run_attacks("code", huge_directory, concurrent_uploads, rewritten_package, installer_attacks)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
