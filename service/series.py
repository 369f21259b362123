"""Reading a job's metric series: pages in seq order, and a downsampled series for charts.

A page is one indexed range query on ``(job_id, seq)``. A downsampled series keeps the
first report, the last, and for each bucket of consecutive reports between them the
bucket's last report with each numeric metric's min and max over the bucket, so a chart
drawn from ``max_points`` points keeps the series' shape and every extreme.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.schemas import MetricPoint
from service.store import MetricRow

PAGE_DEFAULT = 1000
PAGE_MAX = 10_000
POINTS_MAX = 10_000

_COLUMNS = (MetricRow.seq, MetricRow.attempt, MetricRow.ts, MetricRow.step, MetricRow.epoch, MetricRow.values)


def _point(r: Any, **extra: Any) -> MetricPoint:
    return MetricPoint(seq=r.seq, attempt=r.attempt, ts=r.ts, step=r.step, epoch=r.epoch, metrics=r.values, **extra)


def page(s: Session, job_id: str, since: int, limit: int) -> tuple[list[MetricPoint], bool]:
    """Reports with seq > since, at most ``limit``, and whether more follow."""
    rows = s.execute(select(*_COLUMNS).where(MetricRow.job_id == job_id, MetricRow.seq > since).order_by(MetricRow.seq).limit(limit + 1)).all()
    return [_point(r) for r in rows[:limit]], len(rows) > limit


def downsample(s: Session, job_id: str, since: int, max_points: int) -> list[MetricPoint]:
    """Reports with seq > since in at most ``max_points`` points: the first report alone,
    then equal buckets of consecutive reports, each as its last report with the
    bucket's min and max per numeric metric."""
    rows = s.execute(select(*_COLUMNS).where(MetricRow.job_id == job_id, MetricRow.seq > since).order_by(MetricRow.seq)).all()
    if len(rows) <= max_points:
        return [_point(r) for r in rows]
    out = [_point(rows[0])]
    rest, buckets = len(rows) - 1, max_points - 1
    for b in range(buckets):
        lo, hi = 1 + b * rest // buckets, 1 + (b + 1) * rest // buckets
        if lo == hi:
            continue
        low: dict[str, float] = {}
        high: dict[str, float] = {}
        for r in rows[lo:hi]:
            for key, value in r.values.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    continue
                if key not in low or value < low[key]:
                    low[key] = value
                if key not in high or value > high[key]:
                    high[key] = value
        out.append(_point(rows[hi - 1], points=hi - lo, first_seq=rows[lo].seq, metrics_min=low, metrics_max=high))
    return out
