"""How the commands write numbers, times, a job's progress and its status for a person."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from rich.text import Text

from api.schemas import REPORTS_UNIT, JobPublic, JobStatus

STATUS_STYLE = {
    JobStatus.SUCCEEDED: "green",
    JobStatus.FAILED: "red",
    JobStatus.RUNNING: "cyan",
    JobStatus.CANCELLED: "yellow",
}


def num(v: Any) -> str:
    """A metric or value: a float to 4 significant digits (whole from 10,000 up, where
    an exponent reads worse), anything else as is."""
    if isinstance(v, float):
        return f"{v:.0f}" if 1e4 <= abs(v) < 1e15 else f"{v:.4g}"
    return "" if v is None else str(v)


def values(config: dict[str, Any]) -> str:
    return ", ".join(f"{k}={num(v)}" for k, v in config.items())


def duration(seconds: float | None) -> str:
    """``45s``, ``12m05s``, ``3h07m``, ``2d04h``: short enough for a table column."""
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def runtime(job: JobPublic, now: datetime | None = None) -> float | None:
    """Seconds since the job started, up to its end; None before it started."""
    if job.started_at is None:
        return None
    end = job.finished_at or now or datetime.now(timezone.utc)
    return (end - job.started_at).total_seconds()


def when(at: datetime, now: datetime | None = None) -> str:
    """A moment, as short as a list needs: ``14:05`` today, ``11-24 14:05`` this year."""
    local, today = at.astimezone(), (now or datetime.now(timezone.utc)).astimezone()
    if local.date() == today.date():
        return local.strftime("%H:%M")
    return local.strftime("%m-%d %H:%M" if local.year == today.year else "%Y-%m-%d")


def progress(job: JobPublic) -> str:
    """``epoch 3/8``, ``step 120/500`` or ``report 4/20``: how far the job is in the unit its
    spec counts in (a search: the newest report of any trial, against one trial's budget)."""
    unit, total = length(job.spec)
    m = job.latest_metrics or {}
    if total is None and "step" in m and "epoch" not in m:
        unit = "step"
    done = m.get(unit)
    if done is None and (total is None or job.status.is_terminal()):
        return ""  # nothing to count, or a job that ended before its first report
    return f"{unit_word(unit)} {'-' if done is None else num(done)}" + (f"/{total}" if total else "")


def length(spec: dict[str, Any]) -> tuple[str, int | None]:
    """The reported unit a job's progress counts in and how many of it there are (None: the
    loop's own end), from its spec as stored: a search's is one trial's budget, in epochs,
    steps or reports (Tune's ``training_iteration``)."""
    if spec.get("kind") == "tune":
        budget = spec.get("budget") or {}
        for unit, key in (("epoch", "epochs"), ("step", "steps"), (REPORTS_UNIT, "reports")):
            if budget.get(key):
                return unit, budget[key]
        return "epoch", None
    if spec.get("max_steps"):
        return "step", spec["max_steps"]
    return "epoch", spec.get("epochs")


def unit_word(unit: str) -> str:
    """What a person reads for a reported unit: ``report`` for Tune's ``training_iteration``."""
    return "report" if unit == REPORTS_UNIT else unit


def status_text(job: JobPublic) -> str:
    """The status with its queue place: ``QUEUED #3``."""
    s = job.status.value
    return f"{s} #{job.queue_position}" if job.status == JobStatus.QUEUED and job.queue_position else s


def status_style(status: JobStatus) -> str:
    return STATUS_STYLE.get(status, "")


def widest(header: str, cells: list[str]) -> int:
    """A column's width that shows its header and every cell whole: the min_width of a
    column rich must not shrink when the terminal is narrow (an id, a number)."""
    return max([len(header), *(len(c) for c in cells)])


def cut(text: str, style: str = "") -> Text:
    """A cell of a column that gives way on a narrow terminal: one line, cut with an
    ellipsis (its column is left wrappable, so rich narrows it before the others)."""
    return Text(text, style=style, no_wrap=True, overflow="ellipsis")
