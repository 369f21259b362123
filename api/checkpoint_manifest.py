"""A checkpoint's manifest: the file names and sizes it holds, written last.

The built-in loops upload a checkpoint file by file (every worker its shard, global
rank 0 the weights and ``state.json``), then global rank 0 checks every file's size on
the store and writes ``manifest.json``: ``{"format": 1, "files": {"<name>": <bytes>}}``.
A checkpoint is complete when its manifest is there and every file it names has that
size. Until then nobody treats the folder as a checkpoint: Ray Train is not told of it
(so it is never "latest" nor resumed from) and the server does not list or serve it.

Before its first file every worker puts an empty ``.uploading`` marker in the folder
(removed once the manifest is written), so a folder with the marker and no manifest is
half-written. A folder with neither is what Ray Train reported after its own upload
completed, as before manifests: a user loop's checkpoint, or one written before them.
Pure functions over a listing (name -> size), shared by
the cluster (``trainers.checkpoint_writer``) and the server (``service.files.checkpoints``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

MANIFEST_FILE = "manifest.json"
FORMAT = 1
MAX_MANIFEST_BYTES = 1 << 20  # what a reader reads of a manifest at most
MAX_FILES = 10_000
UPLOADING_FILE = ".uploading"


def render(files: Mapping[str, int]) -> bytes:
    """The manifest of ``files`` (name relative to the checkpoint -> size in bytes)."""
    if len(files) > MAX_FILES:
        raise ValueError(f"a checkpoint of {len(files)} files; at most {MAX_FILES} are listed in a manifest")
    return json.dumps({"format": FORMAT, "files": dict(sorted(files.items()))}).encode()


def parse(data: bytes) -> dict[str, int]:
    """The files a manifest names; ``ValueError`` for anything that is not one."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ValueError("manifest too large")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"manifest is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("files"), dict):
        raise ValueError("manifest has no format-1 file table")
    files = doc["files"]
    if len(files) > MAX_FILES or not all(
        isinstance(k, str) and type(v) is int and v >= 0 and _plain(k) for k, v in files.items()
    ):
        raise ValueError("manifest file table holds a bad entry")
    return files


def mismatches(expected: Mapping[str, int], listing: Mapping[str, int]) -> list[str]:
    """The names of ``expected`` missing from ``listing`` or of another size there."""
    return sorted(name for name, size in expected.items() if listing.get(name) != size)


def complete(listing: Mapping[str, int], manifest: bytes | None) -> bool:
    """Whether a folder holding ``listing`` (every file: name -> size) is a complete
    checkpoint, given its manifest's bytes (None when it has none)."""
    if manifest is None:
        return MANIFEST_FILE not in listing and UPLOADING_FILE not in listing  # a manifest there but not read: no
    try:
        files = parse(manifest)
    except ValueError:
        return False
    return not mismatches(files, listing)


def _plain(name: str) -> bool:
    parts = name.split("/")
    return 0 < len(name) <= 1024 and "\x00" not in name and all(p not in ("", ".", "..") for p in parts)
