"""A forged PBT lineage against the replay of a search's best trial, measured against its bounds.

    .venv/bin/python -m bench.abuse_replay

Starts its own server (real HTTP, SQLite, no Ray: the search is put RUNNING in the store
with an events token the attacker holds, ``harness/attacks.py``), pushes a chain of clones
(t0 cloned t1, which cloned t2, ...) and asks for GET /v1/jobs/{id}/best/replay. Prints
one row per figure, ``what | figure | bound | ok/FAIL``:

- a 3,000-clone lineage: the replay answers 200 with one interval per clone;
- a lineage one clone over ``service.events.reads.replay.MAX_LINEAGE``: 409 ``lineage_too_deep``.

``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from bench.figures import row, run_attacks
from bench.harness import attacks
from service.events.reads.replay import MAX_LINEAGE

BOUND_S = 10.0


def lineage(root: Path, depth: int) -> None:
    # Enough trials and exploits allowed for the chain: the bound under test is the replay's.
    target = attacks.start_target(root / str(depth), RAYDOCK_MAX_TRIALS_PER_JOB=str(depth + 10))
    try:
        r = attacks.replay_of_a_lineage(target, target.running_search(), depth)
        took = r.elapsed.total_seconds()
        code = r.json().get("error", {}).get("code", "") if r.status_code != 200 else ""
        want = 200 if depth <= MAX_LINEAGE else 409
        row(
            f"GET /best/replay of a {depth}-clone lineage",
            f"{r.status_code} {code} in {took:.2f} s",
            f"{want}, under {BOUND_S:.0f} s",
            r.status_code == want and took < BOUND_S,
        )
    finally:
        target.stop()


def main() -> int:
    return run_attacks("replay", partial(lineage, depth=3000), partial(lineage, depth=MAX_LINEAGE + 1))


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
