"""A checkpoint directory as a streamed tar.gz: packed file by file by a writer thread
into a bounded pipe while the client reads, so what a download holds in memory does not
grow with the checkpoint.

A local checkpoint is read by directory fd (``service.files.localfs``): the job that wrote it
can still write it while it is read, and nothing it swaps in (a link to a file of the
API host, a FIFO) is followed; sizes are the open file's own. Object storage is read
through pyarrow.
"""

from __future__ import annotations

import logging
import os
import queue
import tarfile
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import BinaryIO

import pyarrow.fs as pafs

from api import object_store
from service.files import localfs, storage

log = logging.getLogger("raydock.archive")

PIECE = 256 * 1024  # bytes of tar.gz handed on at a time
QUEUE = 16  # pieces in flight: what a download holds in memory, whatever its size


class _Pipe:
    """The write end tarfile writes into; a bounded queue carries the pieces to the reader."""

    def __init__(self) -> None:
        self.q: queue.Queue[bytes | BaseException | None] = queue.Queue(QUEUE)
        self.buf = bytearray()
        self.closed = threading.Event()  # the reader went away

    def write(self, data: bytes) -> int:
        if self.closed.is_set():
            raise BrokenPipeError("the download was closed")
        self.buf += data
        if len(self.buf) >= PIECE:
            self._put(bytes(self.buf))
            self.buf.clear()
        return len(data)

    def flush(self) -> None:
        pass

    def _put(self, item: bytes | BaseException | None) -> None:
        while not self.closed.is_set():
            try:
                self.q.put(item, timeout=0.5)
                return
            except queue.Full:
                continue


@dataclass
class Member:
    name: str
    size: int
    mtime: float
    open: Callable[[], AbstractContextManager[BinaryIO]]


def checkpoint_tar(uri: str, prefix: str) -> Iterator[bytes]:
    """The tar.gz of the checkpoint directory ``uri`` (inside the job's ``prefix``), with
    paths relative to it. Raises ``PermissionError`` or another ``OSError`` at once when
    the directory is not one inside the prefix; what turns bad while packing is left out."""
    if not storage.owned(uri, prefix):  # inside the prefix, not it, not its _raydock folder
        raise PermissionError(f"{uri} is outside {prefix}")
    members = _local_members(uri, prefix) if storage.is_local(uri) else _remote_members(uri)
    return _stream(members)


def _local_members(uri: str, prefix: str) -> Iterator[Member]:
    root = localfs.real_prefix(storage.local_path(prefix))
    relative = os.path.relpath(os.path.realpath(storage.local_path(uri)), root)
    if relative == ".." or relative.startswith("../"):
        raise PermissionError(f"{uri} is outside {prefix}")
    os.close(_open_checkpoint(prefix, relative))  # refused now, before the response starts

    def members() -> Iterator[Member]:
        top = _open_checkpoint(prefix, relative)  # again by fd: the walk starts when packing does
        skipped: list[str] = []
        try:
            for f in localfs.regular_files(top, skipped):
                yield Member(f.name, f.size, f.mtime, f.reader)
        finally:
            os.close(top)
        if skipped:
            log.warning("checkpoint %s: left out what is not a regular file inside it: %s", uri, skipped[:20])

    return members()


def _open_checkpoint(prefix: str, relative: str) -> int:
    prefix_fd = localfs.open_prefix(storage.local_path(prefix))
    try:
        return localfs.open_dir_under(prefix_fd, relative)
    finally:
        os.close(prefix_fd)


def _remote_members(uri: str) -> Iterator[Member]:
    fs, root = object_store.filesystem(uri)
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if info.type == pafs.FileType.File:
            mtime = info.mtime.timestamp() if info.mtime else 0
            opener = (lambda p: lambda: fs.open_input_stream(p))(info.path)
            yield Member(info.path[len(root) :].lstrip("/"), info.size, mtime, opener)


def _stream(members: Iterator[Member]) -> Iterator[bytes]:
    pipe = _Pipe()

    def pack() -> None:
        try:
            with tarfile.open(fileobj=pipe, mode="w:gz", compresslevel=1) as tar:
                for m in members:
                    info = tarfile.TarInfo(m.name)
                    info.size, info.mtime = m.size, int(m.mtime)
                    with m.open() as f:
                        tar.addfile(info, f)  # exactly ``size`` bytes: a file that grew is cut there
            pipe._put(bytes(pipe.buf))
            pipe._put(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
            pipe._put(exc)
        finally:
            members.close()  # the open fds go with the walk

    def pieces() -> Iterator[bytes]:
        threading.Thread(target=pack, daemon=True, name="raydock-archive").start()
        try:
            while (item := pipe.q.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                if item:
                    yield item
        finally:
            pipe.closed.set()

    return pieces()
