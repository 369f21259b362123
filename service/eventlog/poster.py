"""One webhook post, whole, within one deadline: the name resolved and checked, a
connection to the address checked, the body sent and the answer's status read, all of it
within ``RAYDOCK_WEBHOOK_TIMEOUT_S``. httpx's timeouts bound each phase, each read even,
so a receiver answering a byte every few seconds would hold a post for ever; here the
whole post runs under ``asyncio.timeout`` and is cut off (its connection closed) at the
deadline.

A name is looked up on a thread of its own (the system's resolver blocks), at most as
many at once as the lane has slots, and an owner (a job, or a server webhook) has at
most one lookup running: a lookup that outlives its post's deadline keeps its thread
until the resolver gives up, and the owner's next post is refused meanwhile (tried again
after its backoff) rather than starting another. A slow name server so holds up the post
that asked, for at most the deadline, and never another owner's."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import httpx

from api.schemas.eventlog import DELIVERY_HEADER, EVENT_ID_HEADER, EVENT_TYPE_HEADER, SIGNATURE_HEADER
from service.eventlog import signing
from service.eventlog.subscriptions import Subscription
from service.eventlog.url_policy import check_url, literal_address, resolve
from service.settings import Settings

MAX_ERROR_CHARS = 500
TIMEOUT_SETTING = "RAYDOCK_WEBHOOK_TIMEOUT_S"


@dataclass(frozen=True)
class Post:
    delivery_id: int
    attempts: int
    subscription: Subscription
    event_id: int
    event_type: str
    body: bytes


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status: int | None
    error: str | None
    duration_s: float
    tried: bool = True  # False: not sent for want of a lookup thread, which costs the delivery no try


class Refused(Exception):
    """The post was not sent: its target is no webhook target (now), or cannot be looked up."""


class Busy(Refused):
    """The post was not sent: every lookup thread of its lane is taken (by other owners)."""


class Poster:
    """The posts of one lane: its own connections and its own resolver threads."""

    def __init__(self, settings: Settings, workers: int, lane: str):
        self.timeout_s = settings.webhooks.webhook_timeout_s
        self.allow_private = settings.webhooks.webhook_allow_private
        limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
        self._http = httpx.AsyncClient(follow_redirects=False, timeout=self.timeout_s, trust_env=False, limits=limits)
        self.workers, self.lane = workers, lane
        self._lookups: dict[str, threading.Thread] = {}  # owner -> its lookup, while it runs

    async def aclose(self) -> None:
        await self._http.aclose()

    async def post(self, post: Post) -> Outcome:
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout_s):
                status = await self._send(post)
        except TimeoutError:
            error = f"no complete answer within {TIMEOUT_SETTING} ({self.timeout_s:g} s): the post was cut off"
            return Outcome(False, None, error, time.monotonic() - started)
        except Refused as exc:
            error = f"refused: {exc}"[:MAX_ERROR_CHARS]
            return Outcome(False, None, error, time.monotonic() - started, tried=not isinstance(exc, Busy))
        except Exception as exc:  # noqa: BLE001 - any failure of one post is that delivery's, to retry
            return Outcome(False, None, f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS], time.monotonic() - started)
        ok = 200 <= status < 300
        error = None if ok else f"HTTP {status}" + (" (redirects are not followed)" if 300 <= status < 400 else "")
        return Outcome(ok, status, error, time.monotonic() - started)

    async def _send(self, post: Post) -> int:
        sub = post.subscription
        scheme, host, port = check_url(sub.url, allow_private=self.allow_private)
        address = await self._address(sub.owner, host, port)
        url = httpx.URL(sub.url)
        # To the address just checked, under the URL's name (Host, and TLS's SNI and certificate check).
        target, extensions = url.copy_with(host=address), {"sni_hostname": host} if scheme == "https" else {}
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "raydock-webhooks/1",
            EVENT_ID_HEADER: str(post.event_id),
            EVENT_TYPE_HEADER: post.event_type,
            DELIVERY_HEADER: str(post.delivery_id),
            SIGNATURE_HEADER: signing.header(sub.secret, post.body),
            "Host": url.netloc.decode("ascii"),
        }
        request = self._http.build_request("POST", target, content=post.body, headers=headers, extensions=extensions)
        # A stream, closed unread: whatever the receiver answers with, only its status is taken.
        response = await self._http.send(request, stream=True)
        await response.aclose()
        return response.status_code

    async def _address(self, owner: str, host: str, port: int) -> str:
        if literal_address(host) is not None:
            address, problem = resolve(host, port, allow_private=self.allow_private)  # an address: no lookup
        else:
            address, problem = await self._lookup(owner, host, port)
        if problem:
            raise Refused(problem)
        return address

    def _lookup(self, owner: str, host: str, port: int) -> asyncio.Future:
        """``resolve`` on a thread of its own: a daemon, so a lookup the resolver holds
        for long delays neither the lane nor the server's exit."""
        self._lookups = {o: t for o, t in self._lookups.items() if t.is_alive()}
        if owner in self._lookups:
            raise Refused(f"an earlier lookup of {host!r} has not finished; it is tried again later")
        if len(self._lookups) >= self.workers:
            raise Busy(f"{len(self._lookups)} lookups are under way; {host!r} is looked up later")
        loop, found = asyncio.get_running_loop(), asyncio.get_running_loop().create_future()

        def settle(result: tuple[str | None, str | None] | None, error: BaseException | None) -> None:
            if found.done():
                return  # its post was cut off: nobody waits
            if error is not None:
                found.set_exception(error)
            else:
                found.set_result(result)

        def run() -> None:
            try:
                result, error = resolve(host, port, allow_private=self.allow_private), None
            except BaseException as exc:  # noqa: BLE001 - handed to the post that waits
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(settle, result, error)
            except RuntimeError:
                pass  # the loop is gone: nobody waits any more

        thread = threading.Thread(target=run, name=f"raydock-webhook-lookup-{self.lane}", daemon=True)
        self._lookups[owner] = thread
        thread.start()
        return found
