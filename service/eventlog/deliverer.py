"""The webhook deliverer: a background unit on an event loop of its own thread (wired in
service/runtime.py, run by service/background/), so no post ever slows the API or the
monitor.

Each pass (``deliver_once``, every POLL_S) fans the new events out into ``webhook_deliveries`` rows (``fanout.py``) and
starts the posts that are due. The state is in the store, so a server killed mid-post
posts again after its restart: delivery is at least once, and a receiver deduplicates by
the ``Raydock-Event-Id`` header.

A subscription gets its events one at a time, in order: its oldest pending delivery is
the only one tried, again after ``backoff_s`` on a failure, until it is delivered or
its tries run out (``failed``, and the next one goes). Posts run side by side on an event
loop, so a slow receiver costs no thread, and none holds anything for longer than
RAYDOCK_WEBHOOK_TIMEOUT_S: every post, lookup and connection included, is cut off at that
deadline (``poster.py``). Fairness:

- one post of a job is under way at a time, whichever of its subscriptions it is for, so
  a job's webhooks take at most one of the RAYDOCK_WEBHOOK_CONCURRENCY slots, and a job
  waiting for a slot is served in turn (first come, first served; a turn ends after
  POSTS_PER_TURN posts while another job waits);
- the server's webhooks (RAYDOCK_WEBHOOKS) have a lane of their own: a slot, connections
  and lookup threads per webhook, which no job's webhook can take.

Run under its lease's fence (service/db/leases.py), every write of a pass (the fan-out, a
delivery settled or given up) proves in its transaction that the lease is still held: a
deliverer paused past its lease and resumed may post once more (at least once), but
marks, retries and reorders nothing; the new holder posts that delivery again.

For metrics: ``on_attempt(outcome)`` is called after every post with ``delivered``,
``retrying`` or ``failed`` (``service/runtime.py`` hands it the /metrics counter).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

from sqlalchemy import func, select, tuple_
from sqlalchemy.orm import sessionmaker

from service.db.eventlog_models import DeliveryRow, EventLogRow
from service.db.leases import Fence, LeaseLost
from service.db.models import aware, utcnow
from service.eventlog import fanout
from service.eventlog.log import public
from service.eventlog.poster import Outcome, Post, Poster
from service.eventlog.subscriptions import Subscription, by_id, server_webhooks
from service.settings import Settings

log = logging.getLogger("raydock.webhooks")

POLL_S = 0.5
SEND_BATCH = 256  # subscriptions whose head is looked at per pass
POSTS_PER_TURN = 20  # a job delivering fast gives its slot up after this many when others wait for one


def backoff_s(attempts: int, base_s: float, cap_s: float) -> float:
    """The wait after the ``attempts``-th failed try: base, 2 base, 4 base... at most ``cap_s``."""
    return min(base_s * 2 ** max(attempts - 1, 0), cap_s)


@dataclass
class Lane:
    slots: asyncio.Semaphore
    poster: Poster
    waiting: int = 0  # owners waiting for a slot


class Deliverer:
    def __init__(self, settings: Settings, sessions: sessionmaker):
        self.settings, self.sessions = settings, sessions
        self.server = server_webhooks(settings)
        self.on_attempt: Callable[[str], None] = lambda outcome: None  # the metrics hook
        self._stopping = False
        self._in_flight: set[str] = set()  # owners (a job, a server webhook) with a post under way or waiting
        self._lanes: tuple[Lane, Lane] | None = None  # (server, jobs), made on the unit's loop
        self._tasks: set[asyncio.Task] = set()
        self._fence: Fence | None = None  # the lease this replica's passes run under

    # ------------------------------------------------------------------ the unit's step

    def _lanes_here(self) -> tuple[Lane, Lane]:
        if self._lanes is None:
            self._stopping = False  # started again (its replica took the unit's lease back)
            server_slots = max(1, len(self.server))
            concurrency = self.settings.webhooks.webhook_concurrency
            self._lanes = (
                Lane(asyncio.Semaphore(server_slots), Poster(self.settings, server_slots, "server")),
                Lane(asyncio.Semaphore(concurrency), Poster(self.settings, concurrency, "jobs")),
            )
        return self._lanes

    async def deliver_once(self, fence: Fence | None = None) -> None:
        """One pass: fan the new events out and start the posts that are due; with ``fence``,
        every write only while that lease is held (LeaseLost otherwise)."""
        self._fence = fence
        server, jobs = self._lanes_here()
        await asyncio.to_thread(self.fan_out)
        for post in await asyncio.to_thread(self._due):
            owner = post.subscription.owner
            if owner in self._in_flight:
                continue
            self._in_flight.add(owner)
            lane = jobs if post.subscription.job_id else server
            task = asyncio.create_task(self._turn(lane, post))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """At the unit's stop: the posts under way are cut off (their deliveries stay
        pending: tried again after a restart), and the connections closed."""
        self._stopping = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._lanes is not None:
            for lane in self._lanes:
                await lane.poster.aclose()
            self._lanes = None

    def fan_out(self) -> int:
        return fanout.fan_out(self.sessions, self.server, self._fence)

    # ------------------------------------------------------------------ posting

    async def _turn(self, lane: Lane, post: Post) -> None:
        """An owner's turn, once a slot of its lane is free: post, settle, and go on with
        the subscription's next delivery while they are taken (at most POSTS_PER_TURN
        while other owners wait for a slot)."""
        sub = post.subscription
        try:
            lane.waiting += 1
            try:
                await lane.slots.acquire()
            finally:
                lane.waiting -= 1
            try:
                for n in itertools.count(1):
                    outcome = await lane.poster.post(post)
                    await asyncio.to_thread(self._settle, post, outcome)
                    if not outcome.ok or self._stopping or (n >= POSTS_PER_TURN and lane.waiting):
                        break
                    if (post := await asyncio.to_thread(self._next, sub)) is None:
                        break
            finally:
                lane.slots.release()
        except LeaseLost as exc:  # the new holder posts this delivery again, in its order
            log.warning("webhook %s: this replica no longer delivers: %s", sub.id, exc)
        except Exception:  # noqa: BLE001 - the row stays pending and is tried again
            log.exception("webhook %s: a delivery failed to settle", sub.id)
        finally:
            self._in_flight.discard(sub.owner)

    def _next(self, sub: Subscription) -> Post | None:
        """The subscription's oldest pending delivery, if it is due."""
        with self.sessions() as s:
            found = s.execute(
                select(DeliveryRow, EventLogRow)
                .join(EventLogRow, EventLogRow.id == DeliveryRow.event_id)
                .where(DeliveryRow.state == "pending", DeliveryRow.subscription == sub.id)
                .order_by(DeliveryRow.event_id)
                .limit(1)
            ).first()
        if found is None or aware(found[0].next_at) > utcnow():
            return None
        return _post(found[0], found[1], sub)

    def _due(self) -> list[Post]:
        """The oldest pending delivery of each subscription, if its time has come; the
        oldest event first (of a job's subscriptions, that one's post goes first)."""
        with self.sessions() as s:
            heads = (
                select(DeliveryRow.subscription, func.min(DeliveryRow.event_id))
                .where(DeliveryRow.state == "pending")
                .group_by(DeliveryRow.subscription)
                .limit(SEND_BATCH)
            )
            keys = [tuple(r) for r in s.execute(heads)]
            if not keys:
                return []
            rows = s.execute(
                select(DeliveryRow, EventLogRow)
                .join(EventLogRow, EventLogRow.id == DeliveryRow.event_id)
                .where(tuple_(DeliveryRow.subscription, DeliveryRow.event_id).in_(keys))
                .order_by(DeliveryRow.event_id, DeliveryRow.id)
            ).all()
            now, posts, gone = utcnow(), [], []
            for delivery, event in rows:
                sub = by_id(s, delivery.subscription, self.server)
                if sub is None:
                    gone.append(delivery.id)  # a server webhook removed, or a job's trimmed: nobody to tell
                elif aware(delivery.next_at) <= now:
                    posts.append(_post(delivery, event, sub))
        if gone:
            with self.sessions.begin() as s:
                self._hold(s)
                for delivery_id in gone:
                    row = s.get(DeliveryRow, delivery_id)
                    row.state, row.last_error = "failed", "the subscription no longer exists"
        return posts

    def _hold(self, s) -> None:
        if self._fence is not None:
            self._fence.hold(s)  # first in the transaction: a take-over waits for it, or refuses it

    def _settle(self, post: Post, outcome: Outcome) -> None:
        with self.sessions.begin() as s:
            self._hold(s)
            row = s.get(DeliveryRow, post.delivery_id)
            if row is None:
                return
            if not outcome.tried:  # not sent: looked at again after the first backoff, its tries untouched
                row.last_error, row.next_at = (
                    outcome.error,
                    utcnow() + timedelta(seconds=self.settings.webhooks.webhook_backoff_s),
                )
                return
            row.attempts += 1
            row.last_status, row.last_error, row.last_duration_s = outcome.status, outcome.error, outcome.duration_s
            if outcome.ok:
                row.state, row.delivered_at, result = "delivered", utcnow(), "delivered"
            elif row.attempts >= self.settings.webhooks.webhook_max_attempts:
                row.state, result = "failed", "failed"
                log.warning("webhook %s gave up on event %s: %s", post.subscription.id, post.event_id, outcome.error)
            else:
                wait = backoff_s(
                    row.attempts, self.settings.webhooks.webhook_backoff_s, self.settings.webhooks.webhook_backoff_max_s
                )
                row.next_at, result = utcnow() + timedelta(seconds=wait), "retrying"
        self.on_attempt(result)


def _post(delivery: DeliveryRow, event: EventLogRow, sub: Subscription) -> Post:
    body = json.dumps(public(event).model_dump(mode="json"), separators=(",", ":")).encode()
    return Post(delivery.id, delivery.attempts, sub, event.id, event.type, body)
