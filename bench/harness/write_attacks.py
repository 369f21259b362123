"""Links planted where the server writes in a job's storage, as a job's code (or another
job's: they share one OS user and one filesystem) could plant them. Shared by
tests/test_safe_writes.py and ``python -m bench.abuse_safewrite``.

Each plant aims at a stand-in for the server's database outside the storage path; the
server must leave it as it was and still write its own file, whole, in its place."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from service.files import storage

# What stands at the server's name: its job prefix, its folder, or the file itself a link
# out; the file a hard link to the outside file; the file a directory holding such a link.
PLANTS = ("prefix", "folder", "file", "hard_link", "directory")
DB_BYTES = b"SQLite format 3\x00" + bytes(range(256)) * 16  # the stand-in's bytes, which must not change


def plant(prefix: Path, relative: str, how: str, outside: Path) -> Path:
    """Plant ``how`` at ``relative`` (``folder/name``) under the job's ``prefix``; returns
    the outside file it aims at, where the server would write if it followed the plant."""
    folder, name = relative.rsplit("/", 1)
    if how == "prefix":
        victim = outside / relative
    elif how == "folder":
        victim = outside / name
    else:
        victim = outside / "raydock.db"
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_bytes(DB_BYTES)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    if how == "prefix":
        shutil.rmtree(prefix, ignore_errors=True)
        prefix.symlink_to(outside, target_is_directory=True)
        return victim
    prefix.mkdir(parents=True, exist_ok=True)
    if how == "folder":
        shutil.rmtree(prefix / folder, ignore_errors=True)
        (prefix / folder).symlink_to(outside, target_is_directory=True)
        return victim
    (prefix / folder).mkdir(parents=True, exist_ok=True)
    at = prefix / relative
    if how == "file":
        at.symlink_to(victim)
    elif how == "hard_link":
        os.link(victim, at)
    elif how == "directory":
        at.mkdir()
        (at / "raydock.db").symlink_to(victim)
    else:
        raise ValueError(how)
    return victim


def deep_chain(prefix: Path, depth: int, leaf_link: Path) -> None:
    """``depth`` folders one inside the next under ``prefix``, made by directory fd as a
    job can (no path that long could name them), a link out at the bottom."""
    prefix.mkdir(parents=True, exist_ok=True)
    fd = os.open(prefix, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.symlink(leaf_link, "raydock.db", dir_fd=fd)
    finally:
        os.close(fd)


def tree(root: Path) -> dict[str, str]:
    """Every file below ``root`` (links not followed) and what it holds, by sha256."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            out[str(path.relative_to(root))] = f"-> {os.readlink(path)}"
        elif path.is_file():
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def written_whole(prefix: Path, relative: str) -> bytes:
    """The server's file at ``relative``: a regular file reached through directories only
    (no link on the way), mode 0600; its bytes."""
    path = prefix
    for part in relative.split("/"):
        assert not path.is_symlink(), f"{path} is still a link"
        path = path / part
    st = path.lstat()
    assert path.is_file() and not path.is_symlink(), f"{path} is not a regular file"
    assert st.st_mode & 0o777 == 0o600, oct(st.st_mode)
    assert st.st_nlink == 1, f"{path} is still linked elsewhere"
    return path.read_bytes()


def job_prefix(service, job_id: str) -> Path:
    return Path(storage.local_path(service.reads.prefix(job_id)))
