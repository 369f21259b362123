"""Rollups of a job's metric series: for aligned blocks of reports, each numeric metric's
min and max over the block, at a few block sizes (level 1: 16 reports, each level above
4 times the one below, up to level 10: 4,194,304 reports).

Ingestion adds a batch's reports to the blocks they fall in, in the same transaction as
the reports (``add``), so a block holding only reports up to a stored seq is final. A
downsampled series (``service/events/reads/series.py``) reads whole blocks of one level for the bulk of
its range and a few smaller blocks and reports at its ends (``cover``), so its cost
follows the points it answers with, not the series' length.

Blocks are kept on SQLite and PostgreSQL (an upsert per touched block and metric); on
other databases ``supported`` is False and the series is downsampled from the reports.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from sqlalchemy import func, select, union_all
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from service.db.event_models import MetricRollupRow

BASE_SHIFT = 4  # level 1 blocks hold 2**4 reports
FANOUT_SHIFT = 2  # each level's blocks hold 2**2 blocks of the level below
LEVELS = 10
MIN_MAX = {"sqlite": (func.min, func.max), "postgresql": (func.least, func.greatest)}  # two-argument min/max

Extremes = dict[tuple[int, int, str], list[float]]  # (level, block, key) -> [min, max]


def shift(level: int) -> int:
    """log2 of the number of reports a block of ``level`` holds (level 0: one report)."""
    return 0 if level == 0 else BASE_SHIFT + FANOUT_SHIFT * (level - 1)


def supported(s: Session | Connection) -> bool:
    return _dialect(s) in MIN_MAX


def _dialect(s: Session | Connection) -> str:
    return (s.get_bind() if isinstance(s, Session) else s).dialect.name


def numbers(values: dict[str, Any]) -> Iterable[tuple[str, float]]:
    """The metrics that have extremes: finite numbers (not bools)."""
    for key, value in values.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            yield key, float(value)


def blocks(reports: Iterable[tuple[int, dict[str, Any]]]) -> Extremes:
    """Every level's blocks touched by these ``(seq, values)`` reports, with the extremes of
    these reports alone (``add`` merges them into what is stored)."""
    level: dict[tuple[int, str], list[float]] = {}
    for seq, values in reports:
        block = seq >> BASE_SHIFT
        for key, value in numbers(values):
            mm = level.get((block, key))
            if mm is None:
                level[(block, key)] = [value, value]
            elif value < mm[0]:
                mm[0] = value
            elif value > mm[1]:
                mm[1] = value
    out: Extremes = {(1, b, k): mm for (b, k), mm in level.items()}
    for n in range(2, LEVELS + 1):
        up: dict[tuple[int, str], list[float]] = {}
        for (b, k), (lo, hi) in level.items():
            mm = up.setdefault((b >> FANOUT_SHIFT, k), [lo, hi])
            mm[0], mm[1] = min(mm[0], lo), max(mm[1], hi)
        out.update({(n, b, k): mm for (b, k), mm in up.items()})
        level = up
    return out


def add(s: Session | Connection, job_id: str, rows: list[dict[str, Any]]) -> None:
    """Fold metric rows (as inserted: ``seq`` and ``values``) into the job's blocks. The
    caller holds the job's row lock (ingestion does), so no two writers merge one block."""
    pair = MIN_MAX.get(_dialect(s))
    touched = blocks((r["seq"], r["values"]) for r in rows)
    if pair is None or not touched:
        return
    s.execute(
        _upsert(_dialect(s), *pair),
        [
            {"job_id": job_id, "level": level, "block": block, "key": key, "vmin": lo, "vmax": hi}
            for (level, block, key), (lo, hi) in touched.items()
        ],
    )


def _upsert(dialect: str, least, greatest):
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert
    t = MetricRollupRow.__table__
    stmt = insert(t)
    return stmt.on_conflict_do_update(
        index_elements=[t.c.job_id, t.c.level, t.c.block, t.c.key],
        set_={"vmin": least(t.c.vmin, stmt.excluded.vmin), "vmax": greatest(t.c.vmax, stmt.excluded.vmax)},
    )


# ----------------------------------------------------------------------------- reading


Piece = tuple[int, int, int]  # (level, first block, last block)


def cover(first: int, last: int, top: int) -> tuple[list[Piece], list[tuple[int, int]]]:
    """Blocks of levels up to ``top`` and ranges of single reports that together cover
    seqs ``first..last`` once each: the widest whole blocks (one piece, first), then
    smaller ones at the ends (at most 2 * 3 blocks per level below the widest, and under
    16 reports per end)."""
    pieces: list[Piece] = []
    singles: list[tuple[int, int]] = []

    def walk(a: int, e: int, level: int) -> None:
        while a <= e and level >= 1:
            n = shift(level)
            b0, b1 = (a + (1 << n) - 1) >> n, ((e + 1) >> n) - 1
            if b0 <= b1:
                pieces.append((level, b0, b1))
                walk(a, (b0 << n) - 1, level - 1)
                walk((b1 + 1) << n, e, level - 1)
                return
            level -= 1
        if a <= e:
            singles.append((a, e))

    walk(first, last, top)
    return pieces, singles


def extremes_by_bucket(s: Session, job_id: str, pieces: list[Piece], width: int) -> dict[int, dict[str, list[float]]]:
    """Each bucket's (``seq // width``) [min, max] per metric over these pieces. Every block
    lies in one bucket (``width`` is a multiple of each block size), so the widest level's
    blocks are aggregated by the database and the few smaller ones merged here."""
    out: dict[int, dict[str, list[float]]] = {}
    if not pieces:
        return out
    (top, b0, b1), rest = pieces[0], pieces[1:]  # ``cover`` gives the one piece of the widest level first
    t = MetricRollupRow
    per = width >> shift(top)
    bucket = (t.block // per).label("b") if per > 1 else t.block.label("b")
    q = select(bucket, t.key, func.min(t.vmin), func.max(t.vmax)).where(
        t.job_id == job_id, t.level == top, t.block.between(b0, b1)
    )
    q = q.group_by(bucket, t.key)
    for b, key, lo, hi in s.execute(q):  # one row per (bucket, key): nothing to merge yet
        found = out.get(b)
        if found is None:
            found = out[b] = {}
        found[key] = [lo, hi]
    # One indexed range per smaller piece (an OR of them is read as a scan of the job's blocks).
    small = [
        select(t.level, t.block, t.key, t.vmin, t.vmax).where(t.job_id == job_id, t.level == lv, t.block.between(a, e))
        for lv, a, e in rest
    ]
    if small:
        for level, block, key, lo, hi in s.execute(union_all(*small)):
            merge(out, (block << shift(level)) // width, key, lo, hi)
    return out


def merge(out: dict[int, dict[str, list[float]]], bucket: int, key: str, lo: float, hi: float) -> None:
    mm = out.setdefault(bucket, {}).get(key)
    if mm is None:
        out[bucket][key] = [lo, hi]
    else:
        mm[0], mm[1] = min(mm[0], lo), max(mm[1], hi)
