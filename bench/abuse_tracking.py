"""Attacks on the tracking export, measured against their bounds.

    .venv/bin/python -m bench.abuse_tracking

Starts its own servers (real HTTP, SQLite, an MLflow file store, no Ray; the server's own
exporter runs every 0.2 s) and prints one row per figure, ``what | figure | bound | ok/FAIL``:

- files written outside the job's prefix for trial ids that are paths (pushed, and stored
  by a server from before the bound), and the pushed events dropped;
- files written through links a job planted at its prefix, its ``tensorboard/`` folder and
  a trial's folder;
- a long run's event files: the largest (what a pass copies again at most, per run) and
  the staging left once its export ended;
- another project's runs in a project's MLflow experiment of the same name.

Every loop is bounded. ``main()`` returns the number of rows that failed.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import insert

from bench.figures import row, run_attacks
from bench.harness import tracking_attacks as ta
from bench.harness.waiting import wait_for
from service.db.event_models import TrialMetricRow
from service.tracking.names import trial_folder

KEYS = 200  # series per report: as many as one report exports
REPORTS = 800  # 160,000 scalars: past one event file's 100,000
PER_POST = 100  # reports per post, under the body cap
FILE_BOUND = 8 << 20  # bytes an event file of 100,000 scalars stays under


def _ended(target, job_id: str):
    return wait_for(lambda: (r := ta.export_row(target, job_id)).done and r, 120, f"the end of {job_id}'s export")


def trial_ids_as_paths(root: Path) -> None:
    target = ta.start_tracking_target(root / "ids" / "data", root / "ids" / "mlruns")
    try:
        job = ta.running(target, ta.tracked_search({"tensorboard": True}))
        storage_root = ta.prefix(target, job).parent
        pushed = [str(root / "pushed-abs"), "../../pushed-up"]
        stored = [str(root / "stored-abs"), "../../stored-up"]
        ta.push(target, job, [e for n, t in enumerate(pushed) for e in ta.trial_metrics(t, 10 * n, 2)])
        ta.push(target, job, ta.trial_metrics("t_00000", 40, 2))
        with target.service.sessions.begin() as s:
            s.execute(
                insert(TrialMetricRow),
                [
                    dict(job_id=job, attempt=1, src_seq=20 + n, trial_id=t, ts=1.0, values={"loss": 0.5}, config={})
                    for n, t in enumerate(stored)
                ],
            )
        ta.wait_exported(target, job)
        outside = [root / "pushed-abs", root / "stored-abs", storage_root / "pushed-up", storage_root / "stored-up"]
        written = sum(len(ta.files_below(p)) + p.exists() for p in outside)
        row("files written outside the prefix for trial ids that are paths", str(written), "0", written == 0)
        count, _ = ta.dropped(target, job)
        row("pushed events with such an id dropped", f"{count} of 4", "4 of 4", count == 4)
        folders = sorted(p.name for p in (ta.prefix(target, job) / "tensorboard").iterdir())
        named = folders == sorted(trial_folder(t) for t in ("t_00000", *stored))
        row("run folders, each the server's name for a trial", str(len(folders)), "3", named)
    finally:
        target.stop()


def planted_links(root: Path) -> None:
    target = ta.start_tracking_target(root / "links" / "data", root / "links" / "mlruns")
    try:
        outside, jobs = ta.plant_links(target, root)
        for job in jobs:
            ta.end(target, job)
        ended = [_ended(target, job) for job in jobs]
        written = sum(len(ta.files_below(p)) for p in outside.values())
        row("files written through links at the prefix, tensorboard/, a trial folder", str(written), "0", written == 0)
        whole = sum(r.error is None and not (ta.prefix(target, r.job_id) / "tensorboard").is_symlink() for r in ended)
        row("ended exports whose files landed in a real folder of the job's", f"{whole} of 3", "3 of 3", whole == 3)
    finally:
        target.stop()


def a_long_run(root: Path) -> None:
    target = ta.start_tracking_target(root / "long" / "data", root / "long" / "mlruns")
    try:
        job = ta.running(target, ta.tracked_train({"tensorboard": True}, "long-run"))
        for first in range(0, REPORTS, PER_POST):
            body = [
                {"type": "metric", "seq": i, "ts": 1.0 + i, "metrics": {f"m{k:03d}": i + k / 1000 for k in range(KEYS)}}
                for i in range(first, first + PER_POST)
            ]
            ta.push(target, job, body)
        ta.wait_exported(target, job, reports=REPORTS, timeout=300)
        ta.end(target, job)
        _ended(target, job)
        files = list((ta.prefix(target, job) / "tensorboard").glob("events.out.tfevents.*"))
        largest = max(f.stat().st_size for f in files)
        row(
            f"largest event file of {REPORTS * KEYS:,} scalars ({len(files)} files)",
            f"{largest / 2**20:.1f} MiB",
            f"<= {FILE_BOUND >> 20} MiB, >= 2 files",
            largest <= FILE_BOUND and len(files) >= 2,
        )
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(ta.prefix(target, job) / "tensorboard"))
        acc.Reload()
        steps = [e.step for e in acc.Scalars("m000")]
        whole = steps == list(range(REPORTS))
        row(
            "one series read back by TensorBoard across the files", f"{len(steps)} steps", f"{REPORTS}, in order", whole
        )
        staged = target.server.data_dir / "tensorboard-staging" / job
        left = sum(f.stat().st_size for f in staged.rglob("*") if f.is_file()) if staged.exists() else 0
        row("staging left once the export ended", f"{left} B", "0 B", left == 0)
    finally:
        target.stop()


def one_experiment_name_two_projects(root: Path) -> None:
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # reading the file store back
    from mlflow.tracking import MlflowClient

    target = ta.start_tracking_target(root / "mlflow" / "data", root / "mlflow" / "mlruns")
    try:
        ta.make_projects(target, "nlp", "vision")
        jobs = {
            p: ta.running(target, ta.tracked_train({"mlflow": {"experiment": "shared"}}, p), p)
            for p in ("nlp", "vision")
        }
        for job in jobs.values():
            ta.push(target, job, ta.metrics(0, 2))
        for job in jobs.values():
            ta.wait_exported(target, job, reports=2, tool="mlflow")
        client = MlflowClient(tracking_uri=f"file:{root / 'mlflow' / 'mlruns'}")
        foreign = 0
        for project, job in jobs.items():
            experiment = client.get_experiment_by_name(f"{project}/shared")
            runs = client.search_runs([experiment.experiment_id]) if experiment else []
            foreign += sum(r.data.tags.get("raydock.job_id") != job for r in runs) + (len(runs) != 1)
        row("runs of another project in a project's experiment", str(foreign), "0", foreign == 0)
    finally:
        target.stop()


def main() -> int:
    return run_attacks("tracking", trial_ids_as_paths, planted_links, a_long_run, one_experiment_name_two_projects)


if __name__ == "__main__":
    raise SystemExit(1 if main() else 0)
