"""One writer at a time inside the process, handed over at once. SQLite lets one
connection write at a time; the others wait in its busy handler, which sleeps in growing
steps (up to 100 ms) and so turns a burst of concurrent submits into long tails. Here a
connection takes a process-wide lock at its first write and gives it back when its
transaction ends, so the next writer starts the moment the last one commits; SQLite's
own busy wait remains for writers in other processes (``raydock gc``, a second server)."""

from __future__ import annotations

import threading

from sqlalchemy import event
from sqlalchemy.engine import Engine

WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")
WAIT_S = 30.0  # as long as SQLite's busy timeout: past it, SQLite decides
HELD = "raydock_write_lock"


def serialize_writes(engine: Engine) -> None:
    lock = threading.Lock()

    def take(conn, cursor, statement, parameters, context, executemany) -> None:
        if conn.info.get(HELD) or not statement.lstrip()[:7].upper().startswith(WRITES):
            return
        if lock.acquire(timeout=WAIT_S):
            conn.info[HELD] = True

    def give(info: dict) -> None:
        if info.pop(HELD, False):
            lock.release()

    event.listen(engine, "before_cursor_execute", take)
    event.listen(engine, "commit", lambda conn: give(conn.info))
    event.listen(engine, "rollback", lambda conn: give(conn.info))
    # A connection returned to the pool mid-transaction is rolled back there.
    event.listen(engine.pool, "reset", lambda dbapi_conn, record, reset_state: give(record.info))
    event.listen(engine.pool, "checkin", lambda dbapi_conn, record: give(record.info))
