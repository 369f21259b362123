"""How the built-in loops hand reports and checkpoints to Ray Train.

A checkpoint is a snapshot (``trainers.checkpoint_writer``: state copied to CPU memory,
the only part the step loop waits for) plus a write that uploads it into the run's
storage and seals it with a manifest. The write is the ``checkpoint_upload_fn`` of a
``ray.train.report``, so Ray Train registers the checkpoint (latest, resumable, kept
or deleted by ``checkpoint.keep``, sent to the server) only once the write returned:
a worker killed mid-upload leaves a folder with no manifest, and the run resumes from
the checkpoint before it.

``checkpoint.upload`` picks where the write runs:

- ``sync``: in the loop's thread (Ray Train's SYNC mode): the report returns once the
  checkpoint is sealed;
- ``async``: in Ray Train's upload thread (ASYNC mode): the loop goes on after the
  snapshot. One write is in flight at a time: the next checkpoint first waits for the
  pending one (never replaces it, so a checkpoint asked for is one that gets written).
  Every report from then on goes through the same thread, in order (a report in SYNC
  mode would wait there anyway), so reports that follow a checkpoint reach the server
  once its upload is done.

The last step's checkpoint and a preemption's are written before the loop goes on
(``wait``): a run ends, or gives its room back, with its checkpoint sealed.
"""

from __future__ import annotations

import shutil
import threading
from typing import Any

import ray.train
from ray.train import CheckpointUploadMode

from trainers import checkpoint_writer, ray_compat
from trainers.parallel import ParallelModel


class Reporter:
    """One run's reports, from every worker (each ``report`` is a barrier)."""

    def __init__(self, mode: str = "sync") -> None:
        self.background = mode == "async"
        self.group: Any = None
        self.made_group = False
        self.pending: threading.Event | None = None

    @property
    def upload_mode(self) -> CheckpointUploadMode:
        return CheckpointUploadMode.ASYNC if self.background else CheckpointUploadMode.SYNC

    def report(self, metrics: dict[str, Any], pm: ParallelModel | None = None, meta: dict | None = None) -> None:
        """Report ``metrics``; with ``pm``, a checkpoint of it with ``meta`` in its state.json."""
        if pm is None:
            ray.train.report(metrics, checkpoint_upload_mode=self.upload_mode)
            return
        self.wait()  # one upload in flight
        if not self.made_group:
            self.group, self.made_group = checkpoint_writer.writer_group(), True
        snap = checkpoint_writer.snapshot(pm, meta or {}, self.group)
        done = self.pending = threading.Event()

        def upload(_staged: Any, dir_name: str) -> Any:
            try:
                storage = ray_compat.current_storage()
                dest = storage.build_checkpoint_path_from_name(dir_name)
                checkpoint_writer.write(snap, storage.storage_filesystem, dest)
                return ray_compat.checkpoint_at(storage, dir_name)
            finally:
                done.set()

        # Ray Train asks for a local folder to hand to the upload; the snapshot's staging
        # folder is that (the write fills and removes it).
        staged = ray.train.Checkpoint.from_directory(snap.staging)
        ray.train.report(
            metrics,
            checkpoint=staged,
            checkpoint_upload_mode=self.upload_mode,
            checkpoint_upload_fn=upload,
            delete_local_checkpoint_after_upload=False,  # the write removes it itself
        )
        if not self.background:  # the write ran, or Ray Train skipped the report (a worker failed)
            done.set()
            shutil.rmtree(snap.staging, ignore_errors=True)

    def wait(self) -> None:
        """Until the pending checkpoint's write has ended (sealed or failed)."""
        if self.pending is not None:
            self.pending.wait()
            self.pending = None
