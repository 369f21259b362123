"""Checkpoint storage: a local directory or any pyarrow filesystem URI (s3://, gs://).

Every job owns one prefix, ``<storage>/<job id>``; what it reports (checkpoint paths,
results) is accepted only inside it and outside its ``_raydock`` folder (``owned``), and
read back only from there. On an object store a key is a string: what the server writes
or deletes below a prefix is named by a bounded key with no ``..`` step
(``api.object_store.key_parts``), so it stays under that prefix. The filesystem (endpoint,
region, credentials) is built in one place, ``api.object_store.filesystem``.
"""

from __future__ import annotations

import os
import posixpath
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pafs

from api import object_store
from service.files import localfs, nofollow

LAUNCH_DIR = "_raydock"  # under a job's prefix: what the server hands each attempt's driver


def _resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    return object_store.filesystem(uri)


def _key(relative: str) -> str:
    """``relative`` as a key below a prefix, on either backend: bounded, no ``..`` step (PermissionError)."""
    return "/".join(object_store.key_parts(relative))


def _below(prefix: str, relative: str) -> tuple[pafs.FileSystem, str]:
    """The object-store path of ``relative`` (a checked key) under ``prefix``."""
    return _resolve(join(prefix.rstrip("/"), relative))


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def job_prefix(base: str, job_id: str) -> str:
    return join(base, job_id)


def is_local(uri: str) -> bool:
    return object_store.is_local(uri)


def local_path(uri: str) -> str:
    """The path a local ``uri`` names, as pyarrow reads it: a ``file://`` URI percent-decoded."""
    return unquote(urlsplit(uri).path) if uri.startswith("file://") else uri


def _local(uri: str) -> str:
    return os.path.realpath(local_path(uri))


def within(path: str, prefix: str) -> bool:
    """Whether ``path`` names something inside ``prefix`` once normalised: the same
    scheme and bucket, no ``..`` step (percent-decoded first, as pyarrow reads a URI), no
    query or fragment, and (for a local path) no symlink out of it."""
    if not path or is_local(prefix) != is_local(path):
        return False
    if is_local(path):
        # A file:// URI is checked as pyarrow will read it: decoded, so %2e%2e is a ``..``.
        if path.startswith("file://") and not (path.startswith("file:///") and _plain_url(path)):
            return False
        path = local_path(path)
    if "\x00" in path or ".." in path.replace("\\", "/").split("/"):
        return False
    if is_local(prefix):
        if not path.startswith("/"):
            return False
        # The prefix's own last component is not followed: a job that turned its directory
        # into a link has nothing inside it.
        root, target = localfs.real_prefix(local_path(prefix)), os.path.realpath(path)
        return target == root or target.startswith(root.rstrip("/") + "/")
    p, t = urlsplit(prefix), urlsplit(path)
    if (p.scheme, p.netloc) != (t.scheme, t.netloc) or t.query or t.fragment or not _plain_url(path):
        return False
    decoded = unquote(t.path)  # as for file://, checked as it will be read
    if "\x00" in decoded or ".." in decoded.split("/"):
        return False
    root, target = posixpath.normpath(unquote(p.path) or "/"), posixpath.normpath(decoded or "/")
    return target == root or target.startswith(root.rstrip("/") + "/")


def _plain_url(uri: str) -> bool:
    return "?" not in uri and "#" not in uri  # pyarrow would drop a query or fragment unseen


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


def existing(uris: list[str]) -> set[str]:
    """Which of ``uris`` name something in storage. Locally each is looked up; on an object
    store a lookup costs a request or two per object (and a job lists every checkpoint it
    ever reported, most deleted by ``checkpoint.keep``), so each folder they are in is
    listed once instead: a job's checkpoints share one."""
    found: set[str] = set()
    by_folder: dict[str, list[str]] = {}
    for uri in uris:
        if is_local(uri):
            if exists(uri):
                found.add(uri)
        else:
            by_folder.setdefault(uri.rstrip("/").rsplit("/", 1)[0], []).append(uri)
    for folder, members in by_folder.items():
        fs, path = _resolve(folder)
        listed = {
            info.path.rstrip("/")
            for info in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
            if info.type != pafs.FileType.NotFound
        }
        found.update(uri for uri in members if _resolve(uri)[1].rstrip("/") in listed)
    return found


def write_private(prefix: str, relative: str, data: bytes) -> None:
    """Write ``relative`` under ``prefix`` so only the server's user can read it (0600
    where the filesystem has modes). Locally nothing on the way below the prefix's parent
    (the server's) is followed: a link a job planted at the prefix, at a folder or at the
    file itself is replaced, never written through (service/files/nofollow.py)."""
    relative = _key(relative)
    if is_local(prefix):
        parent, name = _split_prefix(prefix)
        nofollow.write_file_nofollow(parent, f"{name}/{relative}", data, 0o600)
        return
    fs, path = _below(prefix, relative)
    fs.create_dir(posixpath.dirname(path), recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(data)


def remove(prefix: str, relative: str = "") -> None:
    """Delete ``relative`` under ``prefix`` (a file or a tree), or the whole prefix when
    ``relative`` is empty. Locally no link is followed, on the way or inside: a link in
    place of what is deleted goes itself, never what it points at."""
    relative = _key(relative) if relative else ""
    if is_local(prefix):
        parent, name = _split_prefix(prefix)
        nofollow.remove_nofollow(parent, f"{name}/{relative}" if relative else name)
        return
    fs, path = _below(prefix, relative) if relative else _resolve(prefix)
    kind = fs.get_file_info(path).type
    if kind == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif kind == pafs.FileType.File:
        fs.delete_file(path)


def put_file(local_path: str, prefix: str, relative: str) -> None:
    """Store a local file at ``relative`` under ``prefix`` whole or not at all: a local
    target is written next to it and renamed (no link followed, as ``write_private``), an
    object store's upload becomes visible only when complete."""
    relative = _key(relative)
    if is_local(prefix):
        parent, name = _split_prefix(prefix)
        with open(local_path, "rb") as src:
            nofollow.write_file_nofollow(parent, f"{name}/{relative}", src, 0o600)
        return
    fs, path = _below(prefix, relative)
    fs.create_dir(posixpath.dirname(path), recursive=True)
    with open(local_path, "rb") as src, fs.open_output_stream(path) as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)


def _split_prefix(prefix: str) -> tuple[str, str]:
    """A local prefix as its parent (the server's, resolved) and its own name (not followed)."""
    norm = os.path.normpath(local_path(prefix))
    return os.path.realpath(os.path.dirname(norm)), os.path.basename(norm)


def open_random_access(uri: str):
    """A seekable binary file for ``uri`` (a zip's directory is read without fetching it all).
    A local one must be a regular file reached without a link: the storage is shared
    with what jobs write, and a FIFO or a link put in its place is refused (``OSError``)."""
    if is_local(uri):
        return os.fdopen(localfs.open_regular(local_path(uri)), "rb")
    fs, path = _resolve(uri)
    return fs.open_input_file(path)


def fetch_uri(uri: str) -> str:
    """The URI a Ray node fetches ``uri`` by: ``file://`` for a local path (every node
    must see it, as for checkpoints), the storage URI itself otherwise."""
    return "file://" + _local(uri) if is_local(uri) else uri
