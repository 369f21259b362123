"""The webhook fan-out: each new event of the log becomes a ``webhook_deliveries`` row
per subscription that wants it, written before anything is sent (so a server killed
mid-post posts again after its restart). A stored cursor says how far the log is done."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, tuple_
from sqlalchemy.orm import sessionmaker

from service.db.eventlog_models import DeliveryRow, EventLogRow
from service.db.leases import Fence
from service.db.models import ServerMetaRow, aware, utcnow
from service.eventlog.subscriptions import Subscription, job_subscriptions

FANOUT_BATCH = 500
FANOUT_BATCHES = 20  # a burst beyond this many batches waits for the next pass
# An event id is taken from a sequence before its transaction commits, so on PostgreSQL an
# older id can appear after a newer one. The fan-out cursor stays behind events younger than
# this (they are looked at again; a delivery row is made once per subscription and event).
SETTLE_S = 10.0
CURSOR_KEY = "webhook_fanout_cursor"


def fan_out(sessions: sessionmaker, server: list[Subscription], fence: Fence | None = None) -> int:
    """Make the delivery rows of new events, a batch per transaction (at most
    FANOUT_BATCHES a pass); returns how many. With ``fence``, each batch only while the
    deliverer's lease is held (LeaseLost otherwise)."""
    with sessions.begin() as s:
        meta = s.get(ServerMetaRow, CURSOR_KEY)
        start = int(meta.value) if meta is not None else 0  # the log began with its migration: at 0
    made, settling = 0, False
    for _ in range(FANOUT_BATCHES):
        n, start, settling, full = _batch(sessions, server, start, settling, fence)
        made += n
        if not full:
            break
    return made


def _batch(
    sessions: sessionmaker, server: list[Subscription], after: int, settling: bool, fence: Fence | None = None
) -> tuple[int, int, bool, bool]:
    """Fan out the events after ``after``; the stored cursor moves past them while none
    before is still settling. Returns (rows made, last id, settling, batch full)."""
    with sessions.begin() as s:
        if fence is not None:
            fence.hold(s)
        q = select(EventLogRow).where(EventLogRow.id > after).order_by(EventLogRow.id).limit(FANOUT_BATCH)
        events = list(s.scalars(q))
        if not events:
            return 0, after, settling, False
        by_job = job_subscriptions(s, {e.job_id for e in events if e.job_id})
        wanted = [
            (sub.id, e.id) for e in events for sub in (*server, *by_job.get(e.job_id or "", ())) if sub.wants(e.type)
        ]
        new: list[DeliveryRow] = []
        if wanted:
            pairs = tuple_(DeliveryRow.subscription, DeliveryRow.event_id).in_(wanted)
            have = {tuple(r) for r in s.execute(select(DeliveryRow.subscription, DeliveryRow.event_id).where(pairs))}
            new = [DeliveryRow(subscription=sub, event_id=eid) for sub, eid in wanted if (sub, eid) not in have]
            s.add_all(new)
        settled_before = utcnow() - timedelta(seconds=SETTLE_S)
        cursor = None
        for e in events:
            settling = settling or aware(e.at) >= settled_before
            if not settling:
                cursor = e.id
        if cursor is not None:
            meta = s.get(ServerMetaRow, CURSOR_KEY)
            if meta is None:
                s.add(ServerMetaRow(key=CURSOR_KEY, value=str(cursor)))
            else:
                meta.value = str(cursor)
    return len(new), events[-1].id, settling, len(events) == FANOUT_BATCH
