"""Checkpoint storage: a local directory or any pyarrow filesystem URI (s3://, gs://).

Every job owns one prefix, ``<storage>/<job id>``; what it reports (checkpoint paths,
results) is accepted only inside it and outside its ``_raydock`` folder (``owned``), and
read back only from there.
"""

from __future__ import annotations

import os
import posixpath
import queue
import tarfile
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import pyarrow.fs as pafs

LAUNCH_DIR = "_raydock"  # under a job's prefix: what the server hands each attempt's driver


def _resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    return pafs.FileSystem.from_uri(uri)


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def job_prefix(base: str, job_id: str) -> str:
    return join(base, job_id)


def _is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def _local(uri: str) -> str:
    return os.path.realpath(uri.removeprefix("file://"))


def within(path: str, prefix: str) -> bool:
    """Whether ``path`` names something inside ``prefix`` once normalised: the same
    scheme and bucket, no ``..`` step, and (for a local path) no symlink out of it."""
    if not path or "\x00" in path or ".." in path.replace("\\", "/").split("/"):
        return False
    if _is_local(prefix) != _is_local(path):
        return False
    if _is_local(prefix):
        if not (path.startswith("/") or path.startswith("file:///")):
            return False
        root, target = _local(prefix), _local(path)
        return target == root or target.startswith(root.rstrip("/") + "/")
    p, t = urlsplit(prefix), urlsplit(path)
    if (p.scheme, p.netloc) != (t.scheme, t.netloc) or t.query or t.fragment:
        return False
    root, target = posixpath.normpath(p.path or "/"), posixpath.normpath(t.path or "/")
    return target == root or target.startswith(root.rstrip("/") + "/")


def owned(path: str, prefix: str, *, whole: bool = False) -> bool:
    """Whether ``path`` names something the job wrote under its ``prefix``: inside it
    (``within``), not the prefix itself (unless ``whole``: a run's result names it), and
    not in the server's ``_raydock`` folder there (each attempt's launch file, with its
    events token)."""
    if not within(path, prefix) or within(path, join(prefix, LAUNCH_DIR)):
        return False
    return whole or not within(prefix, path)


def exists(uri: str) -> bool:
    fs, path = _resolve(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


ARCHIVE_PIECE = 256 * 1024  # bytes of tar.gz handed on at a time
ARCHIVE_QUEUE = 16  # pieces in flight: what a download holds in memory, whatever its size


class _Pipe:
    """The write end tarfile writes into; a bounded queue carries the pieces to the reader."""

    def __init__(self) -> None:
        self.q: queue.Queue[bytes | BaseException | None] = queue.Queue(ARCHIVE_QUEUE)
        self.buf = bytearray()
        self.closed = threading.Event()  # the reader went away

    def write(self, data: bytes) -> int:
        if self.closed.is_set():
            raise BrokenPipeError("the download was closed")
        self.buf += data
        if len(self.buf) >= ARCHIVE_PIECE:
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


def archive(uri: str, prefix: str) -> Iterator[bytes]:
    """A tar.gz of the directory at ``uri``, with paths relative to it, as pieces made
    while they are read: a writer thread packs file by file into a bounded pipe, so the
    memory it takes does not grow with the checkpoint. Only files inside ``prefix`` are
    read: a link out of the job's prefix (or into its ``_raydock`` folder) is left out."""
    if not owned(uri, prefix):
        raise PermissionError(f"{uri} is outside {prefix}")
    fs, root = _resolve(uri)
    files = [i for i in fs.get_file_info(pafs.FileSelector(root, recursive=True)) if i.type == pafs.FileType.File]
    if _is_local(uri):
        files = [i for i in files if owned(i.path, prefix)]
    pipe = _Pipe()

    def pack() -> None:
        try:
            with tarfile.open(fileobj=pipe, mode="w:gz", compresslevel=1) as tar:
                for info in files:
                    member = tarfile.TarInfo(info.path[len(root) :].lstrip("/"))
                    member.size = info.size
                    member.mtime = int(info.mtime.timestamp()) if info.mtime else 0
                    with fs.open_input_stream(info.path) as f:
                        tar.addfile(member, f)
            pipe._put(bytes(pipe.buf))
            pipe._put(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
            pipe._put(exc)

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


def write_private(uri: str, data: bytes) -> None:
    """Write a file only the server's user can read (0600 where the filesystem has modes)."""
    if _is_local(uri):
        path = uri.removeprefix("file://")
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(path, 0o600)
        return
    fs, path = _resolve(uri)
    fs.create_dir(posixpath.dirname(path), recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(data)


def delete_file(uri: str) -> None:
    fs, path = _resolve(uri)
    if fs.get_file_info(path).type == pafs.FileType.File:
        fs.delete_file(path)


def delete_tree(uri: str) -> None:
    fs, path = _resolve(uri)
    if fs.get_file_info(path).type == pafs.FileType.Directory:
        fs.delete_dir(path)


def put_file(local_path: str, uri: str) -> None:
    """Store a local file at ``uri`` whole or not at all: a local target is written next
    to it and renamed, an object store's upload becomes visible only when complete."""
    if _is_local(uri):
        target = uri.removeprefix("file://")
        os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
        partial = f"{target}.partial-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            with open(local_path, "rb") as src, open(partial, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            os.replace(partial, target)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        return
    fs, path = _resolve(uri)
    fs.create_dir(posixpath.dirname(path), recursive=True)
    with open(local_path, "rb") as src, fs.open_output_stream(path) as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)


def open_random_access(uri: str):
    """A seekable binary file for ``uri`` (a zip's directory is read without fetching it all)."""
    if _is_local(uri):
        return open(uri.removeprefix("file://"), "rb")
    fs, path = _resolve(uri)
    return fs.open_input_file(path)


def fetch_uri(uri: str) -> str:
    """The URI a Ray node fetches ``uri`` by: ``file://`` for a local path (every node
    must see it, as for checkpoints), the storage URI itself otherwise."""
    return "file://" + _local(uri) if _is_local(uri) else uri
