"""Writing into a job's local storage without following a link it planted: the write side
of ``localfs``.

The job owns its prefix and can swap any folder or file in it for a link (to the API
host's data dir, to another job's prefix) between the server's check and its write. So
nothing here is written by path: the prefix's parent (the server's storage root) is
resolved, and every component from the prefix down is made when missing and opened with
``O_NOFOLLOW`` relative to the one above it. A file is written under a fresh name made
with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and renamed over its target in the same directory
fd: a link or a hard link the job left at the target's name is replaced, never written
through.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from typing import BinaryIO

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# What openat/renameat say when a component is a link or not what it should be.
_REFUSED = {errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.EMLINK}


class LinkRefused(PermissionError):
    """A folder or file in the job's storage is a link or not of the kind written there."""


def _name(part: str) -> str:
    if part in ("", ".", "..") or "/" in part or "\x00" in part:
        raise ValueError(f"{part!r} is not one path component")
    return part


def _refused(exc: OSError, what: str) -> OSError:
    if exc.errno in _REFUSED:
        return LinkRefused(f"{what!r} in the job's storage is a link or not a folder; nothing is written through it")
    return exc


def open_dirs(prefix: str, relative: str = "", mode: int = 0o700) -> int:
    """A directory fd of ``prefix/relative``: the prefix's parent resolved (the server's, made
    when missing), each component from the prefix down made when missing and opened without
    following a link. Raises ``LinkRefused`` when one is a link or not a folder."""
    norm = os.path.normpath(prefix)
    parent = os.path.realpath(os.path.dirname(norm))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    parts = [_name(os.path.basename(norm)), *(_name(p) for p in relative.split("/") if p not in ("", "."))]
    fd = os.open(parent, _DIR & ~os.O_NOFOLLOW)
    walked = ""
    for part in parts:
        walked = f"{walked}/{part}" if walked else part
        try:
            fd = _enter(fd, part, mode)
        except OSError as exc:
            raise _refused(exc, walked) from None
    return fd


def _enter(fd: int, part: str, mode: int) -> int:
    """The folder ``part`` of ``fd``, made when missing and opened without following it; ``fd`` is closed."""
    try:
        with contextlib.suppress(FileExistsError):  # whatever is there is opened without following it
            os.mkdir(part, mode, dir_fd=fd)
        return os.open(part, _DIR, dir_fd=fd)
    finally:
        os.close(fd)


def replace_file(dir_fd: int, name: str, source: BinaryIO, mode: int = 0o644) -> None:
    """Write ``source`` whole as ``name`` in ``dir_fd``: under a fresh name first, then
    renamed over ``name`` (a link there is replaced, not followed; a folder there refuses)."""
    _name(name)
    partial = f".{name}.partial-{secrets.token_hex(6)}"
    fd = os.open(partial, _NEW, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
        os.rename(partial, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        try:
            os.unlink(partial, dir_fd=dir_fd)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise _refused(exc, name) from None
        raise
