"""Checkpoint storage: a local directory or any pyarrow filesystem URI (s3://, gs://)."""

from __future__ import annotations

import io
import tarfile

import pyarrow.fs as pafs


def _resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    return pafs.FileSystem.from_uri(uri)


def exists(uri: str) -> bool:
    fs, path = _resolve(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def archive(uri: str) -> bytes:
    """A tar.gz of the directory at ``uri``, with paths relative to it."""
    fs, root = _resolve(uri)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
            if info.type != pafs.FileType.File:
                continue
            with fs.open_input_stream(info.path) as f:
                data = f.read()
            member = tarfile.TarInfo(info.path[len(root) :].lstrip("/"))
            member.size = len(data)
            member.mtime = int(info.mtime.timestamp()) if info.mtime else 0
            tar.addfile(member, io.BytesIO(data))
    return buf.getvalue()


def delete_tree(uri: str) -> None:
    fs, path = _resolve(uri)
    if fs.get_file_info(path).type == pafs.FileType.Directory:
        fs.delete_dir(path)


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])
