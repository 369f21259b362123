"""The tracking exporter: a background unit of the API process (``export_once`` every
RAYDOCK_TRACKING_INTERVAL_S, wired in service/runtime.py) that reads each tracked
job's stored reports by cursor and writes them to TensorBoard and MLflow. It never runs
on the ingest path: a slow or unreachable MLflow delays only its own export, and the
cursors are in the store, so a restarted server resumes where the last one stopped.

Each tool has its own cursor and is retried alone after a failure (with a growing pause,
up to ``MAX_BACKOFF_S``). Once a job has ended and every report is exported, its end is
written (MLflow: the final checkpoint as an artifact, the runs closed) and the job leaves
the loop; a resumed job comes back to it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import false, select, true, update
from sqlalchemy.orm import sessionmaker

from api.schemas import JobStatus
from service.db.event_models import CheckpointRow, MetricRow, SearchResultRow, TrialMetricRow, TrialRow
from service.db.models import JobRow, utcnow
from service.db.tracking_models import TrackingExportRow
from service.files import storage
from service.settings import Settings
from service.telemetry.instruments import TRACKING_ERRORS, TRACKING_EXPORTED
from service.tracking.mlflow_runs import MlflowRuns, unreachable
from service.tracking.names import mlflow_experiment
from service.tracking.tensorboard import TensorboardSink

log = logging.getLogger("raydock.tracking")

BATCH = 1000  # reports read per job, tool and pass
JOBS_PER_PASS = 200  # tracked jobs looked at per pass (the rest the next)
MAX_BACKOFF_S = 60.0
ACTIVE = [s.value for s in JobStatus if not s.is_terminal()]


@dataclass(frozen=True)
class JobFacts:
    job_id: str
    name: str
    kind: str
    project: str
    status: JobStatus
    attempt: int
    spec: dict[str, Any]


class Exporter:
    def __init__(self, sessions: sessionmaker, settings: Settings) -> None:
        self.sessions, self.settings = sessions, settings
        self.storage_path = settings.storage.resolved_storage_path
        self.tensorboard = TensorboardSink(self.storage_path, settings.storage.data_dir / "tensorboard-staging")
        self.mlflow = (
            MlflowRuns(settings.tracking.mlflow_tracking_uri) if settings.tracking.mlflow_tracking_uri else None
        )
        # (job, tool) -> (when to try again, failures in a row); job "" is the tool itself (server down)
        self._retry_at: dict[tuple[str, str], tuple[float, int]] = {}
        self._refused: dict[str, str] = {}  # job -> why its storage took no TensorBoard files (noted once)

    def export_once(self) -> None:
        """One pass over the tracked jobs that are not done."""
        with self.sessions.begin() as s:
            # A resumed job is exported again (its runs reopen with the new attempt's reports).
            reopened = s.scalars(
                select(TrackingExportRow.job_id)
                .join(JobRow, JobRow.id == TrackingExportRow.job_id)
                .where(TrackingExportRow.done == true(), JobRow.status.in_(ACTIVE))
            ).all()
            if reopened:
                s.execute(update(TrackingExportRow).where(TrackingExportRow.job_id.in_(reopened)).values(done=False))
            pending = s.scalars(
                select(TrackingExportRow.job_id)
                .where(TrackingExportRow.done == false())
                .order_by(TrackingExportRow.updated_at)
                .limit(JOBS_PER_PASS)
            ).all()
        for job_id in pending:
            self.export(job_id, rotate=len(pending) == JOBS_PER_PASS)
        self._sweep()

    def _sweep(self) -> None:
        """Drop the staging of jobs no longer exported: deleted before their end was (their
        rows went with them), so their files would stay in the server's data dir for good."""
        staged = self.tensorboard.staged_jobs()
        if not staged:
            return
        with self.sessions() as s:
            live = set(
                s.scalars(
                    select(TrackingExportRow.job_id).where(
                        TrackingExportRow.job_id.in_(staged), TrackingExportRow.done == false()
                    )
                )
            )
        for job_id in set(staged) - live:
            self.tensorboard.discard(job_id)
            self._refused.pop(job_id, None)

    def export(self, job_id: str, rotate: bool = False) -> None:
        """One job's pass; ``rotate``: more jobs wait than a pass takes, so this one goes to the back."""
        with self.sessions() as s:
            job = s.get(JobRow, job_id)
            row = s.get(TrackingExportRow, job_id)
            if job is None or row is None:
                return
            # The status before the reports: an ended job takes in no more, so a batch read
            # after it that comes back short is the whole rest.
            facts = JobFacts(job.id, job.name, job.kind, job.project, JobStatus(job.status), job.attempt, job.spec)
            wants_tb = row.tensorboard
            # Each project has its own experiments: the spec's name is read inside the job's project.
            experiment = mlflow_experiment(job.project, row.mlflow_experiment) if row.mlflow_experiment else None
        caught_up = True
        if wants_tb:
            caught_up &= self._tool(facts, "tensorboard", self._tensorboard)
        if experiment and self.mlflow is not None:
            caught_up &= self._tool(facts, "mlflow", lambda f: self._mlflow(f, experiment))
        if facts.status.is_terminal() and caught_up:
            self._finish(facts, wants_tb, experiment)
        if rotate:
            self._note(job_id, updated_at=utcnow())

    def _tool(self, facts: JobFacts, tool: str, step) -> bool:
        """Run one tool's export for a job; False when it is not caught up (more to do, or it failed).
        A tracking server that does not answer is left alone for every job until its pause ends, so
        it costs one timeout per pause, not one per job, and the other tool goes on meanwhile."""
        key = (facts.job_id, tool)
        when, failures = self._retry_at.get(key, (0.0, 0))
        down_until, down_failures = self._retry_at.get(("", tool), (0.0, 0))
        if time.monotonic() < max(when, down_until):
            return False
        try:
            caught_up = step(facts)
        except Exception as exc:  # noqa: BLE001 - a tracker's failure must not stop the other jobs
            if tool == "mlflow" and unreachable(exc):
                key, failures = ("", tool), down_failures
            failures += 1
            self._retry_at[key] = (time.monotonic() + min(2.0**failures, MAX_BACKOFF_S), failures)
            TRACKING_ERRORS.labels(tool).inc()
            log.warning("exporting job %s to %s failed (%d in a row): %s", facts.job_id, tool, failures, exc)
            self._note(facts.job_id, error=f"{tool}: {type(exc).__name__}: {exc}"[:2000])
            return False
        self._retry_at.pop(key, None)
        self._retry_at.pop(("", tool), None)
        return caught_up

    # ------------------------------------------------------------------ reading

    def _reports(self, job_id: str, seq: int, trial_id: int):
        with self.sessions() as s:
            reports = s.execute(
                select(MetricRow.seq, MetricRow.step, MetricRow.ts, MetricRow.values)
                .where(MetricRow.job_id == job_id, MetricRow.seq >= seq)
                .order_by(MetricRow.seq)
                .limit(BATCH)
            ).all()
            trials = s.execute(
                select(
                    TrialMetricRow.id,
                    TrialMetricRow.trial_id,
                    TrialMetricRow.step,
                    TrialMetricRow.epoch,
                    TrialMetricRow.ts,
                    TrialMetricRow.values,
                )
                .where(TrialMetricRow.job_id == job_id, TrialMetricRow.id > trial_id)
                .order_by(TrialMetricRow.id)
                .limit(BATCH)
            ).all()
        return reports, trials

    @staticmethod
    def _trial_step(step, epoch, values, row_id) -> int:
        for candidate in (step, values.get("training_iteration") if isinstance(values, dict) else None, epoch):
            if isinstance(candidate, int) and not isinstance(candidate, bool):
                return candidate
        return row_id

    def _cursors(self, job_id: str, tool: str) -> tuple[int, int]:
        with self.sessions() as s:
            row = s.get(TrackingExportRow, job_id)
            return getattr(row, f"{tool}_seq"), getattr(row, f"{tool}_trial_id")

    def _note(self, job_id: str, **values: Any) -> None:
        with self.sessions.begin() as s:
            s.execute(update(TrackingExportRow).where(TrackingExportRow.job_id == job_id).values(**values))

    # ------------------------------------------------------------------ tools

    def _tensorboard(self, facts: JobFacts) -> bool:
        seq, trial_id = self._cursors(facts.job_id, "tensorboard")
        reports, trials = self._reports(facts.job_id, seq, trial_id)
        rows = [("", step if step is not None else n, ts, values) for n, step, ts, values in reports]
        rows += [
            (trial, self._trial_step(step, epoch, values, i), ts, values)
            for i, trial, step, epoch, ts, values in trials
        ]
        if rows:
            TRACKING_EXPORTED.labels("tensorboard").inc(len(rows))
            self.tensorboard.write(facts.job_id, rows)  # into the server's staging folder
            self._note(
                facts.job_id,
                tensorboard_seq=reports[-1][0] + 1 if reports else seq,
                tensorboard_trial_id=trials[-1][0] if trials else trial_id,
                **({} if facts.job_id in self._refused else {"error": None}),
            )
        if not facts.status.is_terminal():  # an ended job's files are copied by its end (_finish)
            self._publish(facts.job_id)
        return len(reports) < BATCH and len(trials) < BATCH

    def _publish(self, job_id: str) -> None:
        """Copy the staged files into the job's prefix, after the cursor moved: a copy its
        storage refuses is tried again each pass from the staged files, never by writing the
        reports twice. A refusal comes from the job's own storage (a folder where a file goes,
        a full disk): it is noted on the job, not paused like a tracker that fails."""
        try:
            self.tensorboard.publish(job_id)
        except OSError as exc:
            why = f"tensorboard: {exc}"
            if self._refused.get(job_id) != why:
                self._refused[job_id] = why
                TRACKING_ERRORS.labels("tensorboard").inc()
                log.warning("job %s: %s", job_id, why)
                self._note(job_id, error=why)
            return
        if self._refused.pop(job_id, None) is not None:
            self._note(job_id, error=None)

    def _mlflow(self, facts: JobFacts, experiment: str) -> bool:
        with self.sessions() as s:
            row = s.get(TrackingExportRow, facts.job_id)
            run_id, trial_runs = row.mlflow_run_id, dict(row.trial_runs or {})
        if run_id is None:
            run_id = self.mlflow.start(experiment, facts.job_id, facts.name, facts.kind, facts.project, facts.spec)
            self._note(facts.job_id, mlflow_run_id=run_id)  # before any metric: a restart reuses this run
        seq, trial_cursor = self._cursors(facts.job_id, "mlflow")
        reports, trials = self._reports(facts.job_id, seq, trial_cursor)
        self.mlflow.log(run_id, [(step if step is not None else n, ts, values) for n, step, ts, values in reports])
        by_trial: dict[str, list] = {}
        for i, trial, step, epoch, ts, values in trials:
            by_trial.setdefault(trial, []).append((self._trial_step(step, epoch, values, i), ts, values))
        for trial, rows in by_trial.items():
            if trial not in trial_runs:
                trial_runs[trial] = self.mlflow.start_trial(
                    run_id, facts.job_id, facts.project, trial, self._trial_config(facts.job_id, trial)
                )
                self._note(facts.job_id, trial_runs=dict(trial_runs))
            self.mlflow.log(trial_runs[trial], rows)
        if reports or trials:
            TRACKING_EXPORTED.labels("mlflow").inc(len(reports) + len(trials))
            self._note(
                facts.job_id,
                mlflow_seq=reports[-1][0] + 1 if reports else seq,
                mlflow_trial_id=trials[-1][0] if trials else trial_cursor,
                error=None,
            )
        return len(reports) < BATCH and len(trials) < BATCH

    def _trial_config(self, job_id: str, trial_id: str) -> dict[str, Any]:
        with self.sessions() as s:
            config = s.scalar(select(TrialRow.config).where(TrialRow.job_id == job_id, TrialRow.trial_id == trial_id))
        return config if isinstance(config, dict) else {}

    # ------------------------------------------------------------------ the end

    def _final_checkpoint(self, facts: JobFacts) -> str | None:
        with self.sessions() as s:
            if facts.kind == "tune":
                return s.scalar(select(SearchResultRow.checkpoint_path).where(SearchResultRow.job_id == facts.job_id))
            return s.scalar(
                select(CheckpointRow.path)
                .where(CheckpointRow.job_id == facts.job_id)
                .order_by(CheckpointRow.id.desc())
                .limit(1)
            )

    def _finish(self, facts: JobFacts, wants_tb: bool, experiment: str | None) -> None:
        notes: list[str] = []
        if wants_tb:

            def close_tb(f: JobFacts) -> bool:
                try:
                    self.tensorboard.close(f.job_id)
                except OSError as exc:  # the job's storage refused the copy: its export ends without it
                    self.tensorboard.discard(f.job_id)
                    notes.append(f"tensorboard: {exc}")
                self._refused.pop(f.job_id, None)
                return True

            if not self._tool(facts, "tensorboard", close_tb):
                return
        if experiment and self.mlflow is not None:

            def close(f: JobFacts) -> bool:
                with self.sessions() as s:
                    row = s.get(TrackingExportRow, f.job_id)
                    run_id, trial_runs = row.mlflow_run_id, list((row.trial_runs or {}).values())
                if run_id is not None:
                    prefix = storage.job_prefix(self.storage_path, f.job_id)
                    note = self.mlflow.finish(run_id, f.status.value, self._final_checkpoint(f), prefix, trial_runs)
                    notes.extend([note] if note else [])
                return True

            if not self._tool(facts, "mlflow", close):
                return
        self._note(facts.job_id, done=True, finished_attempt=facts.attempt, error="; ".join(notes) or None)
