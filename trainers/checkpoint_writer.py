"""Writing a checkpoint in two halves: a snapshot the step loop waits for, and the
write and upload that can run behind it.

:func:`snapshot` (every worker, in the loop's thread) copies the state to CPU memory:
this worker's shard through DCP's stager (``dcp.async_save``, whose write then runs in
its own thread), and on global rank 0 the consolidated weights and ``state.json``'s
meta. Training may change the model as soon as it returns.

:func:`write` (every worker, in any thread) finishes one snapshot: the shard files and
rank 0's ``model.pt`` / ``state.json`` land in a local staging folder, are uploaded to
the checkpoint's folder on the run's storage (after an ``.uploading`` marker), then rank 0 gathers
every worker's file list, checks each file's size on the store, uploads ``state.json``
and writes ``manifest.json`` last (``api.checkpoint_manifest``), then drops the marker. It returns on every worker once
the manifest is written, or raises on every worker when any of them failed: a
checkpoint with no manifest was never finished, and nothing reads it as one.

The workers talk over a process group of their own (:func:`writer_group`, gloo), so a
write in a background thread never interleaves with the loop's collectives. Nothing
here imports Ray: ``trainers.reporter`` hands the result to Ray Train.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from api import checkpoint_manifest
from trainers.checkpoint import FORMAT, META_FILE, SHARDS_DIR, WEIGHTS_FILE

if TYPE_CHECKING:
    from trainers.parallel.base import ParallelModel


COPY_CHUNK = 8 << 20  # bytes per write to the store


class IncompleteCheckpoint(RuntimeError):
    """A checkpoint whose files did not all reach the store as written."""


@dataclass
class Snapshot:
    """One worker's state, copied to CPU memory at a checkpoint."""

    staging: str  # a local folder of this worker's own, removed by ``write``
    shards: Future | None  # DCP's write of this worker's shard into ``staging/shards``
    weights: dict[str, torch.Tensor] | None  # global rank 0's consolidated weights
    meta: dict[str, Any] | None  # global rank 0's state.json
    group: Any  # the writer's process group (None: a world of one)


def writer_group() -> Any:
    """A gloo group over every worker for checkpoint writes (a collective: every worker
    calls it, once, from the loop's thread); None outside torch.distributed."""
    return dist.new_group(backend="gloo") if dist.is_initialized() else None


def snapshot(pm: ParallelModel, meta: dict[str, Any], group: Any) -> Snapshot:
    """Copy ``pm``'s state to CPU memory (a collective). The staging copy of the shard is
    DCP's; the consolidated weights are cloned, since on CPU they are the live tensors."""
    staging = tempfile.mkdtemp(prefix="raydock-checkpoint-")
    try:
        shards = dcp.async_save(pm.state_dict(), checkpoint_id=os.path.join(staging, SHARDS_DIR), process_group=group)
        weights = pm.full_model_state_dict()  # a collective; the weights land on rank 0
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if _rank() != 0:
        return Snapshot(staging, shards, None, None, group)
    weights = {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}
    return Snapshot(staging, shards, weights, {"format": FORMAT, **meta}, group)


def write(snap: Snapshot, fs: pafs.FileSystem, dest: str) -> dict[str, int]:
    """Finish ``snap``: write, upload to ``dest`` on ``fs``, verify, manifest. Every
    worker calls it with its own snapshot; it returns the manifest's file table."""
    try:
        try:
            local, failure = _write_and_upload(snap, fs, dest), None
        except Exception as exc:  # noqa: BLE001 - goes to every worker below
            local, failure = {}, f"{type(exc).__name__}: {exc}"
        parts = _gather(snap.group, (local, failure))
        outcome: tuple[dict[str, int] | None, str | None] = (None, None)
        if _rank() == 0:
            outcome = _seal(parts, fs, dest, snap.staging)
        files, error = _broadcast(snap.group, outcome)
    finally:
        shutil.rmtree(snap.staging, ignore_errors=True)
    if error is not None:
        raise IncompleteCheckpoint(f"checkpoint {dest} was not finished: {error}")
    return files


def _write_and_upload(snap: Snapshot, fs: pafs.FileSystem, dest: str) -> dict[str, int]:
    if snap.shards is not None:
        snap.shards.result()  # this worker's shard files (and, on the coordinator, .metadata)
    if snap.weights is not None:
        torch.save(snap.weights, os.path.join(snap.staging, WEIGHTS_FILE))
        with open(os.path.join(snap.staging, META_FILE), "w") as f:
            json.dump(snap.meta, f)
    local = listing(pafs.LocalFileSystem(), snap.staging)
    dest = dest.rstrip("/")
    fs.create_dir(dest, recursive=True)
    with fs.open_output_stream(f"{dest}/{checkpoint_manifest.UPLOADING_FILE}"):
        pass  # before any file: the folder reads as half-written until its manifest is there
    made: set[str] = {dest}
    for name in sorted(local, key=lambda n: (not n.startswith(SHARDS_DIR + "/"), n)):
        if name == META_FILE:
            continue  # uploaded by _seal, once every other file is on the store
        parent = f"{dest}/{name}".rsplit("/", 1)[0]
        if parent not in made:
            fs.create_dir(parent, recursive=True)
            made.add(parent)
        _put(os.path.join(snap.staging, name), fs, f"{dest}/{name}")
    return local


def _put(local_path: str, fs: pafs.FileSystem, path: str) -> None:
    with open(local_path, "rb") as src, fs.open_output_stream(path) as out:
        shutil.copyfileobj(src, out, COPY_CHUNK)


def _seal(parts: list, fs: pafs.FileSystem, dest: str, staging: str) -> tuple[dict[str, int] | None, str | None]:
    """Global rank 0: check every worker's files on the store, then upload state.json
    and write the manifest."""
    failures = [f"worker {rank}: {failure}" for rank, (_, failure) in enumerate(parts) if failure]
    if failures:
        return None, "; ".join(failures)
    expected: dict[str, int] = {}
    for local, _ in parts:
        expected.update(local)
    dest = dest.rstrip("/")
    try:
        others = {name: size for name, size in expected.items() if name != META_FILE}
        bad = checkpoint_manifest.mismatches(others, listing(fs, dest))
        if not bad:
            _put(os.path.join(staging, META_FILE), fs, f"{dest}/{META_FILE}")
            bad = checkpoint_manifest.mismatches(expected, listing(fs, dest))
        if bad:
            return None, f"on the store, missing or of another size: {bad[:10]}"
        with fs.open_output_stream(f"{dest}/{checkpoint_manifest.MANIFEST_FILE}") as out:
            out.write(checkpoint_manifest.render(expected))
    except Exception as exc:  # noqa: BLE001 - every worker raises it
        return None, f"{type(exc).__name__}: {exc}"
    try:
        fs.delete_file(f"{dest}/{checkpoint_manifest.UPLOADING_FILE}")
    except OSError:  # the manifest holds either way; the marker only stays in the listing
        pass
    return expected, None


def listing(fs: pafs.FileSystem, root: str) -> dict[str, int]:
    """Every file below ``root`` on ``fs``: "/"-separated name relative to it -> size."""
    root = root.rstrip("/")
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return {i.path[len(root) :].lstrip("/"): i.size for i in infos if i.type == pafs.FileType.File}


def _gather(group: Any, item: Any) -> list:
    if not dist.is_initialized():
        return [item]
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, item, group=group)
    return parts


def _broadcast(group: Any, item: Any) -> Any:
    if not dist.is_initialized():
        return item
    box = [item]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0
