"""Who a user token names, remembered for a few seconds, so that a client polling a job
costs no token lookup (two queries and a hop to a worker thread) on every request.

Keyed by the token's sha256 (the raw token is never held). An answer is reused for at
most ``ttl_s`` (RAYDOCK_TOKEN_CACHE_S), never past the token's own expiry, and never
after a change to users, tokens or memberships made through this process (``Revision``,
bumped by ``service/tenancy/users.py`` and ``projects.py`` once the change is committed).
So a token revoked (or a member removed) through this replica stops working at once; one
revoked through another replica, or in the store by hand, within ``ttl_s``. Refusals are
not remembered: a token made a moment ago works at once."""

from __future__ import annotations

import time
from collections import OrderedDict
from datetime import timezone
from typing import Callable

from service.db.models import utcnow
from service.tenancy.caller import Caller

MAX_ENTRIES = 10_000  # distinct live tokens remembered; the oldest answer goes first past it


class Revision:
    """A counter of changes to who may do what, bumped after each is committed."""

    def __init__(self) -> None:
        self.value = 0

    def bump(self) -> None:
        self.value += 1


class CallerCache:
    def __init__(self, ttl_s: float, revision: Revision, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.revision, self.clock = ttl_s, revision, clock
        self._entries: OrderedDict[str, tuple[Caller, float, int]] = OrderedDict()

    def get(self, digest: str) -> Caller | None:
        entry = self._entries.get(digest)
        if entry is None:
            return None
        caller, until, revision = entry
        if revision != self.revision.value or self.clock() >= until:
            del self._entries[digest]
            return None
        return caller

    def put(self, digest: str, caller: Caller, revision: int) -> None:
        """``revision``: the counter as read before the lookup began, so a change committed
        while it ran leaves the answer stale at once."""
        if self.ttl_s <= 0:
            return
        now = self.clock()
        until = now + self.ttl_s
        if caller.token_expires_at is not None:
            expires = caller.token_expires_at
            expires = expires if expires.tzinfo else expires.replace(tzinfo=timezone.utc)
            until = min(until, now + (expires - utcnow()).total_seconds())
        self._entries.pop(digest, None)
        self._entries[digest] = (caller, until, revision)
        while len(self._entries) > MAX_ENTRIES:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
