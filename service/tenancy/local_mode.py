"""Local mode: with no RAYDOCK_API_TOKEN, a tokenless request on loopback acts as the
server admin, until a user other than ``admin`` is first given a token. From then on it
is over for good: a row in ``server_meta`` says so, written in the transaction that
made that token, so deleting every other user (or restarting) never brings it back.

Counted by tokens, not users, so the one command that creates a user and their first
token (``raydock user create``) runs whole in local mode."""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from service.db.models import ServerMetaRow, utcnow

ENDED_KEY = "local_mode_ended"  # its value: when it ended (ISO 8601)
RECHECK_S = 2.0  # how long "still local" is reused before the store is read again (another process may end it)


def end(s: Session) -> None:
    """End local mode in the caller's transaction (a no-op once it has ended)."""
    if s.get(ServerMetaRow, ENDED_KEY) is not None:
        return
    try:
        with s.begin_nested():  # a concurrent writer may end it first: theirs stands
            s.add(ServerMetaRow(key=ENDED_KEY, value=utcnow().isoformat()))
    except IntegrityError:
        pass


class LocalMode:
    def __init__(self, sessions: sessionmaker) -> None:
        self.sessions = sessions
        self._read: tuple[float, bool] = (float("-inf"), False)  # (when, ended)

    def ended_cached(self) -> bool | None:
        """``ended`` as last read, or None once it is due to be read again. An end is
        never read again: nothing undoes it."""
        at, ended = self._read
        return ended if ended or time.monotonic() - at < RECHECK_S else None

    def ended(self) -> bool:
        cached = self.ended_cached()
        if cached is not None:
            return cached
        with self.sessions() as s:
            ended = s.scalar(select(ServerMetaRow.key).where(ServerMetaRow.key == ENDED_KEY)) is not None
        self._read = (time.monotonic(), ended)
        return ended

    def forget(self) -> None:
        """Read the store on the next ask (this process just changed it)."""
        self._read = (float("-inf"), False)
