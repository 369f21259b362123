"""Each user's and each project's share of a server-wide cap (open streams, code uploads,
checkpoint downloads). Without shares a cap is first come, first served: one viewer
following queued jobs, or one member trickling uploads, holds every place and every
other project gets 429. Here one project holds at most ``RAYDOCK_PROJECT_SHARE`` of a
cap and one user at most ``RAYDOCK_USER_SHARE`` of it (at least one place each); a
server admin counts towards the server-wide cap only. Places are taken and given back
from the event loop and from worker threads, under one lock."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from api.errors import Busy
from service.tenancy.caller import Caller


def share_of(limit: int, fraction: float) -> int:
    return max(1, int(limit * fraction))


@dataclass(frozen=True)
class Cap:
    """What a cap is called in its refusals: ``noun`` ("streams"), its error ``code``,
    the setting of its server-wide limit, and what a refused client can do instead."""

    noun: str
    code: str
    setting: str
    hint: str
    retry_after_s: int = 5


class Shares:
    def __init__(self, cap: Cap, limit: int, project_share: float, user_share: float) -> None:
        self.cap, self.limit = cap, limit
        self.per_project, self.per_user = share_of(limit, project_share), share_of(limit, user_share)
        self._lock = threading.Lock()
        self._total = 0
        self._projects: Counter[str] = Counter()
        self._users: Counter[str] = Counter()

    @property
    def in_use(self) -> int:
        return self._total

    def take(self, caller: Caller, project: str) -> Callable[[], None]:
        """A place for ``caller`` acting in ``project``; the returned function gives it back
        (once, however often called). Raises the cap's 429 when the server, the project or
        the user holds all it may."""
        user = None if caller.admin else caller.name
        with self._lock:
            refusal = self._refusal(user, project)
            if refusal is not None:
                raise refusal
            self._total += 1
            if user is not None:
                self._projects[project] += 1
                self._users[user] += 1
        given_back = threading.Event()

        def release() -> None:
            with self._lock:
                if given_back.is_set():
                    return
                given_back.set()
                self._total -= 1
                if user is not None:
                    _drop(self._projects, project)
                    _drop(self._users, user)

        return release

    def _refusal(self, user: str | None, project: str) -> Busy | None:
        cap, noun = self.cap, self.cap.noun
        if self._total >= self.limit:
            held, limit = self._total, self.limit
            said = f"The server has {held} {noun} open, its limit ({cap.setting}={limit})."
            which = "server"
        elif user is not None and self._users[user] >= self.per_user:
            held, limit, which = self._users[user], self.per_user, "user"
            said = f"You hold {held} {noun}, your share of the server's {self.limit} (RAYDOCK_USER_SHARE of {cap.setting})."
        elif user is not None and self._projects[project] >= self.per_project:
            held, limit, which = self._projects[project], self.per_project, "project"
            said = (
                f"Project {project!r} holds {held} {noun}, its share of the server's {self.limit} "
                f"(RAYDOCK_PROJECT_SHARE of {cap.setting})."
            )
        else:
            return None
        return Busy(
            f"{said} {cap.hint} Retry after {cap.retry_after_s} s, as the Retry-After header says.",
            code=cap.code,
            retry_after_s=cap.retry_after_s,
            details=[{"share": which, "held": held, "limit": limit}],
        )


def _drop(counter: Counter[str], key: str) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


STREAMS = Cap(
    "streams",
    "too_many_streams",
    "RAYDOCK_MAX_STREAMS",
    "Close a stream, poll instead (GET .../metrics?since=, GET .../logs?offset=), or wait for one to end.",
)
UPLOADS = Cap(
    "code uploads",
    "too_many_uploads",
    "RAYDOCK_MAX_CONCURRENT_UPLOADS",
    "Nothing was read; upload again once one of them has ended.",
)
DOWNLOADS = Cap(
    "checkpoint downloads",
    "too_many_downloads",
    "RAYDOCK_MAX_CONCURRENT_DOWNLOADS",
    "Wait for a download to end.",
)
