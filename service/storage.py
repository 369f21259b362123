"""Checkpoint storage: a local directory or any pyarrow filesystem URI (s3://, gs://).

Every job owns one prefix, ``<storage>/<job id>``; what it reports (checkpoint paths,
results) is accepted only inside it and outside its ``_raydock`` folder (``owned``), and
read back only from there.
"""

from __future__ import annotations

import os
import posixpath
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pafs

from service.files import localfs

LAUNCH_DIR = "_raydock"  # under a job's prefix: what the server hands each attempt's driver


def _resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    return pafs.FileSystem.from_uri(uri)


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def job_prefix(base: str, job_id: str) -> str:
    return join(base, job_id)


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


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


def write_private(uri: str, data: bytes) -> None:
    """Write a file only the server's user can read (0600 where the filesystem has modes)."""
    if is_local(uri):
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
    if is_local(uri):
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
