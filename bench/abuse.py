"""Every attack of the adversarial reviews that has a figure, measured against its bound.

    .venv/bin/python -m bench.abuse [events downloads code http]

Runs each ``bench/abuse_<area>.py`` in turn (each starts servers of its own: real HTTP,
SQLite; none needs Ray but ``cluster``, which starts a Ray head of its own) and prints their rows, ``what | figure | bound | ok/FAIL``, then
one summary line. Exits 1 when any row failed.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def areas() -> list[str]:
    here = Path(__file__).parent
    return sorted(
        m.name.removeprefix("abuse_") for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("abuse_")
    )


def main(argv: list[str]) -> int:
    chosen = argv or areas()
    failed: dict[str, int] = {}
    for area in chosen:
        print(f"\n== {area}", flush=True)
        failed[area] = importlib.import_module(f"bench.abuse_{area}").main()
    print("\n" + ", ".join(f"{a}: {'ok' if n == 0 else f'{n} FAILED'}" for a, n in failed.items()))
    return 1 if any(failed.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
