"""The checkpoint writer behind the built-in loops (``trainers.checkpoint_writer``), on 2
gloo workers and a real store (a local folder, then moto's S3 server), no Ray:

- a write running in a thread beside training holds the state of its snapshot, not the
  state training moved on to, and is sealed with a manifest naming every worker's files;
- a write that fails on one worker raises on both and leaves no manifest, so the folder
  is neither complete for the server nor restorable.
"""

from __future__ import annotations

import os
import tempfile
import threading

import pyarrow.fs as pafs
import pytest
import torch

from api import checkpoint_manifest, object_store
from api.schemas import TrainSpec
from bench.harness.parallel import run_workers
from trainers import checkpoint, checkpoint_writer
from trainers.classifier_loop import build_classifier, steps
from trainers.data.tabular import InMemoryData
from trainers.skeleton import Start

pytestmark = pytest.mark.slow  # trains and writes in torch worker processes


def _spec() -> TrainSpec:
    return TrainSpec(
        model={"type": "mlp", "hidden_sizes": [32]},
        data={"source": "digits"},
        optimizer={"name": "adam", "lr": 1e-2},
        batch_size=32,
        max_steps=8,
    )


def _fetch(fs: pafs.FileSystem, path: str) -> str:
    """The checkpoint as a local folder (copied from the store), for DCP's reader."""
    local = tempfile.mkdtemp(prefix="raydock-test-restore-")
    pafs.copy_files(path, local, source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    return local


def write_beside_training(rank, world_size, bases, env):
    os.environ.update(env)
    return {store: _write_beside_training(rank, world_size, base) for store, base in bases.items()}


def _write_beside_training(rank, world_size, base):
    spec = _spec()
    data = InMemoryData(spec, rank, world_size)
    run = list(steps(spec, data, Start()))
    torch.manual_seed(0)
    pm = build_classifier(spec, data.n_features, data.n_classes)
    for s in run[:3]:
        pm.train_step(s.inputs, s.targets)
    group = checkpoint_writer.writer_group()
    fs, root = object_store.filesystem(base)
    dest = f"{root.rstrip('/')}/checkpoint_good"
    snap = checkpoint_writer.snapshot(pm, checkpoint.describe(spec, pm, epoch=0), group)
    at_snapshot = pm.full_model_state_dict()
    at_snapshot = {k: v.clone() for k, v in at_snapshot.items()}
    out: dict = {}
    writer = threading.Thread(target=lambda: out.update(files=checkpoint_writer.write(snap, fs, dest)))
    writer.start()
    for s in run[3:]:  # training (and its gradient all-reduce) goes on meanwhile
        pm.train_step(s.inputs, s.targets)
    writer.join()
    moved_on = pm.full_model_state_dict()

    # A write one worker cannot do: a destination under a file, on rank 1 only.
    bad_dest = f"{root.rstrip('/')}/checkpoint_bad"
    if rank == 1:
        with fs.open_output_stream(f"{root.rstrip('/')}/blocker") as f:
            f.write(b"x")
        bad_dest_here = f"{root.rstrip('/')}/blocker/checkpoint_bad"
    else:
        bad_dest_here = bad_dest
    snap = checkpoint_writer.snapshot(pm, checkpoint.describe(spec, pm, epoch=1), group)
    try:
        checkpoint_writer.write(snap, fs, bad_dest_here)
        failed = None
    except checkpoint_writer.IncompleteCheckpoint as exc:
        failed = str(exc)
    result = {"files": out.get("files"), "failed": failed, "staging_left": os.path.exists(snap.staging)}
    if rank == 0:
        good = checkpoint_writer.listing(fs, dest)
        with fs.open_input_stream(f"{dest}/{checkpoint_manifest.MANIFEST_FILE}") as f:
            manifest = f.read()
        local = _fetch(fs, dest)
        result.update(
            listing=good,
            manifest=manifest,
            bad_listing=checkpoint_writer.listing(fs, bad_dest),
            weights=checkpoint.load_weights(local),
            at_snapshot=at_snapshot,
            moved_on=moved_on,
            meta=checkpoint.read_meta(local),
            local=local,
        )
    # Every worker restores (a collective) from rank 0's fetched copy.
    box = [result.get("local")]
    torch.distributed.broadcast_object_list(box, src=0)
    torch.manual_seed(1)
    restored = build_classifier(spec, data.n_features, data.n_classes)
    checkpoint.restore(box[0], restored)
    result["restored"] = restored.full_model_state_dict()
    result["restored_step"] = restored.step
    return result


def test_a_background_write_keeps_its_snapshot_and_a_failed_one_is_never_sealed(tmp_path, s3_server, s3_env):
    bases = {"local": str(tmp_path / "storage"), "s3": s3_server.fresh_prefix()}
    both = run_workers(write_beside_training, 2, bases, s3_env, timeout_s=300)  # one start for both stores
    for store in bases:
        _check(store, both[0][store], both[1][store])


def _check(store: str, r0: dict, r1: dict) -> None:
    # Sealed: the manifest names every worker's files with their sizes on the store.
    assert r0["files"] == r1["files"] and r0["files"], store
    assert checkpoint_manifest.parse(r0["manifest"]) == r0["files"]
    names = set(r0["files"])
    assert {checkpoint.WEIGHTS_FILE, checkpoint.META_FILE, "shards/.metadata"} <= names
    assert sum(n.startswith("shards/") and n.endswith(".distcp") for n in names) == 2  # one shard per worker
    assert checkpoint_manifest.complete(r0["listing"], r0["manifest"])
    assert checkpoint_manifest.UPLOADING_FILE not in r0["listing"]  # dropped once sealed

    # The snapshot's state, not the state training moved on to while it was written.
    assert r0["meta"]["step"] == 3 and r0["restored_step"] == r1["restored_step"] == 3
    changed = [k for k in r0["at_snapshot"] if not torch.equal(r0["at_snapshot"][k], r0["moved_on"][k])]
    assert changed, "training went on: the weights moved after the snapshot"
    for name, value in r0["at_snapshot"].items():
        assert torch.equal(r0["weights"][name], value), name
        assert torch.equal(r0["restored"][name], value), name

    # The failed write: raised on both workers, no manifest, not a complete checkpoint.
    assert r0["failed"] and r1["failed"]
    assert "worker 1" in r0["failed"] or "__1_0.distcp" in r0["failed"]  # its error, or its shard missing
    assert checkpoint_manifest.MANIFEST_FILE not in r0["bad_listing"]
    assert checkpoint_manifest.UPLOADING_FILE in r0["bad_listing"]
    assert not checkpoint_manifest.complete(r0["bad_listing"], None)
    assert not r0["staging_left"] and not r1["staging_left"]


@pytest.mark.parametrize(
    ("listing", "manifest", "complete"),
    [
        ({".uploading": 0, "shards/__0_0.distcp": 10}, None, False),  # killed mid-upload
        ({".uploading": 0, "model.pt": 7, "state.json": 5}, None, False),  # every file, no manifest yet
        ({"shards/__0_0.distcp": 10, "state.json": 5}, None, True),  # written before manifests
        ({"model.pt": 7, "meta.json": 2}, None, True),  # a user loop's checkpoint (Ray reported it)
        ({"model.pt": 7, "manifest.json": 30}, checkpoint_manifest.render({"model.pt": 7}), True),
        ({".uploading": 0, "model.pt": 7, "manifest.json": 30}, checkpoint_manifest.render({"model.pt": 7}), True),
        ({"model.pt": 6, "manifest.json": 30}, checkpoint_manifest.render({"model.pt": 7}), False),  # cut short
        ({"manifest.json": 30}, checkpoint_manifest.render({"model.pt": 7}), False),  # a file missing
        ({"model.pt": 7, "manifest.json": 3}, b"{x", False),  # not JSON
        ({"model.pt": 7, "manifest.json": 3}, b'{"format": 1, "files": {"../x": 1}}', False),
        ({"model.pt": 7, "manifest.json": 3}, None, False),  # a manifest that cannot be read
    ],
)
def test_completeness_of_a_checkpoint_folder(listing, manifest, complete):
    assert checkpoint_manifest.complete(listing, manifest) is complete
