"""Reading a job's metric series: pages in seq order, and a downsampled series for charts.

A page is one indexed range query on ``(job_id, seq)``. A downsampled series keeps the
first report alone, then splits the rest into buckets of consecutive reports, each sent as
its last report with its count, first seq and each numeric metric's min and max, so a chart
drawn from ``max_points`` points keeps the series' shape and every extreme. Buckets are
aligned to the blocks ``service/events/rollups.py`` keeps (their width is a multiple of one
block size, at most 1.5 times the narrowest width that fits), so a bucket's extremes are
read from a few block rows rather than from every report: the cost follows ``max_points``,
not the series' length. Seqs are gap-free, so a bucket's bounds and count are arithmetic.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from api.schemas import MetricPoint
from service.db.event_models import MetricRow
from service.events import rollups

PAGE_DEFAULT = 1000
PAGE_MAX = 10_000
POINTS_MAX = 10_000
SEQ_MAX = 2**31 - 1  # the seq column is a 32-bit integer: larger bounds are clamped, not sent

_COLUMNS = (MetricRow.seq, MetricRow.attempt, MetricRow.ts, MetricRow.step, MetricRow.epoch, MetricRow.values)


def _point(r: Any, **extra: Any) -> MetricPoint:
    return MetricPoint(seq=r.seq, attempt=r.attempt, ts=r.ts, step=r.step, epoch=r.epoch, metrics=r.values, **extra)


def page(s: Session, job_id: str, since: int, limit: int) -> tuple[list[MetricPoint], bool]:
    """Reports with seq > since, at most ``limit``, and whether more follow."""
    since = min(since, SEQ_MAX)
    rows = s.execute(
        select(*_COLUMNS)
        .where(MetricRow.job_id == job_id, MetricRow.seq > since)
        .order_by(MetricRow.seq)
        .limit(limit + 1)
    ).all()
    return [_point(r) for r in rows[:limit]], len(rows) > limit


def layout(lo: int, hi: int, max_points: int) -> tuple[int, int]:
    """(width, level) of the buckets for reports ``lo..hi`` (``lo`` alone, the rest in
    buckets ``seq // width``): the widest rollup level whose blocks tile buckets at most
    1.5 times the narrowest width that fits in ``max_points`` (a few blocks a bucket);
    level 0 (single reports) when even level 1 blocks are wider than that."""
    buckets = max_points - 1
    least = hi + 1 if buckets == 1 else -(-(hi - lo) // (buckets - 1))
    for level in range(rollups.LEVELS, 0, -1):
        size = 1 << rollups.shift(level)
        width = -(-least // size) * size
        if 2 * width <= 3 * least or (level == 1 and size <= least):
            return width, level
    return least, 0


def downsample(s: Session, job_id: str, since: int, max_points: int, until: int | None = None) -> list[MetricPoint]:
    """Reports with since < seq <= until (all after since when until is None) in at most
    ``max_points`` points: the first report alone, then aligned buckets (``layout``), each as
    its last report with the bucket's count, first seq, and min and max per numeric metric."""
    since, until = min(since, SEQ_MAX), SEQ_MAX if until is None else min(until, SEQ_MAX)
    # Two index probes (a min and a max in one query scan the range on SQLite).
    window = (
        select(MetricRow.seq).where(MetricRow.job_id == job_id, MetricRow.seq > since, MetricRow.seq <= until).limit(1)
    )
    lo, hi = s.scalar(window.order_by(MetricRow.seq)), s.scalar(window.order_by(MetricRow.seq.desc()))
    if lo is None or hi - lo + 1 <= max_points:
        return page(s, job_id, since, min(max_points, until - since))[0]
    dialect = s.get_bind().dialect.name
    if not rollups.supported(s) or dialect not in _SINGLES:
        return _downsample_here(s, job_id, since, max_points, hi)
    width, level = layout(lo, hi, max_points)
    pieces, singles = rollups.cover(lo + 1, hi, level)
    extremes = rollups.extremes_by_bucket(s, job_id, pieces, width)
    for a, e in singles:
        for b, key, mn, mx in s.execute(text(_SINGLES[dialect]), {"job": job_id, "a": a, "e": e, "w": width}):
            rollups.merge(extremes, b, key, mn, mx)
    buckets = range((lo + 1) // width, hi // width + 1)
    lasts = [min((b + 1) * width - 1, hi) for b in buckets]
    rows = {r.seq: r for r in _reports(s, dialect, job_id, [lo, *lasts])}
    out = [_point(rows[lo])]
    for b, last in zip(buckets, lasts):
        first, found = max(b * width, lo + 1), extremes.get(b, {})
        low, high = {k: mm[0] for k, mm in found.items()}, {k: mm[1] for k, mm in found.items()}
        out.append(_point(rows[last], points=last - first + 1, first_seq=first, metrics_min=low, metrics_max=high))
    return out


def _reports(s: Session, dialect: str, job_id: str, seqs: list[int]) -> Any:
    """These reports, one index probe each."""
    if dialect == "postgresql":
        # One array parameter (hundreds of IN parameters cost more than the query), each
        # element looked up in a LATERAL probe: with statistics not yet updated after fast
        # inserts, PostgreSQL may otherwise filter the job's every report by the list.
        return s.execute(text(_PROBES).columns(*_COLUMNS), {"job": job_id, "seqs": seqs})
    return s.execute(select(*_COLUMNS).where(MetricRow.job_id == job_id, MetricRow.seq.in_(seqs)))


_PROBES = """SELECT m.seq, m.attempt, m.ts, m.step, m.epoch, m."values" FROM unnest(CAST(:seqs AS integer[])) AS w(seq)
CROSS JOIN LATERAL (SELECT * FROM metrics WHERE job_id = :job AND seq = w.seq LIMIT 1) AS m"""


# Extremes of single reports a..e by bucket, from their JSON (the ends of a range, or all
# of a short one).
_SINGLES = {
    "sqlite": """SELECT m.seq / :w AS b, j.key, min(j.value), max(j.value)
FROM metrics m, json_each(m."values") j
WHERE m.job_id = :job AND m.seq BETWEEN :a AND :e AND j.type IN ('integer', 'real') GROUP BY b, j.key""",
    "postgresql": """SELECT m.seq / :w AS b, j.key, min((j.value::text)::float8), max((j.value::text)::float8)
FROM metrics m, json_each(m."values"::json) j
WHERE m.job_id = :job AND m.seq BETWEEN :a AND :e AND json_typeof(j.value) = 'number' GROUP BY b, j.key""",
}


def _downsample_here(s: Session, job_id: str, since: int, max_points: int, until: int) -> list[MetricPoint]:
    """The same buckets computed in Python from every report, for other databases."""
    q = select(*_COLUMNS).where(MetricRow.job_id == job_id, MetricRow.seq > since, MetricRow.seq <= until)
    rows = s.execute(q.order_by(MetricRow.seq)).all()
    width, _ = layout(rows[0].seq, rows[-1].seq, max_points)
    out = [_point(rows[0])]
    groups: dict[int, list[Any]] = {}
    for r in rows[1:]:
        groups.setdefault(r.seq // width, []).append(r)
    for bucket in groups.values():
        low: dict[str, float] = {}
        high: dict[str, float] = {}
        for r in bucket:
            for key, value in rollups.numbers(r.values):
                if key not in low or value < low[key]:
                    low[key] = value
                if key not in high or value > high[key]:
                    high[key] = value
        out.append(_point(bucket[-1], points=len(bucket), first_seq=bucket[0].seq, metrics_min=low, metrics_max=high))
    return out
