"""Whether a checkpoint folder a job reported is complete (``api.checkpoint_manifest``):
the server lists and serves only those.

The folder is the job's: it is read as a download reads it, a local one by directory fd
without following a link (``service.files.localfs``), an object store's through pyarrow,
and of the manifest at most ``MAX_MANIFEST_BYTES`` are read. Any error reading it counts
as incomplete.
"""

from __future__ import annotations

import os

import pyarrow.fs as pafs

from api import checkpoint_manifest, object_store
from api.checkpoint_manifest import MANIFEST_FILE, MAX_MANIFEST_BYTES
from service.files import localfs, storage


def complete(uri: str, prefix: str) -> bool:
    """Whether ``uri`` (a folder inside the job's ``prefix``) is a complete checkpoint."""
    try:
        listing, manifest = _local(uri, prefix) if storage.is_local(uri) else _remote(uri)
    except (OSError, ValueError):
        return False
    return checkpoint_manifest.complete(listing, manifest)


def _local(uri: str, prefix: str) -> tuple[dict[str, int], bytes | None]:
    root = localfs.real_prefix(storage.local_path(prefix))
    relative = os.path.relpath(os.path.realpath(storage.local_path(uri)), root)
    if relative == ".." or relative.startswith("../"):
        raise PermissionError(f"{uri} is outside {prefix}")
    prefix_fd = localfs.open_prefix(storage.local_path(prefix))
    try:
        top = localfs.open_dir_under(prefix_fd, relative)
    finally:
        os.close(prefix_fd)
    listing: dict[str, int] = {}
    manifest = None
    try:
        for f in localfs.regular_files(top):
            listing[f.name] = f.size
            if f.name == MANIFEST_FILE:
                with f.reader() as r:
                    manifest = r.read(MAX_MANIFEST_BYTES + 1)
    finally:
        os.close(top)
    return listing, manifest


def _remote(uri: str) -> tuple[dict[str, int], bytes | None]:
    fs, root = object_store.filesystem(uri)
    root = root.rstrip("/")
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    listing = {i.path[len(root) :].lstrip("/"): i.size for i in infos if i.type == pafs.FileType.File}
    if MANIFEST_FILE not in listing:
        return listing, None
    with fs.open_input_stream(f"{root}/{MANIFEST_FILE}") as r:
        return listing, r.read(MAX_MANIFEST_BYTES + 1)
