"""A node-local cache of datasets on disk, shared by every job on the node.

The built-in loops read a dataset once per node and keep it here: the trials of a search
and later jobs on the same node find it by its key, a sha256 of what the source holds
(the listing's paths, sizes and modification times, or the parameters a generated set
is made from) and of the parameters that shape the tensors. The cache holds at most
``max_bytes``; the entries used longest ago go first (LRU by each entry's mtime, touched
on every hit).

Every job on a node runs as one OS user, so any of them can write here. Nothing is
trusted because of where it lies:

- an entry is ``MAGIC``, the sha256 of its payload, the payload's length, then the
  payload; a reader checks all three and discards an entry that fails (it is read again
  from the source), so a truncated, corrupted or naively modified entry is never used;
- every name is opened by the cache directory's fd with ``O_NOFOLLOW`` (a symlink planted
  in place of an entry is removed, never followed), and only a regular file with one link
  is read (a hard link to a file elsewhere is removed too): nothing outside the directory
  is read or written;
- an entry is written under a fresh name (``O_CREAT|O_EXCL``) and renamed over its key:
  a reader sees the old entry or the whole new one;
- payloads are decoded without pickle (numpy ``allow_pickle=False``, Arrow IPC).

The digest proves an entry whole, not who wrote it: a job that writes a consistent entry
under another dataset's key changes what later jobs on that node read, as it could change
their packages in Ray's per-node caches. A cluster whose jobs do not trust each other
leaves the cache off (``RAYDOCK_DATA_CACHE_BYTES=0``, the default) or a job opts out
(``data.cache: false``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass

MAGIC = b"RDCACHE1"
_HEADER = len(MAGIC) + 32 + 8
_KEY = re.compile(r"^[0-9a-f]{64}$")
_ENTRY = re.compile(r"^[0-9a-f]{64}\.bin$")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a planted FIFO does not hang
_WRITE = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
COUNTERS = "counters.json"
COUNTER_NAMES = ("hits", "misses", "source_bytes")
STALE_TMP_S = 3600.0  # a temporary file this old was left by a writer that died


class CacheUnavailable(OSError):
    """The cache directory cannot be used safely (a link, not ours, open to others)."""


def cache_key(**parts: object) -> str:
    """The key of what ``parts`` describe (JSON-able): the same parts, the same key."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class CacheStats:
    entries: int
    bytes: int
    cap_bytes: int


