"""Writing and deleting in storage that jobs write too, without following what a job planted.

Every job on a Ray cluster runs as one OS user on the same filesystem, so any name under
the storage path (a job's prefix, its ``_raydock`` folder, ``_code``) may be a symlink, a
hard link, a FIFO or a directory that a job put there, and may be swapped between a check
and a use. The server never opens, truncates, chmods or deletes such a name by path. It
starts at a root it owns (opened once, by its resolved path) and goes down one component
at a time by directory fd, with ``O_NOFOLLOW``:

- a directory on the way is opened, or made (0700) where nothing is; anything else
  holding its name (a link, a file) is removed itself, never followed, and a directory
  made in its place;
- a file is written under a fresh name (``O_CREAT|O_EXCL|O_NOFOLLOW``, its mode set with
  ``fchmod``) and renamed over the target: that replaces whatever held the name (a link,
  a hard link to another file, a FIFO) without touching what it pointed at, and a reader
  sees the old file or the whole new one;
- a tree is deleted by coreutils' ``rm -rf``, named by the directory fd it lies in
  (``/proc/self/fd/<fd>/<name>``): its fts walk enters every directory by fd, checks it is
  the one it listed and never follows a link, at any depth (``shutil.rmtree`` recurses
  once per level: a job's 3,000-deep tree made it raise ``RecursionError``); a link in
  place of the tree is removed itself.

A job that keeps swapping a name while the server works on it gets ``OSError`` after a
few turns; what it changes is only ever below the root.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
import subprocess
from contextlib import suppress
from typing import BinaryIO

Root = int | str  # a directory fd, or the path of a directory the server owns (resolved, made if missing)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
TRIES = 3  # turns taken against a name a job keeps swapping before giving up
_NOT_A_DIR = (errno.ENOTDIR, errno.ELOOP)  # O_NOFOLLOW|O_DIRECTORY on a link or a file


def write_file_nofollow(root: Root, relative: str, data: bytes | BinaryIO, mode: int = 0o600) -> None:
    """Put ``data`` (bytes, or a binary file read to its end) at ``relative`` below ``root``,
    whole, with ``mode``; the directories on the way are made as needed. No link, file or
    directory a job left on the way is followed or written through."""
    parts = components(relative)
    fd = open_dirs(root, parts[:-1], create=True)
    try:
        _replace(fd, parts[-1], data, mode)
    finally:
        os.close(fd)


def remove_nofollow(root: Root, relative: str) -> bool:
    """Delete ``relative`` below ``root`` (a file, a link or a whole tree), following no link
    on the way or inside it; False when nothing was there (or a link stood on the way,
    which is not ours to follow)."""
    parts = components(relative)
    try:
        fd = open_dirs(root, parts[:-1], create=False)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) or exc.errno in _NOT_A_DIR:
            return False
        raise
    try:
        try:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            remove_tree(fd, parts[-1])
        else:
            os.unlink(parts[-1], dir_fd=fd)  # a link goes itself, never what it points at
        return True
    finally:
        os.close(fd)


def components(relative: str) -> list[str]:
    """The names of a "/"-separated path below a root; none may climb out of it."""
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or any("\x00" in p for p in parts):
        raise PermissionError(f"{relative!r} is not a path below its root")
    return parts


def open_dirs(root: Root, parts: list[str], *, create: bool) -> int:
    """A directory fd of ``parts`` below ``root``, each entered without following a link;
    with ``create``, made where missing and put in place of anything but a directory."""
    if isinstance(root, int):
        fd = os.dup(root)
    else:
        path = os.path.realpath(root)
        if create:
            os.makedirs(path, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            nxt = _enter(fd, part, create)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def remove_tree(dir_fd: int, name: str) -> None:
    """Delete ``name`` in ``dir_fd`` and all below it, following no link (``rm -rf``, see above)."""
    done = subprocess.run(
        ["rm", "-rf", "--one-file-system", "--", f"/proc/self/fd/{dir_fd}/{name}"],
        pass_fds=(dir_fd,),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise OSError(errno.EIO, f"could not delete {name!r}: {done.stderr.strip()[-500:]}")


def _enter(dir_fd: int, name: str, create: bool) -> int:
    for _ in range(TRIES):
        try:
            return os.open(name, _DIR, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            if not create or exc.errno not in _NOT_A_DIR:
                raise
            with suppress(FileNotFoundError, IsADirectoryError):  # swapped for a directory: entered next turn
                os.unlink(name, dir_fd=dir_fd)
        with suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=dir_fd)
    raise OSError(errno.EAGAIN, f"{name!r} kept changing while a directory was made there")


def _replace(dir_fd: int, name: str, data: bytes | BinaryIO, mode: int) -> None:
    partial = f".{name}.{secrets.token_hex(6)}.partial"
    try:
        with open(partial, "wb", opener=lambda p, flags: os.open(p, _NEW, mode, dir_fd=dir_fd)) as out:
            os.fchmod(out.fileno(), mode)  # the umask may have taken bits away
            if isinstance(data, (bytes, bytearray, memoryview)):
                out.write(data)
            else:
                shutil.copyfileobj(data, out, 1 << 20)
        for _ in range(TRIES):
            try:
                os.rename(partial, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                return
            except OSError as exc:
                if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                    raise
            remove_tree(dir_fd, name)  # a directory holds the name: ours to clear
        raise OSError(errno.EAGAIN, f"{name!r} kept changing while a file was put there")
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(partial, dir_fd=dir_fd)
        raise
