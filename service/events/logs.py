"""A job's stored log: bounded chunks, each with its place in the job's whole log.

Offsets count characters of everything the job ever logged (every attempt, in order),
so they never move: reading from an offset is one indexed range query on
``(job_id, end_offset)`` and a follow poll at the end costs the same for a 1 KB log as
for a 100 MB one. A job keeps at most ``RAYDOCK_MAX_LOG_BYTES`` of it: the head (the
first quarter of the cap) stays, the oldest chunks after it go, and one marker row in
their place spans the dropped range and says how many bytes were dropped. Events inside
dropped text were taken in before it was stored (``service/events/ingest.py``), so a cap never
loses one.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.event_models import LogChunkRow
from service.db.models import JobRow

CHUNK_BYTES = 64 * 1024  # most bytes one stored chunk holds
READ_CHUNKS = 64  # chunks one range query returns (about 4 MiB at most)


def marker(dropped_bytes: int, cap: int) -> str:
    return f"\n[raydock: {dropped_bytes} bytes of this log were dropped here to keep it under RAYDOCK_MAX_LOG_BYTES={cap}]\n"


def _cut(text: str, room: int) -> int:
    """The longest prefix of at most ``room`` UTF-8 bytes, ending at a newline if one is
    in it (0 when not even one character fits)."""
    head = text[:room].encode()[:room].decode(errors="ignore")  # <= room bytes, whole characters
    at = head.rfind("\n")
    return at + 1 if at >= 0 else len(head)


def append(s: Session, job: JobRow, text: str, cap: int) -> None:
    """Store ``text`` at the end of the job's log, in chunks of at most CHUNK_BYTES (the
    last one grows until it is full), then drop from the middle what the cap does not
    hold. Runs in the caller's transaction (with the events and the offset the text brings)."""
    if not text:
        return
    # PostgreSQL text holds no NUL character: one character for another, so offsets hold.
    text = text.replace("\x00", "\ufffd")
    last = s.scalar(
        select(LogChunkRow)
        .where(LogChunkRow.job_id == job.id, LogChunkRow.end_offset == job.log_end)
        .order_by(LogChunkRow.id.desc())
        .limit(1)
    )
    while text:
        head_room = cap // 4 - job.log_stored_bytes  # the head is the first quarter of the cap
        head = head_room > 0
        merge = last is not None and last.dropped_bytes is None and last.head == head and last.nbytes < CHUNK_BYTES
        cut = _cut(text, min(CHUNK_BYTES - (last.nbytes if merge else 0), head_room if head else CHUNK_BYTES))
        if cut == 0:  # the last chunk has no room for the next character: a new one
            merge, cut = False, max(_cut(text, CHUNK_BYTES), 1)
        piece = text[:cut]
        text, n, end = text[len(piece) :], len(piece.encode()), job.log_end + len(piece)
        if merge:
            last.text, last.end_offset, last.nbytes = last.text + piece, end, last.nbytes + n
        else:
            last = LogChunkRow(job_id=job.id, text=piece, start_offset=job.log_end, end_offset=end, nbytes=n, head=head)
            s.add(last)
        job.log_end, job.log_stored_bytes = end, job.log_stored_bytes + n
    if job.log_stored_bytes > cap:
        _drop_middle(s, job, cap)


def _drop_middle(s: Session, job: JobRow, cap: int) -> None:
    """Delete the oldest chunks after the head until the log fits the cap again (the
    newest chunk always stays); the marker grows over what they spanned."""
    s.flush()
    mark = s.scalar(select(LogChunkRow).where(LogChunkRow.job_id == job.id, LogChunkRow.dropped_bytes.is_not(None)))
    body = select(LogChunkRow).where(
        LogChunkRow.job_id == job.id, LogChunkRow.head.is_(False), LogChunkRow.dropped_bytes.is_(None)
    )
    while job.log_stored_bytes > cap:
        oldest = s.scalars(body.order_by(LogChunkRow.end_offset).limit(READ_CHUNKS)).all()
        if len(oldest) <= 1:
            break  # only the newest chunk is left: it stays, even over a tiny cap
        for row in oldest[:-1]:
            if job.log_stored_bytes <= cap:
                break
            if mark is None:
                mark = LogChunkRow(
                    job_id=job.id,
                    text="",
                    start_offset=row.start_offset,
                    end_offset=row.start_offset,
                    nbytes=0,
                    dropped_bytes=0,
                )
                s.add(mark)
            mark.end_offset, mark.dropped_bytes = row.end_offset, mark.dropped_bytes + row.nbytes
            job.log_stored_bytes -= row.nbytes
            s.delete(row)
        s.flush()
    if mark is not None:
        text = marker(mark.dropped_bytes, cap)
        job.log_stored_bytes += len(text.encode()) - mark.nbytes
        mark.text, mark.nbytes = text, len(text.encode())


def read(s: Session, job_id: str, offset: int, max_chunks: int = READ_CHUNKS) -> tuple[str, int]:
    """The stored text from ``offset`` on (at most ``max_chunks`` chunks) and the offset
    after it. An offset inside the dropped middle reads the marker, then the tail."""
    rows = s.execute(
        select(LogChunkRow.text, LogChunkRow.start_offset, LogChunkRow.end_offset, LogChunkRow.dropped_bytes)
        .where(LogChunkRow.job_id == job_id, LogChunkRow.end_offset > offset)
        .order_by(LogChunkRow.end_offset)
        .limit(max_chunks)
    ).all()
    if not rows:
        return "", offset
    parts = [r.text if r.dropped_bytes is not None else r.text[max(offset - r.start_offset, 0) :] for r in rows]
    return "".join(parts), rows[-1].end_offset


def tail(s: Session, job: JobRow, chars: int) -> str:
    """About the last ``chars`` characters stored (for an error message)."""
    return read(s, job.id, max(job.log_end - chars, 0))[0][-chars:]


def stream(sessions, job_id: str, offset: int) -> Iterator[str]:
    """Every stored piece from ``offset`` to the end, one range query per few MiB, in a
    fresh session each (constant memory whatever the log's size)."""
    while True:
        with sessions() as s:
            text, offset = read(s, job_id, offset)
        if not text:
            return
        yield text
