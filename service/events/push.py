"""What an events post goes through before ingestion stores it: one post in flight per
job (a second one, sent while the first is being stored, is turned away with 429 and a
``Retry-After``: the pusher retries it, and the log carries every event anyway), the cap
on the search events one post may carry, and validation of every event before the write
transaction opens, so the write lock is held only for writing. A post is stored in
transactions of a bounded number of events, letting other writers (a submit, the
monitor) in between."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from api.errors import Busy, RaydockError
from api.schemas.events import parse_event

SEARCH_TYPES = frozenset({"trial_metric", "trial", "exploit", "best_trial"})
RETRY_AFTER_S = 1


class PushBusy(Busy):
    """Another post of this job's events is being stored."""

    status, code = 429, "events_push_in_flight"
    retry_after_s = RETRY_AFTER_S


class BatchTooLarge(RaydockError):
    status, code = 413, "event_batch_too_large"


class PushGate:
    """At most one post of a job's events in flight; jobs never wait on each other."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()

    @contextlib.contextmanager
    def admit(self, job_id: str) -> Iterator[None]:
        with self._lock:
            if job_id in self._in_flight:
                raise PushBusy(
                    f"Job {job_id} has a post of events being stored; send one post at a time "
                    f"(retry after {RETRY_AFTER_S} s, as the Retry-After header says).",
                )
            self._in_flight.add(job_id)
        try:
            yield
        finally:
            with self._lock:
                self._in_flight.discard(job_id)


def check_search_batch(events: list[Any], max_search_events: int) -> None:
    """Refuse a post with more search events than one post may carry (each is a few
    writes: its trial, its report); the pusher sends far fewer per post."""
    n = sum(1 for e in events if isinstance(e, dict) and e.get("type") in SEARCH_TYPES)
    if n > max_search_events:
        raise BatchTooLarge(
            f"This post carries {n} search events; one post may carry at most {max_search_events} "
            "(RAYDOCK_MAX_SEARCH_EVENTS_PER_PUSH). Send them in smaller posts.",
        )


def chunks(events: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(events), size):
        yield events[i : i + size]


def parse_all(raws: list[Any]) -> tuple[list[Any], list[Exception]]:
    """The events that validate, and why each of the others does not."""
    parsed: list[Any] = []
    refused: list[Exception] = []
    for raw in raws:
        try:
            parsed.append(parse_event(raw))
        except (ValidationError, ValueError, TypeError, RecursionError) as exc:
            refused.append(exc)
    return parsed, refused
