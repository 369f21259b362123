"""The webhook deliverer: its own thread, so no post ever slows the API or the monitor.

Each pass fans the new events out into ``webhook_deliveries`` rows (one per matching
subscription, written before anything is sent) and posts what is due. The state is in the
store, so a server killed mid-post posts again after its restart: delivery is at least
once, and a receiver deduplicates by the ``Raydock-Event-Id`` header.

A subscription gets its events one at a time, in order: its oldest pending delivery is
the only one tried, again after ``backoff_s`` on a failure, until it is delivered or
its tries run out (``failed``, and the next one goes). Posts to different subscriptions
run at once, at most ``webhook_concurrency``, and a pass never waits for one: a slow
receiver holds up only its own subscription.

For metrics: ``on_attempt(outcome)`` is called after every post with ``delivered``,
``retrying`` or ``failed`` (``service/runtime.py`` hands it the /metrics counter).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import httpx
from sqlalchemy import func, select, tuple_
from sqlalchemy.orm import Session, sessionmaker

from api.schemas.eventlog import DELIVERY_HEADER, EVENT_ID_HEADER, EVENT_TYPE_HEADER, SIGNATURE_HEADER
from service.db.eventlog_models import DeliveryRow, EventLogRow
from service.db.models import ServerMetaRow, aware, utcnow
from service.eventlog import signing
from service.eventlog.log import public
from service.eventlog.subscriptions import Subscription, by_id, job_subscriptions, server_webhooks
from service.eventlog.url_policy import check_url, resolve
from service.settings import Settings

log = logging.getLogger("raydock.webhooks")

POLL_S = 0.5
FANOUT_BATCH = 500
FANOUT_BATCHES = 20  # a burst beyond this many batches waits for the next pass
SEND_BATCH = 256  # subscriptions whose head is looked at per pass
# An event id is taken from a sequence before its transaction commits, so on PostgreSQL an
# older id can appear after a newer one. The fan-out cursor stays behind events younger than
# this (they are looked at again; a delivery row is made once per subscription and event).
SETTLE_S = 10.0
CURSOR_KEY = "webhook_fanout_cursor"
MAX_ERROR_CHARS = 500


def backoff_s(attempts: int, base_s: float, cap_s: float) -> float:
    """The wait after the ``attempts``-th failed try: base, 2 base, 4 base... at most ``cap_s``."""
    return min(base_s * 2 ** max(attempts - 1, 0), cap_s)


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


class Deliverer:
    def __init__(self, settings: Settings, sessions: sessionmaker):
        self.settings, self.sessions = settings, sessions
        self.server = server_webhooks(settings)
        self.on_attempt: Callable[[str], None] = lambda outcome: None  # the metrics hook
        self._pool = ThreadPoolExecutor(settings.webhook_concurrency, thread_name_prefix="raydock-webhook")
        self._http = httpx.Client(follow_redirects=False, timeout=settings.webhook_timeout_s, trust_env=False)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()  # subscriptions with a post under way
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="raydock-webhooks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.settings.webhook_timeout_s + 5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - the deliverer must outlive any one bad pass
                log.exception("webhook pass failed")
            self._stop.wait(POLL_S)

    def run_once(self) -> int:
        """One pass: fan out, then post what is due; returns the posts made."""
        self.fan_out()
        return self.send_due()

    # ------------------------------------------------------------------ fan-out

    def fan_out(self) -> int:
        """Make the delivery rows of new events, a batch per transaction (at most
        FANOUT_BATCHES a pass); returns how many."""
        with self.sessions.begin() as s:
            meta = s.get(ServerMetaRow, CURSOR_KEY)
            start = int(meta.value) if meta is not None else 0  # the log began with its migration: at 0
        made, settling = 0, False
        for _ in range(FANOUT_BATCHES):
            n, start, settling, full = self._fan_out_batch(start, settling)
            made += n
            if not full:
                break
        return made

    def _fan_out_batch(self, after: int, settling: bool) -> tuple[int, int, bool, bool]:
        """Fan out the events after ``after``; the stored cursor moves past them while none
        before is still settling. Returns (rows made, last id, settling, batch full)."""
        with self.sessions.begin() as s:
            q = select(EventLogRow).where(EventLogRow.id > after).order_by(EventLogRow.id).limit(FANOUT_BATCH)
            events = list(s.scalars(q))
            if not events:
                return 0, after, settling, False
            by_job = job_subscriptions(s, {e.job_id for e in events if e.job_id})
            wanted = [
                (sub.id, e.id)
                for e in events
                for sub in (*self.server, *by_job.get(e.job_id or "", ()))
                if sub.wants(e.type)
            ]
            new: list[DeliveryRow] = []
            if wanted:
                pairs = tuple_(DeliveryRow.subscription, DeliveryRow.event_id).in_(wanted)
                have = {
                    tuple(r) for r in s.execute(select(DeliveryRow.subscription, DeliveryRow.event_id).where(pairs))
                }
                new = [DeliveryRow(subscription=sub, event_id=eid) for sub, eid in wanted if (sub, eid) not in have]
                s.add_all(new)
            settled_before = utcnow() - timedelta(seconds=SETTLE_S)
            cursor = None
            for e in events:
                settling = settling or aware(e.at) >= settled_before
                if not settling:
                    cursor = e.id
            if cursor is not None:
                meta = s.get(ServerMetaRow, CURSOR_KEY)
                if meta is None:
                    s.add(ServerMetaRow(key=CURSOR_KEY, value=str(cursor)))
                else:
                    meta.value = str(cursor)
        return len(new), events[-1].id, settling, len(events) == FANOUT_BATCH

    # ------------------------------------------------------------------ posting

    def send_due(self) -> int:
        """Start the posts that are due; none waits for another (a slow receiver holds up
        only its own subscription). Returns how many were started."""
        with self._lock:
            busy = set(self._in_flight)
        posts = [p for p in self._due() if p.subscription.id not in busy]
        for post in posts:
            with self._lock:
                self._in_flight.add(post.subscription.id)
            self._pool.submit(self._post_and_settle, post)
        return len(posts)

    def idle(self) -> bool:
        with self._lock:
            return not self._in_flight

    def _post_and_settle(self, post: Post | None) -> None:
        """Post, settle, and go on with the subscription's next delivery while they are
        taken: a busy subscription is not held to one post per pass."""
        sub = post.subscription
        try:
            while post is not None and not self._stop.is_set():
                outcome = self._post(post)
                with self.sessions.begin() as s:
                    self._settle(s, post, outcome)
                post = self._next(sub) if outcome.ok else None
        except Exception:  # noqa: BLE001 - the row stays pending and is tried again
            log.exception("webhook %s: a delivery failed to settle", sub.id)
        finally:
            with self._lock:
                self._in_flight.discard(sub.id)

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
        """The oldest pending delivery of each subscription, if its time has come."""
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
                for delivery_id in gone:
                    row = s.get(DeliveryRow, delivery_id)
                    row.state, row.last_error = "failed", "the subscription no longer exists"
        return posts

    def _post(self, post: Post) -> Outcome:
        started = time.monotonic()
        allow = self.settings.webhook_allow_private
        try:
            scheme, host, port = check_url(post.subscription.url, allow_private=allow)
            address, problem = resolve(host, port, allow_private=allow)
            if problem:
                return Outcome(False, None, f"refused: {problem}", time.monotonic() - started)
            url = httpx.URL(post.subscription.url)
            # To the address just checked, under the URL's name (Host, and TLS's SNI and certificate check).
            target, extensions = url.copy_with(host=address), {"sni_hostname": host} if scheme == "https" else {}
            headers = {
                "Content-Type": "application/json",
                "User-Agent": "raydock-webhooks/1",
                EVENT_ID_HEADER: str(post.event_id),
                EVENT_TYPE_HEADER: post.event_type,
                DELIVERY_HEADER: str(post.delivery_id),
                SIGNATURE_HEADER: signing.header(post.subscription.secret, post.body),
                "Host": url.netloc.decode("ascii"),
            }
            # A stream, closed unread: whatever the receiver answers with, only its status is taken.
            request = self._http.build_request(
                "POST", target, content=post.body, headers=headers, extensions=extensions
            )
            response = self._http.send(request, stream=True)
            status = response.status_code
            response.close()
        except Exception as exc:  # noqa: BLE001 - any failure of one post is that delivery's, to retry
            return Outcome(False, None, f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS], time.monotonic() - started)
        ok = 200 <= status < 300
        error = None if ok else f"HTTP {status}" + (" (redirects are not followed)" if 300 <= status < 400 else "")
        return Outcome(ok, status, error, time.monotonic() - started)

    def _settle(self, s: Session, post: Post, outcome: Outcome) -> None:
        row = s.get(DeliveryRow, post.delivery_id)
        if row is None:
            return
        row.attempts += 1
        row.last_status, row.last_error, row.last_duration_s = outcome.status, outcome.error, outcome.duration_s
        if outcome.ok:
            row.state, row.delivered_at, result = "delivered", utcnow(), "delivered"
        elif row.attempts >= self.settings.webhook_max_attempts:
            row.state, result = "failed", "failed"
            log.warning("webhook %s gave up on event %s: %s", post.subscription.id, post.event_id, outcome.error)
        else:
            wait = backoff_s(row.attempts, self.settings.webhook_backoff_s, self.settings.webhook_backoff_max_s)
            row.next_at, result = utcnow() + timedelta(seconds=wait), "retrying"
        self.on_attempt(result)


def _post(delivery: DeliveryRow, event: EventLogRow, sub: Subscription) -> Post:
    body = json.dumps(public(event).model_dump(mode="json"), separators=(",", ":")).encode()
    return Post(delivery.id, delivery.attempts, sub, event.id, event.type, body)
