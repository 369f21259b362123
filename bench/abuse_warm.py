"""A job that takes over a node's warm-start socket, measured against its bounds.

    .venv/bin/python -m bench.abuse_warm

Starts a real warm process (no Ray; harness/warm_attacks.py), plants a same-user listener
at its socket path, and runs a real job entrypoint (``trainers.zygote.client``) against
it. One row per figure, ``what | figure | bound | ok/FAIL``:

- bytes and file descriptors the planted listener got from the client (its environment
  and stdio, before the fix);
- whether the client started cold and said why;
- how long the warm process took to notice its path was taken and exit.

``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from bench.figures import row, run_attacks
from bench.harness.warm_attacks import plant, planted_saw, run_client, start_warm
from trainers.zygote.server import PATH_TAKEN


def socket_takeover(root: Path) -> None:
    path, proc, log = start_warm(root / "session")
    planted = plant(path, root / "planted.json")
    taken_at = time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - taken_at < 30:
            time.sleep(0.05)
        noticed = time.monotonic() - taken_at
        code = proc.poll()
        row(
            "warm process exits once its path is taken",
            f"{noticed:.2f} s, exit {code}",
            "< 5 s, exit 4",
            noticed < 5 and code == PATH_TAKEN,
        )
        _, said = run_client(root / "session")
        got = planted_saw(root / "planted.json")
        row("bytes a planted listener got from a job's client", str(got["bytes"]), "0", got["bytes"] == 0)
        row("file descriptors it got", str(got["fds"]), "0", got["fds"] == 0)
        cold = "starting cold" in said and "warm start, driver" not in said
        row("the client started cold and said why", "yes" if cold else "no", "yes", cold)
    finally:
        os.kill(planted, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def main() -> int:
    return run_attacks("warm", socket_takeover)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
