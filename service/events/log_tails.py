"""Reading each active job's Ray log incrementally, for the monitor.

Ray's Jobs API has no read-from-offset; it has a tail: a websocket that sends a job's log
from its start and then each new piece as the driver writes it, and closes once the job
has ended and the whole log is sent. The monitor keeps one tail per running attempt, on
a thread of its own (an asyncio loop), and each tick takes what arrived since the last:
a tick costs what is new, not the whole log. A tail opened again (a restart of the
server, a dropped connection) skips the characters already stored. What arrives waits
in a bounded buffer; past it the tail stops reading, and the websocket holds the rest.

When Ray says the attempt ended, the log is complete once its tail has closed. A short
log is then read once whole instead (faster than waiting for the tail's close), and so
is any log whose tail failed or did not close in time: correctness never depends on a
tail, only the cost of a tick does.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field

from service.cluster.ray_backend import RayBackend
from service.events.ingest import Ingest

log = logging.getLogger("raydock.logs")

BUFFER_CHARS = 8 << 20  # arrived text one tail holds before it stops reading
TAKE_CHARS = 4 << 20  # text one tick takes in per job
READ_WHOLE_BELOW = 1 << 20  # an ended attempt's log shorter than this is read once whole
TAIL_GRACE_S = 10.0  # how long an ended attempt's tail may take to close
RETRY_AFTER_S = 2.0  # before a failed tail is opened again
FULL_READ_EVERY_S = 1.0  # without a working tail: the whole log at most this often
MAX_TAIL_FAILURES = 3  # in a row, before an attempt is read whole every FULL_READ_EVERY_S instead


@dataclass
class _Tail:
    submission_id: str
    base: int  # the character of the attempt's log that buf[0] is
    skip: int  # characters still to discard (already stored)
    buf: str = ""
    closed: bool = False  # the websocket closed normally: the attempt ended, everything was sent
    failed_at: float | None = None
    failures: int = 0
    future: object | None = None
    ended_seen_at: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class LogTails:
    def __init__(self, backend: RayBackend, events: Ingest):
        self.backend, self.events = backend, events
        self._tails: dict[str, _Tail] = {}
        self._full_read_at: dict[str, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ the monitor's side

    def read(self, job_id: str, submission_id: str, offset: int, ended: bool) -> bool:
        """Take in what the attempt ``submission_id`` logged past ``offset`` (characters
        of this attempt stored). Returns False while an ended attempt's log is not
        complete yet (the monitor decides its end on a later tick)."""
        tail = self._tail(job_id, submission_id, offset)
        if tail.failures >= MAX_TAIL_FAILURES:
            return self._read_whole(job_id, submission_id, offset, ended)
        with tail.lock:
            in_step = tail.base == offset
            text = tail.buf[:TAKE_CHARS]
            complete = tail.closed and len(text) == len(tail.buf)
        if not in_step:  # the store moved without this tail (e.g. a whole read): open it again from the store
            self._restart(job_id, submission_id, offset)
            return not ended
        # A line longer than what one tick takes is taken in pieces.
        whole = (ended and complete) or (len(text) >= TAKE_CHARS and "\n" not in text)
        taken = self.events.log(job_id, text, offset, final=whole) if text else 0
        with tail.lock:
            tail.buf, tail.base = tail.buf[taken:], tail.base + taken
        if not ended or complete:
            return True
        now = time.monotonic()
        tail.ended_seen_at = tail.ended_seen_at or now
        if offset + taken < READ_WHOLE_BELOW or tail.failed_at is not None or now - tail.ended_seen_at > TAIL_GRACE_S:
            return self._read_whole(job_id, submission_id, offset + taken, True)
        return False

    def forget(self, keep: set[str]) -> None:
        """Close the tails of jobs no longer followed."""
        for job_id in set(self._tails) - keep:
            self._close(self._tails.pop(job_id))
            self._full_read_at.pop(job_id, None)

    def _read_whole(self, job_id: str, submission_id: str, offset: int, ended: bool) -> bool:
        now = time.monotonic()
        if not ended and now - self._full_read_at.get(job_id, float("-inf")) < FULL_READ_EVERY_S:
            return True
        self._full_read_at[job_id] = now
        text = self.backend.logs(submission_id)[offset:]
        taken = self.events.log(job_id, text, offset, final=ended)
        tail = self._tails.get(job_id)
        if tail is not None:
            with tail.lock:
                tail.buf, tail.base, tail.skip = "", offset + taken, 0
                tail.closed = tail.closed or ended
        return True

    def _tail(self, job_id: str, submission_id: str, offset: int) -> _Tail:
        tail = self._tails.get(job_id)
        if tail is not None and tail.submission_id == submission_id:
            if (
                tail.failed_at is not None
                and tail.failures < MAX_TAIL_FAILURES
                and time.monotonic() - tail.failed_at > RETRY_AFTER_S
            ):
                self._restart(job_id, submission_id, offset)
            return self._tails[job_id]
        if tail is not None:
            self._close(tail)
        tail = self._tails[job_id] = _Tail(submission_id, base=offset, skip=offset)
        self._open(tail)
        return tail

    def _restart(self, job_id: str, submission_id: str, offset: int) -> None:
        old = self._tails[job_id]
        self._close(old)
        tail = self._tails[job_id] = _Tail(submission_id, base=offset, skip=offset, failures=old.failures)
        self._open(tail)

    # ------------------------------------------------------------------ the tails' thread

    def _open(self, tail: _Tail) -> None:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, daemon=True, name="raydock-log-tails").start()
        tail.future = asyncio.run_coroutine_threadsafe(self._follow(tail), self._loop)

    def _close(self, tail: _Tail) -> None:
        if tail.future is not None:
            tail.future.cancel()

    async def _follow(self, tail: _Tail) -> None:
        try:
            async for piece in self.backend.tail_logs(tail.submission_id):
                with tail.lock:
                    cut = min(tail.skip, len(piece))
                    tail.skip -= cut
                    tail.buf += piece[cut:]
                while len(tail.buf) > BUFFER_CHARS:
                    await asyncio.sleep(0.05)
            with tail.lock:
                tail.closed = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed tail is opened again, or the log read whole
            log.info("log tail of %s failed: %s: %s", tail.submission_id, type(exc).__name__, exc)
            with tail.lock:
                tail.failed_at, tail.failures = time.monotonic(), tail.failures + 1
