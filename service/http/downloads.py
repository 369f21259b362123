"""Checkpoint downloads held to a bound: at most ``RAYDOCK_MAX_CONCURRENT_DOWNLOADS`` at
once (one more is turned away with 429 ``too_many_downloads`` and a ``Retry-After``), a
client that reads nothing for ``RAYDOCK_DOWNLOAD_SEND_TIMEOUT_S`` is dropped, and the
packing stops as soon as the client goes. A stalled client costs the server what one
download holds (``service.files.archive``: a bounded pipe and one packing thread), and no more
than the bound of them exist; one user or one project holds at most its share of them
(``service/http/shares.py``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Send

from service.http.shares import Shares
from service.tenancy.caller import Caller

log = logging.getLogger("raydock.api")


class GzipResponse(StreamingResponse):
    media_type = "application/gzip"


class DownloadGate:
    """The downloads under way (``shares``: the server-wide cap, shared out per user and per
    project); ``admit`` takes a place or raises 429 ``too_many_downloads``."""

    def __init__(self, shares: Shares, send_timeout_s: float) -> None:
        self.shares, self.limit, self.send_timeout_s = shares, shares.limit, send_timeout_s
        self._limiter: anyio.CapacityLimiter | None = None  # made in the event loop, on first use

    @property
    def in_flight(self) -> int:
        return self.shares.in_use

    def admit(self, caller: Caller, project: str) -> Callable[[], None]:
        """A place for one download of a job of ``project``; the returned function gives it
        back (once, however often called)."""
        return self.shares.take(caller, project)

    def limiter(self) -> anyio.CapacityLimiter:
        # The pieces are taken from the packing thread in threads of their own, so a busy
        # download never holds a thread the other routes run in.
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.limit)
        return self._limiter

    def response(self, pieces: Iterator[bytes], release: Callable[[], None], filename: str) -> GzipResponse:
        return ArchiveResponse(pieces, release, self, {"Content-Disposition": f'attachment; filename="{filename}"'})


class ArchiveResponse(GzipResponse):
    """A tar.gz sent piece by piece, each send bounded in time; whatever ends it (the
    last piece, the client gone, a stalled client dropped) stops the packing and gives
    the download's place back."""

    def __init__(
        self, pieces: Iterator[bytes], release: Callable[[], None], gate: DownloadGate, headers: dict[str, str]
    ) -> None:
        super().__init__(iter(()), headers=headers)
        self.pieces, self.release, self.gate = pieces, release, gate

    async def stream_response(self, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            limiter = self.gate.limiter()
            while (piece := await anyio.to_thread.run_sync(next, self.pieces, None, limiter=limiter)) is not None:
                with anyio.fail_after(self.gate.send_timeout_s):
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:
            # Left incomplete, so the server closes the connection: the client sees a cut
            # download, never a short archive that looks whole.
            log.warning("dropped a checkpoint download: its client read nothing for %s s", self.gate.send_timeout_s)
        finally:
            close = getattr(self.pieces, "close", None)
            if close is not None:
                close()  # the packing thread sees the pipe closed and stops
            self.release()
