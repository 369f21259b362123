"""Reading a job's metric series: pages in seq order, and a downsampled series for charts.

A page is one indexed range query on ``(job_id, seq)``. A downsampled series keeps the
first report, the last, and for each bucket of consecutive reports between them the
bucket's last report with each numeric metric's min and max over the bucket, so a chart
drawn from ``max_points`` points keeps the series' shape and every extreme. The buckets
are aggregated by the database (its JSON functions), so only the points sent are decoded.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from api.schemas import MetricPoint
from service.store import MetricRow

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
    rows = s.execute(select(*_COLUMNS).where(MetricRow.job_id == job_id, MetricRow.seq > since).order_by(MetricRow.seq).limit(limit + 1)).all()
    return [_point(r) for r in rows[:limit]], len(rows) > limit


def downsample(s: Session, job_id: str, since: int, max_points: int, until: int | None = None) -> list[MetricPoint]:
    """Reports with since < seq <= until (all after since when until is None) in at most ``max_points`` points: the first report alone,
    then buckets of equal seq ranges, each as its last report with the bucket's min and
    max per numeric metric. On SQLite and PostgreSQL the buckets are computed in SQL
    (the JSON of every report is read by the database, not decoded here)."""
    since, until = min(since, SEQ_MAX), SEQ_MAX if until is None else min(until, SEQ_MAX)
    ends = s.execute(select(func.min(MetricRow.seq), func.max(MetricRow.seq)).where(MetricRow.job_id == job_id, MetricRow.seq > since, MetricRow.seq <= until)).one()
    lo, hi = ends
    if lo is None or hi - lo + 1 <= max_points:
        return page(s, job_id, since, min(max_points, until - since))[0]
    dialect = s.get_bind().dialect.name
    if dialect not in _EXTREMES:
        return _downsample_here(s, job_id, since, max_points, hi)
    params = {"job": job_id, "lo": lo, "hi": hi, "b": max_points - 1, "span": hi - lo}
    buckets = s.execute(text(_BUCKETS), params).all()
    low: dict[int, dict[str, float]] = {}
    high: dict[int, dict[str, float]] = {}
    for b, key, mn, mx in s.execute(text(_EXTREMES[dialect]), params):
        low.setdefault(b, {})[key], high.setdefault(b, {})[key] = mn, mx
    last = {r.seq: r for r in s.execute(select(*_COLUMNS).where(MetricRow.job_id == job_id, MetricRow.seq.in_([lo] + [b.last for b in buckets])))}
    out = [_point(last[lo])]
    for b in buckets:
        out.append(_point(last[b.last], points=b.n, first_seq=b.first, metrics_min=low.get(b.b, {}), metrics_max=high.get(b.b, {})))
    return out


# The bucket of a report after the first one (seq lo): equal seq ranges over (lo, lo + span].
_BUCKET = "((m.seq - :lo - 1) * :b) / :span"
_BUCKETS = f"""SELECT {_BUCKET} AS b, min(m.seq) AS first, max(m.seq) AS last, count(*) AS n
FROM metrics m WHERE m.job_id = :job AND m.seq > :lo AND m.seq <= :hi GROUP BY b ORDER BY b"""
_EXTREMES = {
    "sqlite": f"""SELECT {_BUCKET} AS b, j.key, min(j.value), max(j.value)
FROM metrics m, json_each(m."values") j
WHERE m.job_id = :job AND m.seq > :lo AND m.seq <= :hi AND j.type IN ('integer', 'real') GROUP BY b, j.key""",
    "postgresql": f"""SELECT {_BUCKET} AS b, j.key, min((j.value::text)::float8), max((j.value::text)::float8)
FROM metrics m, json_each(m."values"::json) j
WHERE m.job_id = :job AND m.seq > :lo AND m.seq <= :hi AND json_typeof(j.value) = 'number' GROUP BY b, j.key""",
}


def _downsample_here(s: Session, job_id: str, since: int, max_points: int, until: int) -> list[MetricPoint]:
    """The same buckets computed in Python, for other databases."""
    q = select(*_COLUMNS).where(MetricRow.job_id == job_id, MetricRow.seq > since, MetricRow.seq <= until)
    rows = s.execute(q.order_by(MetricRow.seq)).all()
    lo, span, b = rows[0].seq, rows[-1].seq - rows[0].seq, max_points - 1
    out = [_point(rows[0])]
    groups: dict[int, list[Any]] = {}
    for r in rows[1:]:
        groups.setdefault((r.seq - lo - 1) * b // span, []).append(r)
    for bucket in groups.values():
        low: dict[str, float] = {}
        high: dict[str, float] = {}
        for r in bucket:
            for key, value in r.values.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    continue
                if key not in low or value < low[key]:
                    low[key] = value
                if key not in high or value > high[key]:
                    high[key] = value
        out.append(_point(bucket[-1], points=len(bucket), first_seq=bucket[0].seq, metrics_min=low, metrics_max=high))
    return out
