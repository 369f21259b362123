"""The event protocol from a running job back to the raydock server.

Each event is one line on the job's log stream: ``RAYDOCK_EVENT {json}``. The log is
kept by Ray for the life of the job and re-read by the server after a restart, so it is
the durable channel: whatever prefix Ray puts before the marker, the server finds it.
When the server gives an events URL, each event is also POSTed there at once, which
takes the report-to-API latency from the log tailer's ~1 s down to milliseconds. Both
channels carry the same (kind, seq) key and the server stores each event once.
"""

from __future__ import annotations

import json
import os
import queue
import re
import sys
import threading
import time
import urllib.request
from typing import Any

MARKER = "RAYDOCK_EVENT "
_EVENT_RE = re.compile(r"RAYDOCK_EVENT (\{.*\})\s*$")
EVENTS_URL_ENV = "RAYDOCK_EVENTS_URL"
EVENTS_TOKEN_ENV = "RAYDOCK_EVENTS_TOKEN"


def parse_line(line: str) -> dict[str, Any] | None:
    m = _EVENT_RE.search(line)
    if not m:
        return None
    try:
        event = json.loads(m.group(1))
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and "type" in event else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return _jsonable(item())
        except (TypeError, ValueError):
            pass
    return str(value)


class _Pusher:
    """Posts events to the server from a daemon thread so training never waits on HTTP.
    A failed post is dropped: the log line is the record of truth."""

    def __init__(self, url: str, token: str | None):
        self.url, self.token = url, token
        self.q: queue.Queue[bytes | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True, name="raydock-events")
        self.thread.start()

    def _run(self) -> None:
        while (body := self.q.get()) is not None:
            req = urllib.request.Request(self.url, data=body, method="POST")
            req.add_header("Content-Type", "application/json")
            if self.token:
                req.add_header("Authorization", f"Bearer {self.token}")
            try:
                urllib.request.urlopen(req, timeout=2).read()
            except Exception:  # noqa: BLE001 - best effort; the log carries the event
                pass

    def flush(self, timeout: float = 3.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.q.empty() and time.monotonic() < deadline:
            time.sleep(0.01)


_pusher: _Pusher | None = None


def emit(event: dict[str, Any]) -> None:
    """Write one event to stdout (the durable log) and push it if the server asked."""
    global _pusher
    event = _jsonable({"ts": time.time(), **event})
    line = json.dumps(event, separators=(",", ":"))
    print(MARKER + line, file=sys.stdout, flush=True)
    url = os.environ.get(EVENTS_URL_ENV)
    if url:
        if _pusher is None:
            _pusher = _Pusher(url, os.environ.get(EVENTS_TOKEN_ENV))
        _pusher.q.put(line.encode())


def flush() -> None:
    if _pusher is not None:
        _pusher.flush()
