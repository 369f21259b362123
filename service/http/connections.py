"""How the server holds its connections: uvicorn's httptools protocol with the deadlines
and the head cap uvicorn leaves out, and the uvicorn config that runs it (``server_config``).

uvicorn times out an idle keep-alive connection, but not a request whose headers or
body never finish arriving: a client that opens connections and sends half a request
keeps each one (and a file descriptor) for as long as it likes, until the server can
accept no more and answers nothing. Here a request's headers must arrive within
``header_timeout_s`` of the connection becoming idle (opened, or its last answer sent),
and its body may pause at most ``body_timeout_s`` between chunks (a long upload on a
slow link still passes). When the server holds ``max_connections`` connections, the
next one closes the one that has waited longest for its request to arrive, so
half-sent requests cannot crowd out whole ones; the cap stays below the process' file
descriptor limit. httptools parses a head as it streams in and caps nothing, so a head
is counted here: past ``max_header_bytes`` unfinished, the answer is 431.

httptools (C) rather than h11 (pure Python): the parse and the writes of a small
answer cost about a third of h11's CPU, the difference between ~500 and ~1,500
``GET /v1/jobs/{id}`` a second on one process (bench/api_scale.py). The clocks are armed
once per chunk received (not once per parser callback), after the chunk is parsed."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections import OrderedDict
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from api.errors import RaydockError
from service.settings import Settings

log = logging.getLogger("raydock.connections")

FD_RESERVE = 256  # descriptors kept for the database, log files, the Ray client and the listening socket
HEAD, BODY = "head", "body"


def raise_fd_limit() -> int:
    """Raise the soft file descriptor limit to the hard one; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(settings: Settings, fd_limit: int) -> int:
    return max(16, min(settings.clients.max_connections, fd_limit - FD_RESERVE))


def _refusal(err: RaydockError) -> bytes:
    """A whole answer in the API's error format, as every other refusal, closing the connection."""
    body = json.dumps(err.to_body()).encode()
    head = [
        STATUS_LINE[err.status],
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n\r\n",
    ]
    return b"".join(head) + body


LATE = _refusal(
    RaydockError(
        "The request's headers did not arrive in time; send the whole request head at once.",
        code="request_timeout",
        status=408,
    )
)


def _too_large(limit: int) -> bytes:
    return _refusal(
        RaydockError(
            f"The request line and headers are larger than {limit} bytes. Send fewer or shorter headers, or raise "
            "RAYDOCK_MAX_HEADER_BYTES on the server.",
            code="headers_too_large",
            status=431,
        )
    )


class DeadlineProtocol(HttpToolsProtocol):
    """One connection. ``waiting`` (one per server, set by ``protocol_for``) holds the
    connections whose request is still arriving, oldest first. ``_phase`` says where the
    request stands: HEAD (idle, or its head arriving), BODY (its body arriving), None (in,
    and the app's: its time is not bounded here); the parser's callbacks move it."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 1000
    max_header_bytes: int = 32 * 1024
    waiting: OrderedDict[DeadlineProtocol, None]
    head_too_large: bytes = b""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._armed: str | None = None  # the phase whose clock runs
        self._phase: str | None = HEAD
        self._parsing = False  # between a request's first byte and its last
        self._head_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._shed()
        self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase is HEAD:
            self._head_bytes += len(data)  # an upper bound: the chunk may carry body bytes past the head
        super().data_received(data)
        if self._phase is HEAD and self._head_bytes > self.max_header_bytes and not self.transport.is_closing():
            return self._refuse(self.head_too_large)
        self._track(restart=True)

    # The parser's callbacks (inside ``data_received``).
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase, self._parsing = HEAD, True  # a pipelined request's head may begin mid-chunk

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._phase, self._head_bytes = BODY, 0

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase, self._parsing = None, False

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request already received
        if not self._parsing and self._phase is None and (self.cycle is None or self.cycle.response_complete):
            self._phase = HEAD  # idle again: the next request's clock runs
        self._track()

    def _track(self, restart: bool = False) -> None:
        """Start, restart or stop the clock from where the request now stands."""
        if self.transport is None or self.transport.is_closing():
            return self._disarm()
        if self._phase is None:
            return self._disarm()
        if self._phase is BODY and restart:
            return self._arm(BODY)  # every chunk restarts the body's clock
        if self._armed is not self._phase:
            self._arm(self._phase)  # the head's clock runs from idle, not from each byte

    def _arm(self, phase: str) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._armed = phase
        delay = self.header_timeout_s if phase is HEAD else self.body_timeout_s
        self._deadline = self.loop.call_later(delay, self._expire)
        self.waiting.pop(self, None)
        self.waiting[self] = None

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._armed = None
        self.waiting.pop(self, None)

    def _expire(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return self._disarm()
        if self._armed is HEAD:
            self._refuse(LATE)
        else:
            self.transport.close()  # mid-body: the app reads a disconnect
        self._disarm()

    def _refuse(self, answer: bytes) -> None:
        """Answer, unless an earlier request's answer is still being written (pipelined), and close."""
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(answer)
        self.transport.close()
        self._disarm()

    def _shed(self) -> None:
        """At the cap, close the connections that have waited longest for their request."""
        while len(self.connections) > self.max_connections and self.waiting:
            oldest = next(iter(self.waiting))
            if oldest is self:
                break
            oldest._disarm()
            self.connections.discard(oldest)  # now, not when the close completes
            oldest.transport.close()


def protocol_for(settings: Settings, max_connections: int) -> type[DeadlineProtocol]:
    """A protocol class for one server, with its own limits and its own waiting list."""
    return type(
        "RaydockHttpProtocol",
        (DeadlineProtocol,),
        {
            "header_timeout_s": settings.clients.header_timeout_s,
            "body_timeout_s": settings.clients.body_timeout_s,
            "max_connections": max_connections,
            "max_header_bytes": settings.clients.max_header_bytes,
            "head_too_large": _too_large(settings.clients.max_header_bytes),
            "waiting": OrderedDict(),
        },
    )


def server_config(app: Any, settings: Settings, **kwargs: Any) -> uvicorn.Config:
    """The uvicorn config every raydock server runs with."""
    cap = connection_cap(settings, raise_fd_limit())
    if cap < settings.clients.max_connections:
        log.warning("serving at most %d connections (the file descriptor limit is low; see ulimit -n)", cap)
    return uvicorn.Config(
        app,
        host=settings.http.host,
        port=settings.http.port,
        http=protocol_for(settings, cap),
        limit_concurrency=cap + 1,  # uvicorn answers 503 past it: only more running requests than connections
        timeout_keep_alive=settings.clients.keep_alive_timeout_s,
        **kwargs,
    )
