"""The transport of a job's events back to the raydock server.

Every process of a job that sends events (the Ray job driver, the Train controller)
writes each one as a line on the job's log stream, ``RAYDOCK_EVENT {json}``. The log is
kept by Ray for the life of the job and re-read by the server after a restart, so it is
the durable channel: whatever prefix Ray puts before the marker, the server finds it.
When the launch names an events URL, each event is also POSTed there at once from a
daemon thread, which takes the report-to-API latency from the log tailer's ~1 s down to
milliseconds; events that pile up while a post is under way go in one batch. Both
channels carry the same (type, seq) key and the server stores each event once. The
events themselves are the typed models of ``api.schemas``.
"""

from __future__ import annotations

import queue
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from pydantic import ValidationError

from api.errors import retry_after_s
from api.schemas import Event, MetricEvent, event_line, jsonable
from api.schemas.events import SUBMISSION_HEADER
from trainers.launch import EventsChannel, read_launch


def sendable_metrics(values: dict[str, Any]) -> dict[str, Any]:
    """A report's values as the contract's ``Metrics`` carries them: non-finite floats
    and numpy/torch scalars made JSON (``jsonable``), and any entry the server would
    refuse (a nested value, a string over 1000 characters, a key over 200) left out
    with a warning in the job's log, so one odd value never costs the whole report."""
    values = jsonable(dict(values))
    try:
        return MetricEvent(type="metric", seq=0, metrics=values).metrics
    except ValidationError:
        pass
    kept, dropped = {}, []
    for key, value in values.items():
        try:
            MetricEvent(type="metric", seq=0, metrics={key: value})
        except ValidationError:
            dropped.append(key[:80])
            continue
        if len(kept) < 512:
            kept[key] = value
    if dropped:
        print(
            f"raydock: reported values {dropped} not sent to the server: a metric is a finite number, "
            "an int64, a bool, null or a string of at most 1000 characters, under a name of at most 200",
            file=sys.stderr,
            flush=True,
        )
    return kept


class _Pusher:
    """Posts events to the server from a daemon thread so training never waits on HTTP.
    Events that queued up while a post was under way go together in the next one (a JSON
    array). A post the server turns away with 429 (another post of the job is being
    stored: the driver, the controller and a search's trials each push) is sent again
    after its ``Retry-After``, in order; any other failed post is dropped: the log line
    is the record of truth."""

    MAX_BATCH = 200  # events in one post
    MAX_BATCH_BYTES = 256 * 1024  # well under the server's request cap
    MAX_BUSY_WAIT_S = 60.0  # how long one post is retried while the server says 429

    def __init__(self, url: str, token: str | None, submission_id: str | None = None):
        self.url, self.token, self.submission_id = url, token, submission_id
        self.q: queue.Queue[bytes | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True, name="raydock-events")
        self.thread.start()

    def _batch(self, first: bytes) -> tuple[list[bytes], bool]:
        """The first event and whatever else is queued now (within the bounds); True once
        the stop sentinel was taken."""
        batch, size = [first], len(first)
        while len(batch) < self.MAX_BATCH and size < self.MAX_BATCH_BYTES:
            try:
                body = self.q.get_nowait()
            except queue.Empty:
                break
            if body is None:
                self.q.task_done()
                return batch, True
            batch.append(body)
            size += len(body)
        return batch, False

    def _run(self) -> None:
        stop = False
        while not stop and (first := self.q.get()) is not None:
            batch, stop = self._batch(first)
            try:
                self._post(b"[" + b",".join(batch) + b"]")
            finally:
                for _ in batch:
                    self.q.task_done()

    def _post(self, body: bytes) -> None:
        deadline = time.monotonic() + self.MAX_BUSY_WAIT_S
        while True:
            req = urllib.request.Request(self.url, data=body, method="POST")
            req.add_header("Content-Type", "application/json")
            if self.token:
                req.add_header("Authorization", f"Bearer {self.token}")
            if self.submission_id:
                req.add_header(SUBMISSION_HEADER, self.submission_id)
            try:
                urllib.request.urlopen(req, timeout=5).read()
                return
            except urllib.error.HTTPError as exc:
                if exc.code != 429 or time.monotonic() >= deadline:
                    return  # refused: the log carries the events
                time.sleep(_pause(retry_after_s(exc.headers)))
            except Exception:  # noqa: BLE001 - best effort; the log carries the event
                return

    def flush(self, timeout: float = 3.0) -> None:
        deadline = time.monotonic() + timeout
        while self.q.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)


def _pause(asked: float | None) -> float:
    """The seconds a 429 asks to wait (0.05 to 5; 1 when it does not say), with jitter so
    posts of one job spread out."""
    wait = 1.0 if asked is None else asked
    return min(max(wait, 0.05), 5.0) * random.uniform(0.5, 1.0)


_pusher: _Pusher | None = None
_pusher_lock = threading.Lock()


def emit(event: Event, channel: EventsChannel | None = None) -> None:
    """Write one event to stdout (the durable log) and push it if the launch asks. A
    process other than the driver (the Train controller) names the ``channel`` the
    driver handed it: the launch file is gone by then."""
    global _pusher
    if not event.ts:
        event = event.model_copy(update={"ts": time.time()})
    line = event_line(event)
    write_line(line)
    channel = channel or read_launch().channel
    if channel.url:
        with _pusher_lock:
            if _pusher is None:
                _pusher = _Pusher(channel.url, channel.token, channel.submission_id)
        _pusher.q.put(line[line.index("{") :].encode())  # the JSON after the marker


def write_line(line: str) -> None:
    """One line on stdout in one write: ``print`` writes the text and the newline apart,
    and another thread's line (Ray forwarding a worker's output) may land in between."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def flush() -> None:
    """Wait (a few seconds at most) until every pushed event is posted; a driver calls it
    before it exits, since the pusher is a daemon thread."""
    if _pusher is not None:
        _pusher.flush()
