"""TensorBoard event files under ``<job prefix>/tensorboard/`` (a search: one run folder
per trial, ``tensorboard/<trial_id>/``), written with torch's ``SummaryWriter``. On an
object store the files are written in a local staging folder and uploaded after each
pass (whole files: the store has no append)."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

from service import storage
from service.tracking.names import scalars, tensorboard_tag

FOLDER = "tensorboard"
MAX_OPEN = 64  # writers kept open between passes (one per job or trial); the oldest is closed past it


class TensorboardSink:
    def __init__(self, storage_path: str, staging: Path) -> None:
        self.storage_path, self.staging = storage_path, staging
        self._writers: OrderedDict[tuple[str, str], object] = OrderedDict()

    def folder(self, job_id: str) -> str:
        """Where a job's event files are stored (a path or a storage URI)."""
        return storage.join(storage.job_prefix(self.storage_path, job_id), FOLDER)

    def _local(self, job_id: str) -> str:
        uri = self.folder(job_id)
        return storage.local_path(uri) if storage.is_local(uri) else str(self.staging / job_id)

    def _writer(self, job_id: str, run: str):
        key = (job_id, run)
        writer = self._writers.pop(key, None)
        if writer is None:
            from torch.utils.tensorboard import SummaryWriter  # heavy: only once a job asks for TensorBoard

            path = os.path.join(self._local(job_id), run) if run else self._local(job_id)
            os.makedirs(path, mode=0o700, exist_ok=True)
            writer = SummaryWriter(log_dir=path, flush_secs=3600)  # flushed by each pass
        self._writers[key] = writer
        while len(self._writers) > MAX_OPEN:
            _, oldest = self._writers.popitem(last=False)
            oldest.close()
        return writer

    def write(self, job_id: str, rows: list[tuple[str, int, float, dict]]) -> int:
        """Write reports ``(run, step, ts, values)`` (run "" for the job's own series); returns the scalars written."""
        written, used = 0, set()
        for run, step, ts, values in rows:
            writer = self._writer(job_id, run)
            used.add(run)
            for key, value in scalars(values).items():
                writer.add_scalar(tensorboard_tag(key), value, global_step=step, walltime=ts)
                written += 1
        for run in used:
            self._writers[(job_id, run)].flush()
        self._upload(job_id)
        return written

    def close(self, job_id: str) -> None:
        for key in [k for k in self._writers if k[0] == job_id]:
            self._writers.pop(key).close()
        self._upload(job_id)

    def _upload(self, job_id: str) -> None:
        if storage.is_local(self.folder(job_id)):
            return
        root = self._local(job_id)
        for folder, _, files in os.walk(root):
            for name in files:
                path = os.path.join(folder, name)
                storage.put_file(path, self.folder(job_id), os.path.relpath(path, root))
