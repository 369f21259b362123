"""Reading a job's local storage without following a link it planted.

A job writes its own prefix (``<storage>/<job id>``) while the server reads it, so a
path checked by name can be swapped for a symlink before it is opened. Everything here
opens by directory fd: the prefix itself without following its last component (the
directories above it are the server's), every component below it with ``O_NOFOLLOW``,
and a file only if ``fstat`` on the open fd says it is a regular file. A link met on the
way is refused (``OSError``), whatever it points at.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from service.files import nofollow

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO the job left would otherwise wait for a writer forever.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Directories deeper than this are left out: each level of a walk holds one fd open.
MAX_DEPTH = 64


def open_prefix(prefix: str) -> int:
    """A directory fd of ``prefix``: its parent resolved (the server's), its last component not followed."""
    norm = os.path.normpath(prefix)
    parent = os.open(os.path.realpath(os.path.dirname(norm)), _DIR & ~os.O_NOFOLLOW)
    try:
        return os.open(os.path.basename(norm), _DIR, dir_fd=parent)
    finally:
        os.close(parent)


def open_regular(path: str) -> int:
    """An fd of the regular file ``path``: its directory opened as ``open_prefix`` does,
    the file itself without following a link, and refused unless ``fstat`` says regular."""
    dir_fd = open_prefix(os.path.dirname(os.path.normpath(path)))
    try:
        return open_file(dir_fd, os.path.basename(path))[0]
    finally:
        os.close(dir_fd)


def real_prefix(prefix: str) -> str:
    """``prefix`` as ``open_prefix`` reaches it: the parent resolved, the last component as named."""
    norm = os.path.normpath(prefix)
    return os.path.join(os.path.realpath(os.path.dirname(norm)), os.path.basename(norm))


def open_dir_under(dir_fd: int, relative: str) -> int:
    """The directory ``relative`` below ``dir_fd``, walked one component at a time with ``O_NOFOLLOW``."""
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PermissionError(f"{relative!r} climbs out of its directory")
    return nofollow.open_dirs(dir_fd, parts, create=False)


@dataclass
class OpenFile:
    """A regular file opened by fd; ``size`` and ``mtime`` are what ``fstat`` said at open."""

    name: str  # relative to the walked directory, "/"-separated
    fd: int
    size: int
    mtime: float

    def reader(self):
        return os.fdopen(self.fd, "rb", closefd=False)


def open_file(dir_fd: int, name: str) -> tuple[int, os.stat_result]:
    """``name`` in ``dir_fd``, opened without following a link, and only if it is a regular file."""
    fd = os.open(name, _FILE, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IsADirectoryError(f"{name!r} is not a regular file")
        os.set_blocking(fd, True)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def regular_files(dir_fd: int, skipped: list[str] | None = None) -> Iterator[OpenFile]:
    """Every regular file below ``dir_fd`` in name order, each open while the caller holds
    it (closed when the walk moves on); links, devices and FIFOs are left out, and so is a
    file or directory swapped for one of them between listing and opening, and what lies
    deeper than ``MAX_DEPTH`` directories (each such name goes to ``skipped``)."""
    yield from _walk(dir_fd, "", skipped if skipped is not None else [], 0)


def _walk(dir_fd: int, base: str, skipped: list[str], depth: int) -> Iterator[OpenFile]:
    with os.scandir(dir_fd) as it:
        entries = sorted((e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False)) for e in it)
    for name, is_dir, is_file in entries:
        rel = f"{base}{name}"
        if is_dir:
            if depth >= MAX_DEPTH:
                skipped.append(rel)
                continue
            try:
                sub = os.open(name, _DIR, dir_fd=dir_fd)
            except OSError:
                skipped.append(rel)
                continue
            try:
                yield from _walk(sub, rel + "/", skipped, depth + 1)
            finally:
                os.close(sub)
        elif is_file:
            try:
                fd, st = open_file(dir_fd, name)
            except OSError:
                skipped.append(rel)
                continue
            try:
                yield OpenFile(rel, fd, st.st_size, st.st_mtime)
            finally:
                os.close(fd)
        else:
            skipped.append(rel)