class DataCache:
    """The entries under ``root`` (made 0700 if missing), at most ``max_bytes`` of them."""

    def __init__(self, root: str, max_bytes: int, lock_wait_s: float = 120.0):
        self.root, self.max_bytes, self.lock_wait_s = os.path.abspath(root), max_bytes, lock_wait_s

    @contextlib.contextmanager
    def _dir(self) -> Iterator[int]:
        os.makedirs(os.path.dirname(self.root), exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root, 0o700)
        try:
            fd = os.open(self.root, _DIR)
        except OSError as exc:
            raise CacheUnavailable(exc.errno, f"the data cache {self.root} is not a directory of its own") from exc
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or st.st_mode & 0o022:
                raise CacheUnavailable(errno.EPERM, f"the data cache {self.root} is not this user's alone")
            yield fd
        finally:
            os.close(fd)

    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (absent, or discarded as not whole)."""
        name = _name(key)
        with self._dir() as d:
            try:
                fd = os.open(name, _READ, dir_fd=d)
            except FileNotFoundError:
                return None
            except OSError:  # ELOOP: a symlink stands in the entry's place
                _unlink(d, name)
                return None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > _HEADER + self.max_bytes:
                    _unlink(d, name)
                    return None
                payload = _verified(_read_all(fd, st.st_size))
                if payload is None:
                    _unlink(d, name)
                    return None
                os.utime(fd)  # most recently used: evicted last
                return payload
            finally:
                os.close(fd)

    def put(self, key: str, payload: bytes) -> bool:
        """Store ``payload`` under ``key``, evicting the least recently used entries to
        stay under the cap; False when it alone is larger than the cap."""
        name, size = _name(key), _HEADER + len(payload)
        if size > self.max_bytes:
            return False
        with self._dir() as d:
            self._evict(d, self.max_bytes - size, keep=name)
            tmp = f".tmp-{secrets.token_hex(8)}"
            fd = os.open(tmp, _NEW, 0o600, dir_fd=d)
            try:
                digest = hashlib.sha256(payload).digest()
                with os.fdopen(fd, "wb", closefd=False) as f:
                    f.write(MAGIC + digest + len(payload).to_bytes(8, "big"))
                    f.write(payload)
                os.rename(tmp, name, src_dir_fd=d, dst_dir_fd=d)  # replaces a link, never follows it
            except BaseException:
                _unlink(d, tmp)
                raise
            finally:
                os.close(fd)
        return True

    def count(self, hit: bool, source_bytes: int) -> None:
        """Add one read to the node's counters (``counters``): what the cluster page shows."""
        with self._dir() as d:
            try:
                fd = os.open(COUNTERS, _WRITE, 0o600, dir_fd=d)
            except OSError:  # a link in its place: removed, and this read goes uncounted
                _unlink(d, COUNTERS)
                return
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:  # never write through to a file elsewhere
                    _unlink(d, COUNTERS)
                    return
                fcntl.flock(fd, fcntl.LOCK_EX)
                c = _counters(os.pread(fd, 4096, 0))
                c["hits" if hit else "misses"] += 1
                c["source_bytes"] += max(0, int(source_bytes))
                data = json.dumps(c).encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
            finally:
                os.close(fd)

    def counters(self) -> dict[str, int]:
        """Reads served from the cache (hits), from the source (misses) and the source's
        bytes read, by every job on the node since the counters file was made."""
        with self._dir() as d:
            try:
                fd = os.open(COUNTERS, _READ, dir_fd=d)
            except OSError:
                return _counters(b"")
            try:
                return _counters(os.pread(fd, 4096, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else b"")
            finally:
                os.close(fd)

    def discard(self, key: str) -> None:
        with self._dir() as d:
            _unlink(d, _name(key))

    def stats(self) -> CacheStats:
        with self._dir() as d:
            entries = self._entries(d)
        return CacheStats(len(entries), sum(size for _, size, _ in entries), self.max_bytes)

    @contextlib.contextmanager
    def filling(self, key: str) -> Iterator[bool]:
        """Hold ``key``'s fill lock while reading the source, so the workers and trials of
        one node read it once; False when another holds it past ``lock_wait_s`` (then
        read without waiting longer: a job holding a lock forever delays, never blocks)."""
        with self._dir() as d:
            try:
                fd = os.open(_name(key)[:-4] + ".lock", _READ | os.O_CREAT, 0o600, dir_fd=d)
            except OSError:
                yield False
                return
        try:
            deadline = time.monotonic() + self.lock_wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        yield False
                        return
                    time.sleep(0.05)
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _entries(self, d: int) -> list[tuple[str, int, float]]:
        """(name, size, last use) of each entry; leftovers of dead writers are removed."""
        entries, now = [], time.time()
        with os.scandir(d) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if _ENTRY.match(e.name) and stat.S_ISREG(st.st_mode):
                    entries.append((e.name, st.st_size, st.st_mtime))
                elif e.name.startswith(".tmp-") and now - st.st_mtime > STALE_TMP_S:
                    _unlink(d, e.name)
        return entries

    def _evict(self, d: int, budget: int, keep: str) -> None:
        """Remove the least recently used entries until the rest fit in ``budget`` bytes."""
        entries = sorted((e for e in self._entries(d) if e[0] != keep), key=lambda e: e[2])
        total = sum(size for _, size, _ in entries)
        for name, size, _ in entries:
            if total <= budget:
                break
            _unlink(d, name)
            _unlink(d, name[:-4] + ".lock")  # a reader waiting on it at worst reads the source once more
            total -= size


def _name(key: str) -> str:
    if not _KEY.match(key):
        raise ValueError(f"{key[:80]!r} is not a cache key (64 hex digits)")
    return key + ".bin"


def _read_all(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _verified(blob: bytes) -> bytes | None:
    """The payload of an entry whose magic, length and digest hold; None otherwise."""
    if len(blob) < _HEADER or not blob.startswith(MAGIC):
        return None
    digest = blob[len(MAGIC) : len(MAGIC) + 32]
    length = int.from_bytes(blob[len(MAGIC) + 32 : _HEADER], "big")
    payload = blob[_HEADER:]
    if len(payload) != length or hashlib.sha256(payload).digest() != digest:
        return None
    return payload


def _counters(raw: bytes) -> dict[str, int]:
    """The counters in ``raw``; zeros for what is missing or unreadable (any job may write it)."""
    try:
        read = json.loads(raw or b"{}")
    except ValueError:
        read = {}
    read = read if isinstance(read, dict) else {}
    return {k: v if isinstance(v := read.get(k), int) and 0 <= v < 2**62 else 0 for k in COUNTER_NAMES}


def _unlink(d: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
        os.unlink(name, dir_fd=d)  # a link is removed itself, never what it points at
