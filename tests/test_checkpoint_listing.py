"""A half-written checkpoint is never listed, served or resumed from, on a local directory
and on moto's S3 server, with no Ray: of the folders a job reported, the server lists
those whose manifest holds (or, with neither a manifest nor the writer's ``.uploading``
marker, a user loop's and one written before manifests), refuses the others' download, and the loop's restore refuses them too."""

from __future__ import annotations

import tempfile

import pyarrow.fs as pafs
import pytest

from api import object_store
from api.checkpoint_manifest import MANIFEST_FILE, render
from api.errors import NotFound
from bench.harness.jobstore import job_service, submit
from service.db.event_models import CheckpointRow
from service.files import storage
from trainers import checkpoint

SHARD = b"s" * 300
WEIGHTS = b"w" * 100
META = b'{"format": 1, "step": 2, "epoch": 0}'
FOLDERS = {
    # sealed by its manifest
    "complete": {"shards/__0_0.distcp": SHARD, "shards/.metadata": b"m", "model.pt": WEIGHTS, "state.json": META},
    # killed mid-upload: the writer's marker, a shard, no manifest
    "partial": {".uploading": b"", "shards/__0_0.distcp": SHARD},
    # a manifest naming a shard the store holds cut short
    "short": {"shards/__0_0.distcp": SHARD[:10], "model.pt": WEIGHTS, "state.json": META},
    # no marker and no manifest: a user loop's (or one from before manifests), reported by
    # Ray Train after its own upload completed
    "user": {"weights.bin": WEIGHTS, "shards/x": SHARD},
}
MANIFESTS = {
    "complete": {n: len(d) for n, d in FOLDERS["complete"].items()},
    "short": {"shards/__0_0.distcp": len(SHARD), "model.pt": len(WEIGHTS), "state.json": len(META)},
}


@pytest.fixture()
def service(storage_base, tmp_path):
    svc = job_service(f"sqlite:///{tmp_path / 'store.db'}", tmp_path / "data", storage_path=storage_base)
    yield svc
    svc.sessions.kw["bind"].dispose()


def _local_copy(uri: str) -> str:
    fs, path = object_store.filesystem(uri)
    local = tempfile.mkdtemp(prefix="raydock-test-ckpt-")
    pafs.copy_files(path, local, source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    return local


def test_only_complete_checkpoints_are_listed_served_and_restorable(service):
    job_id = submit(service, name="ckpt")
    prefix = service.reads.prefix(job_id)
    ids = {}
    for name, files in FOLDERS.items():
        for rel, data in files.items():
            storage.write_private(prefix, f"{name}/{rel}", data)
        if name in MANIFESTS:
            storage.write_private(prefix, f"{name}/{MANIFEST_FILE}", render(MANIFESTS[name]))
        with service.sessions.begin() as s:
            row = CheckpointRow(job_id=job_id, attempt=1, path=storage.join(prefix, name), step=1, values={})
            s.add(row)
            s.flush()
            ids[name] = row.id

    listed = [c.id for c in service.reads.checkpoints(job_id)]
    refused = {}
    for name in ("partial", "short"):
        with pytest.raises(NotFound) as exc:
            service.reads.checkpoint_archive(job_id, ids[name])
        refused[name] = exc.value
    served = b"".join(service.reads.checkpoint_archive(job_id, ids["complete"])[1])
    restorable = {}
    for name in ("complete", "partial", "short"):
        try:
            checkpoint.check_complete(_local_copy(storage.join(prefix, name)))
            restorable[name] = True
        except ValueError:
            restorable[name] = False

    assert listed == [ids["complete"], ids["user"]]
    assert all("not complete" in str(e) for e in refused.values()), refused
    assert served  # a tar.gz of the complete one
    assert restorable == {"complete": True, "partial": False, "short": False}
