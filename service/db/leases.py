"""Leases on the background units: which replica runs each, with a fencing token.

One row per unit (``leases``). ``claim`` takes or renews every free, expired or own lease
in one UPDATE (the token grows by one where the holder changes) and says which this
replica holds; ``release`` frees them all in one UPDATE; ``Fence.hold`` is a write's proof,
inside its own transaction, that the lease is still held under the token the step began
with: on PostgreSQL its UPDATE locks the lease row until the transaction ends, so a
take-over waits for the write, or the write sees the take-over and is refused
(``LeaseLost``). Expiry is decided on the database's clock, never a host's.

SQLite is one process: a lease held there by a process of this host that no longer exists
is taken at once, so a restarted server does not wait a TTL for its own leases, and a second
live server on the same SQLite file is told (once, in its log) that replicas need PostgreSQL."""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
from dataclasses import dataclass

from sqlalchemy import Float, case, cast, delete, extract, func, or_, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from service.db.lease_models import REPLICA_ID_CHARS, LeaseRow, ReplicaRow

log = logging.getLogger("raydock.leases")

FORGET_REPLICA_S = 3600.0  # a replica not seen for this long leaves the listing
MAX_LISTED = 100  # replicas listed at most


class LeaseLost(RuntimeError):
    """This replica no longer holds the lease its step began under: the write is refused."""


@functools.cache
def _replica_id(pid: int) -> str:
    return f"{socket.gethostname()[:128]}/{pid}/{secrets.token_hex(4)}"


def replica_id() -> str:
    """This process's id as a holder: its host, its pid and a random part (made once per process)."""
    return _replica_id(os.getpid())


def db_now(dialect: str):
    """Seconds since the epoch on the database's clock."""
    if dialect == "sqlite":
        return (func.julianday("now") - 2440587.5) * 86400.0
    return cast(extract("epoch", func.clock_timestamp()), Float)


@dataclass(frozen=True)
class Fence:
    """The lease ``name`` as held by ``holder`` under ``token``, handed to the unit's step."""

    name: str
    holder: str
    token: int

    def hold(self, s: Session | Connection) -> None:
        """Prove, in ``s``'s transaction, that the lease is still ours under this token
        (the row stays locked until it ends); raises LeaseLost otherwise."""
        held = s.execute(
            update(LeaseRow)
            .where(LeaseRow.name == self.name, LeaseRow.holder == self.holder, LeaseRow.token == self.token)
            .values(token=LeaseRow.token),
            execution_options={"synchronize_session": False},
        ).rowcount
        if held != 1:
            raise LeaseLost(f"lease {self.name!r} is no longer held by {self.holder} under token {self.token}")


class Leases:
    """The leases of one replica (``holder``) on ``engine``, each held for ``ttl_s``."""

    def __init__(self, engine: Engine, ttl_s: float, holder: str | None = None) -> None:
        self.engine = engine
        self.ttl_s = ttl_s
        self.holder = (holder or replica_id())[:REPLICA_ID_CHARS]
        self.dialect = engine.dialect.name
        self._known: set[str] = set()
        self._told = False  # a second server on SQLite is said once

    def claim(self, names: list[str]) -> dict[str, Fence]:
        """Take or renew what is free, expired or ours among ``names``: the fences held now."""
        now = db_now(self.dialect)
        with self.engine.begin() as c:
            self._ensure(c, names)
            takeable = [LeaseRow.holder == self.holder, LeaseRow.holder.is_(None), LeaseRow.expires_at < now]
            if self.dialect == "sqlite" and (dead := self._dead_holders(c, names)):
                takeable.append(LeaseRow.holder.in_(dead))
            mine = LeaseRow.holder == self.holder
            rows = c.execute(
                update(LeaseRow)
                .where(LeaseRow.name.in_(names), or_(*takeable))
                .values(
                    token=case((mine, LeaseRow.token), else_=LeaseRow.token + 1),
                    since=case((mine, LeaseRow.since), else_=now),
                    holder=self.holder,
                    expires_at=now + self.ttl_s,
                )
                .returning(LeaseRow.name, LeaseRow.token)
            ).all()
            _insert_missing(c, self.dialect, ReplicaRow, {"id": self.holder, "started_at": now, "seen_at": now})
            c.execute(update(ReplicaRow).where(ReplicaRow.id == self.holder).values(seen_at=now))
            c.execute(delete(ReplicaRow).where(ReplicaRow.seen_at < now - FORGET_REPLICA_S))
        if self.dialect == "sqlite" and len(rows) < len(names) and not self._told:
            self._told = True
            log.warning(
                "another raydock server holds background units on this SQLite store: SQLite is for one server "
                "process; replicas need PostgreSQL (RAYDOCK_DATABASE_URL=postgresql+psycopg://...). This one runs "
                "only the units it holds."
            )
        return {name: Fence(name, self.holder, token) for name, token in rows}

    def release(self) -> None:
        """Free every lease this replica holds (a graceful stop): another takes them at its next claim."""
        with self.engine.begin() as c:
            c.execute(
                update(LeaseRow).where(LeaseRow.holder == self.holder).values(holder=None, since=None, expires_at=0.0)
            )
            c.execute(delete(ReplicaRow).where(ReplicaRow.id == self.holder))

    def listing(
        self,
    ) -> tuple[float, list[tuple[str, float, float]], list[tuple[str, str | None, int, float | None, float]]]:
        """The database's clock now, the replicas seen (id, started, seen; newest first, at
        most MAX_LISTED) and every lease (name, holder, token, since, expires)."""
        with self.engine.connect() as c:
            now = c.scalar(select(db_now(self.dialect)))
            replicas = c.execute(
                select(ReplicaRow.id, ReplicaRow.started_at, ReplicaRow.seen_at)
                .order_by(ReplicaRow.seen_at.desc(), ReplicaRow.id)
                .limit(MAX_LISTED)
            ).all()
            leases = c.execute(
                select(LeaseRow.name, LeaseRow.holder, LeaseRow.token, LeaseRow.since, LeaseRow.expires_at).order_by(
                    LeaseRow.name
                )
            ).all()
        return now, [tuple(r) for r in replicas], [tuple(r) for r in leases]

    def _ensure(self, c: Connection, names: list[str]) -> None:
        """The lease rows (free), made on the first claim."""
        if self._known >= set(names):
            return
        existing = set(c.scalars(select(LeaseRow.name).where(LeaseRow.name.in_(names))))
        for name in set(names) - existing:
            _insert_missing(c, self.dialect, LeaseRow, {"name": name, "holder": None, "token": 0, "expires_at": 0.0})
        self._known |= set(names)

    def _dead_holders(self, c: Connection, names: list[str]) -> list[str]:
        """Holders of these leases that were processes of this host and are gone."""
        host = self.holder.split("/")[0]
        holders = c.scalars(
            select(LeaseRow.holder).where(
                LeaseRow.name.in_(names), LeaseRow.holder.is_not(None), LeaseRow.holder != self.holder
            )
        ).all()
        return sorted({h for h in holders if h.split("/")[0] == host and not _alive(h)})


def _alive(holder: str) -> bool:
    try:
        os.kill(int(holder.split("/")[1]), 0)
    except (IndexError, ValueError):
        return True  # not an id this code made: left to its TTL
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _insert_missing(c: Connection, dialect: str, table, values: dict) -> None:
    """INSERT ... ON CONFLICT DO NOTHING, on either engine (two replicas may make a row at once)."""
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert
    c.execute(insert(table).values(**values).on_conflict_do_nothing())
