"""Wakes across replicas: a submit (or a cancel) accepted by one replica wakes the monitor
on whichever replica holds it, at once rather than at its next tick.

On PostgreSQL ``notify`` sends a ``NOTIFY`` on CHANNEL, and each replica runs ``listen``
as a background unit of its own (not leased: the wake must reach whichever replica holds
the monitor): it waits on a connection of its own (``LISTEN``) and calls ``on_wake`` for
what arrives. A notification is a hint, never state: one lost (a listener reconnecting, the
database restarting) costs at most one monitor interval, as the monitor reads everything
from the store on every tick. SQLite is one process: the in-process wake is all there is,
and neither method is used there (``enabled`` is False)."""

from __future__ import annotations

import logging
import threading
from typing import Callable

from sqlalchemy import text
from sqlalchemy.engine import Engine

log = logging.getLogger("raydock.wakes")

CHANNEL = "raydock_wake"
LISTEN_WAIT_S = 1.0  # one step of the listening unit waits at most this long


class Wakes:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.enabled = engine.dialect.name == "postgresql"
        self._conn = None  # the listener's own psycopg connection, made on its first step
        self._stopping = False
        self._busy = False  # a step is waiting on the connection
        self._lock = threading.Lock()

    def notify(self) -> None:
        """Wake every replica's listener (after the caller's transaction committed); a
        failure is logged, never raised: the monitor's own tick finds the work anyway."""
        if not self.enabled:
            return
        try:
            with self.engine.begin() as c:
                c.execute(text("SELECT pg_notify(:channel, '')"), {"channel": CHANNEL})
        except Exception as exc:  # noqa: BLE001 - a hint lost costs one monitor interval
            log.warning("could not wake the other replicas (the monitor's next tick finds the work): %s", exc)

    def listen(self, on_wake: Callable[[], None]) -> None:
        """Wait up to LISTEN_WAIT_S for a notification, calling ``on_wake`` if one came."""
        import psycopg  # the postgres extra: only a server on PostgreSQL listens

        with self._lock:
            if self._stopping:
                return
            self._busy = True
        try:
            if self._conn is None or self._conn.closed:
                dsn = self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
                self._conn = psycopg.connect(dsn, autocommit=True)
                self._conn.execute(f"LISTEN {CHANNEL}")
            for _ in self._conn.notifies(timeout=LISTEN_WAIT_S, stop_after=1):
                on_wake()
        except psycopg.Error:
            self._close()  # made again at the next step
            raise
        finally:
            with self._lock:
                self._busy = False
                if self._stopping:
                    self._close()

    def stop(self) -> None:
        """At the unit's stop: the connection is closed now, or by the step waiting on it
        as it returns (never under a thread that waits on it)."""
        with self._lock:
            self._stopping = True
            if not self._busy:
                self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            conn.close()
