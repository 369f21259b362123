"""TensorBoard event files under ``<job prefix>/tensorboard/`` (a search: one run folder
per trial, ``tensorboard/trial-<hash of its id>/``, whose text ``raydock/trial_id`` names
the trial), written with torch's ``SummaryWriter``.

The writers write into a staging folder the server owns (``<data dir>/tensorboard-staging/
<job id>``), never into the job's prefix: the job chose its trial ids and can plant links
in its prefix. After each pass the files that changed are copied into the prefix with
``storage.put_file``: on local storage each component is opened without following a link
(a link the job planted is replaced, never written through) and each file renamed into
place (``service/files/nofollow.py``); on an object store uploaded whole. A job's staging folder is removed once its end is exported."""

from __future__ import annotations

import os
import shutil
import time
from collections import OrderedDict
from pathlib import Path

from service.files import storage
from service.tracking.names import scalars, tensorboard_tag, trial_folder

FOLDER = "tensorboard"
MAX_OPEN = 64  # writers kept open between passes (one per job or trial); the oldest is closed past it
# A file holding this many scalars (a few MB) is closed and the run's next report starts a
# new one: a pass copies again only the files that changed, so at most this much per run.
# Not within the second the file was made: TensorBoard reads a folder's files in name order,
# and a name starts with the second it was made in.
MAX_SCALARS_PER_FILE = 100_000
TRIAL_TEXT = "raydock/trial_id"


class TensorboardSink:
    def __init__(self, storage_path: str, staging: Path) -> None:
        self.storage_path, self.staging = storage_path, staging
        # (job, run) -> [writer, scalars in its file, the second its file was made in]
        self._writers: OrderedDict[tuple[str, str], list] = OrderedDict()
        self._copied: dict[str, dict[str, tuple[int, int]]] = {}  # job -> staged file -> (size, mtime) copied

    def folder(self, job_id: str) -> str:
        """Where a job's event files are stored (a path or a storage URI)."""
        return storage.join(storage.job_prefix(self.storage_path, job_id), FOLDER)

    def _staged(self, job_id: str) -> Path:
        return self.staging / job_id  # the job id is the server's

    def staged_jobs(self) -> list[str]:
        """The jobs with a staging folder (at most the tracked jobs not done, and those deleted since)."""
        try:
            return [e.name for e in os.scandir(self.staging) if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return []

    def _writer(self, job_id: str, run: str) -> list:
        key = (job_id, run)
        open_ = self._writers.pop(key, None)
        if open_ is not None and open_[1] >= MAX_SCALARS_PER_FILE and int(time.time()) > open_[2]:
            open_[0].close()
            open_ = None
        if open_ is None:
            from torch.utils.tensorboard import SummaryWriter  # heavy: only once a job asks for TensorBoard

            path = self._staged(job_id) / trial_folder(run) if run else self._staged(job_id)
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            writer = SummaryWriter(log_dir=str(path), flush_secs=3600)  # flushed by each pass
            if run:
                writer.add_text(TRIAL_TEXT, run, global_step=0)
            open_ = [writer, 0, int(time.time())]
        self._writers[key] = open_
        while len(self._writers) > MAX_OPEN:
            _, oldest = self._writers.popitem(last=False)
            oldest[0].close()
        return open_

    def write(self, job_id: str, rows: list[tuple[str, int, float, dict]]) -> int:
        """Write reports ``(run, step, ts, values)`` to the staging folder (run: a trial id, ""
        for the job's own series); returns the scalars written. ``publish`` copies them."""
        written, used = 0, set()
        for run, step, ts, values in rows:
            open_ = self._writer(job_id, run)
            used.add(run)
            for key, value in scalars(values).items():
                open_[0].add_scalar(tensorboard_tag(key), value, global_step=step, walltime=ts)
                open_[1] += 1
                written += 1
        for run in used:
            if (key := (job_id, run)) in self._writers:  # else closed already, past MAX_OPEN
                self._writers[key][0].flush()
        return written

    def publish(self, job_id: str) -> int:
        """Copy the staged files that changed since the last copy into the job's prefix;
        returns how many. Raises ``OSError`` when the job's storage refuses a copy; what was
        copied before stays."""
        root = self._staged(job_id)
        copied = self._copied.setdefault(job_id, {})
        changed = []
        for folder, _, files in os.walk(root):
            for name in sorted(files):
                path = os.path.join(folder, name)
                st = os.stat(path)
                rel = os.path.relpath(path, root)
                if copied.get(rel) != (st.st_size, st.st_mtime_ns):
                    changed.append((rel, (st.st_size, st.st_mtime_ns)))
        if not changed:
            return 0
        prefix = storage.job_prefix(self.storage_path, job_id)
        for rel, seen in changed:
            storage.put_file(str(root / rel), prefix, f"{FOLDER}/{rel}")
            copied[rel] = seen
        return len(changed)

    def close(self, job_id: str) -> None:
        """Close the job's writers, copy what is left, and remove its staging folder."""
        self._close_writers(job_id)
        self.publish(job_id)
        self.discard(job_id)

    def discard(self, job_id: str) -> None:
        """Forget the job: its writers closed, its staging folder removed (copied or not)."""
        self._close_writers(job_id)
        shutil.rmtree(self._staged(job_id), ignore_errors=True)
        self._copied.pop(job_id, None)

    def _close_writers(self, job_id: str) -> None:
        for key in [k for k in self._writers if k[0] == job_id]:
            self._writers.pop(key)[0].close()
