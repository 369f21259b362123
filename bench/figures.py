"""A table of measured figures beside their bounds, for the ``bench/abuse_*.py`` attacks:
each row is printed as it is measured, ``what | figure | bound | ok/FAIL``."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

ROWS: list[tuple[str, str, str, bool]] = []


def row(what: str, figure: str, bound: str, ok: bool) -> None:
    ROWS.append((what, figure, bound, ok))
    print(f"{what} | {figure} | {bound} | {'ok' if ok else 'FAIL'}", flush=True)


def run_attacks(area: str, *attacks: Callable[[Path], None]) -> int:
    """Run each attack in a temp dir of the area's own; the number of rows that failed."""
    ROWS.clear()
    print("what | figure | bound | ok/FAIL")
    with tempfile.TemporaryDirectory(prefix=f"raydock-abuse-{area}-") as tmp:
        for attack in attacks:
            attack(Path(tmp))
    return sum(1 for *_, ok in ROWS if not ok)
