"""A cron expression in a time zone, read by cronsim (the parser healthchecks.io runs):
when it fires next, and the latest tick at or before a moment. Five fields (minute
resolution) or a shorthand (``@daily``); a sixth field for seconds is refused, so a
schedule fires at most once a minute. Daylight-saving changes follow cron's own rules."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from api.errors import InvalidSpec
from api.schemas.schedules import NICKNAMES


def fields(expr: str) -> str:
    """The expression as five fields: a shorthand expanded, spaces normalised."""
    expr = " ".join(expr.split())
    return NICKNAMES.get(expr.lower(), expr)


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidSpec(
            f"timezone {name!r} is not an IANA time zone the server knows; use a name such as UTC or Europe/Berlin.",
            code="invalid_timezone",
        ) from exc


def check(expr: str, tz: str) -> None:
    """Refuse an expression cronsim cannot read, or one that never fires, with what to change."""
    five = fields(expr)
    if len(five.split()) != 5:
        raise InvalidSpec(
            f"cron {expr!r} has {len(five.split())} fields; give five (minute hour day-of-month month "
            "day-of-week, e.g. '0 3 * * *') or a shorthand such as @daily. Seconds are not scheduled.",
            code="invalid_cron",
        )
    try:
        next(CronSim(five, datetime.now(zone(tz))))
    except (CronSimError, StopIteration, ValueError, LookupError, OverflowError) as exc:  # any parser refusal: a 422
        raise InvalidSpec(f"cron {expr!r} cannot be read: {exc}", code="invalid_cron") from exc


def next_ticks(expr: str, tz: str, after: datetime, n: int) -> list[datetime]:
    """The next ``n`` ticks strictly after ``after``, in UTC."""
    it = CronSim(fields(expr), aware(after).astimezone(zone(tz)))
    out = []
    for tick in it:
        out.append(tick.astimezone(timezone.utc))
        if len(out) == n:
            break
    return out


def latest_tick(expr: str, tz: str, at: datetime) -> datetime:
    """The latest tick at or before ``at``, in UTC (cron has minute resolution: a tick is
    on a whole second, so one second past ``at``'s whole second includes ``at`` itself)."""
    start = aware(at).replace(microsecond=0) + timedelta(seconds=1)
    return next(CronSim(fields(expr), start.astimezone(zone(tz)), reverse=True)).astimezone(timezone.utc)


def aware(t: datetime) -> datetime:
    """SQLite hands back naive datetimes for what was stored as UTC."""
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
