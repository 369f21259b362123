"""Attacks on checkpoint downloads, measured against their bounds.

    .venv/bin/python -m bench.abuse_downloads

Starts its own servers (real HTTP, SQLite, no Ray: the job and its checkpoint are put in
place, ``harness/download_attacks.py``) and prints one row per figure,
``what | figure | bound | ok/FAIL``:

- 200 connections ask for a 32 MiB checkpoint and read nothing (M7): how many are
  served, GET /v1/jobs meanwhile, the server's memory and threads, and how long until
  the send timeout frees their places;
- a job pauses its own download and swaps the files not yet packed for links to files
  of the API host (H): how many of them the download holds.

Every loop is bounded. ``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.figures import row, run_attacks
from bench.harness import download_attacks as attacks

LIMIT = 8  # RAYDOCK_MAX_CONCURRENT_DOWNLOADS's default
SEND_TIMEOUT_S = 12


def stalled_downloads(root: Path, connections: int = 200) -> None:
    target = attacks.start_target(root / "m7", RAYDOCK_DOWNLOAD_SEND_TIMEOUT_S=str(SEND_TIMEOUT_S))
    try:
        job_id = target.running_job()
        row_id, _ = attacks.checkpoint(target, job_id, {"model.pt": os.urandom(32 << 20)})
        f = attacks.stall_downloads(target, job_id, row_id, connections, send_timeout_s=SEND_TIMEOUT_S)
        what = f"{connections} stalled downloads"
        row(f"{what}: served at once", f"{f.served} (429: {f.refused})", f"<= {LIMIT}", f.served <= LIMIT)
        row(f"{what}: GET /v1/jobs p50", f"{f.list_p50_ms:.0f} ms", "< 200 ms", f.list_p50_ms < 200)
        row(f"{what}: GET /v1/jobs max", f"{f.list_max_ms:.0f} ms", "< 1000 ms", f.list_max_ms < 1000)
        row(f"{what}: server RSS", f"+{f.rss_grew_mib:.0f} MiB", "< 150 MiB", f.rss_grew_mib < 150)
        bound = 3 * LIMIT + 8
        row(f"{what}: server threads", f"+{f.threads_grew}", f"<= {bound}", f.threads_grew <= bound)
        freed = f.fresh_download_status == 200 and f.freed_after_s < SEND_TIMEOUT_S + 10
        row(
            f"{what}: a fresh download served after",
            f"{f.freed_after_s:.1f} s ({f.fresh_download_status})",
            f"< send timeout {SEND_TIMEOUT_S} s + 10 s",
            freed,
        )
    finally:
        target.stop()


def swapped_links(root: Path) -> None:
    target = attacks.start_target(root / "h")
    try:
        (root / "host").mkdir()
        f = attacks.swap_while_paused(target, root / "host")
        row("files swapped for links to the API host, in the download", str(len(f.leaked)), "0", not f.leaked)
    finally:
        target.stop()


def main() -> int:
    return run_attacks("downloads", stalled_downloads, swapped_links)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
