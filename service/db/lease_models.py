"""Who runs each piece of background work (service/background/): one lease row per unit,
held by one replica at a time, and one row per live replica. Times are seconds since the
epoch on the database's clock (``service/db/leases.py``), so hosts whose clocks differ
still agree on when a lease expires."""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, String
from sqlalchemy.orm import Mapped, mapped_column

from service.db.models import Base

REPLICA_ID_CHARS = 160  # host (up to 128 here) / pid / random


class LeaseRow(Base):
    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)  # the unit's name
    holder: Mapped[str | None] = mapped_column(String(REPLICA_ID_CHARS))  # None: free
    # Fencing: grows by one at every change of holder; a write made under an older token is refused.
    token: Mapped[int] = mapped_column(BigInteger, default=0)
    since: Mapped[float | None] = mapped_column(Float)  # when the holder took it
    expires_at: Mapped[float] = mapped_column(Float, default=0.0)


class ReplicaRow(Base):
    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(REPLICA_ID_CHARS), primary_key=True)
    started_at: Mapped[float] = mapped_column(Float)
    seen_at: Mapped[float] = mapped_column(Float, index=True)
