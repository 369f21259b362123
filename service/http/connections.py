"""How the server holds its connections: uvicorn's h11 protocol with the deadlines
uvicorn leaves out, and the uvicorn config that runs it (``server_config``).

uvicorn times out an idle keep-alive connection, but not a request whose headers or
body never finish arriving: a client that opens connections and sends half a request
keeps each one (and a file descriptor) for as long as it likes, until the server can
accept no more and answers nothing. Here a request's headers must arrive within
``header_timeout_s`` of its first byte (or of the connection opening), and its body may
pause at most ``body_timeout_s`` between chunks (a long upload on a slow link still
passes). When the server holds ``max_connections`` connections, the next one closes the
one that has waited longest for its request to arrive, so half-sent requests cannot
crowd out whole ones; the cap stays below the process' file descriptor limit. h11 keeps
at most ``max_header_bytes`` of an unfinished request head (httptools has no such cap)."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections import OrderedDict
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from api.errors import RaydockError
from service.settings import Settings

log = logging.getLogger("raydock.connections")

FD_RESERVE = 256  # descriptors kept for the database, log files, the Ray client and the listening socket


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


def _timeout_body() -> bytes:
    late = RaydockError(
        "The request's headers did not arrive in time; send the whole request head at once.",
        code="request_timeout",
        status=408,
    )
    return json.dumps(late.to_body()).encode()  # the API's error format, as every other refusal


class DeadlineProtocol(H11Protocol):
    """One connection. ``waiting`` (one per server, set by ``protocol_for``) holds the
    connections whose request is still arriving, oldest first."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 1000
    waiting: OrderedDict[DeadlineProtocol, None]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None  # "head" or "body" while the request arrives; None otherwise

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._shed()
        self._arm("head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request already received
        self._track()

    def _track(self) -> None:
        """Start, restart or stop the clock from where the request now stands."""
        if self.transport.is_closing():
            return self._disarm()
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm("body")  # every chunk restarts the body's clock
        elif state is h11.IDLE and self.conn.our_state is h11.IDLE:
            if self._phase != "head":
                self._arm("head")  # the head's clock runs from its first byte, not from each one
        else:
            self._disarm()  # the request is in: the app's time is not bounded here

    def _arm(self, phase: str) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._phase = phase
        delay = self.header_timeout_s if phase == "head" else self.body_timeout_s
        self._deadline = self.loop.call_later(delay, self._expire)
        self.waiting.pop(self, None)
        self.waiting[self] = None

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = None
        self.waiting.pop(self, None)

    def _expire(self) -> None:
        if self.transport.is_closing():
            return
        if self._phase == "head" and self.conn.our_state is h11.IDLE:
            self._refuse_and_close()
        else:
            self.transport.close()  # mid-body: the app reads a disconnect
        self._disarm()

    def _refuse_and_close(self) -> None:
        body = _timeout_body()
        try:
            headers = [
                ("content-type", "application/json"),
                ("content-length", str(len(body))),
                ("connection", "close"),
            ]
            out = self.conn.send(h11.Response(status_code=408, headers=headers, reason=b"Request Timeout"))
            out += self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage())
            self.transport.write(out)
        except h11.LocalProtocolError:
            pass
        self.transport.close()

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
        h11_max_incomplete_event_size=settings.clients.max_header_bytes,
        **kwargs,
    )
