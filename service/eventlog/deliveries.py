"""Reading the webhook delivery log: one subscription's deliveries, newest first, and the
count of all deliveries by state (what a metrics exporter reads)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.schemas.eventlog import DeliveryList, DeliveryPublic
from service.db.eventlog_models import DeliveryRow


def page(s: Session, subscription: str, *, before: int | None = None, limit: int = 100) -> DeliveryList:
    q = select(DeliveryRow).where(DeliveryRow.subscription == subscription)
    if before is not None:
        q = q.where(DeliveryRow.id < before)
    rows = list(s.scalars(q.order_by(DeliveryRow.id.desc()).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    items = [
        DeliveryPublic(
            id=r.id,
            event_id=r.event_id,
            state=r.state,
            attempts=r.attempts,
            next_at=r.next_at if r.state == "pending" else None,
            last_status=r.last_status,
            last_error=r.last_error,
            last_duration_s=r.last_duration_s,
            created_at=r.created_at,
            delivered_at=r.delivered_at,
        )
        for r in rows
    ]
    return DeliveryList(subscription=subscription, items=items, next=rows[-1].id if more else None)
