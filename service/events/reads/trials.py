"""The trials of hyperparameter searches (``kind: tune`` jobs) read back: trials, a
trial's metric series, PBT lineage and the best trial. Their rows live in
``service.db.event_models``; ``service/events/writers/search_events.py`` stores a search's events
into them.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from api.errors import Conflict, NotFound, job_not_found
from api.schemas import (
    BestTrialPublic,
    ExploitPublic,
    JobStatus,
    TrainSpec,
    TrialCheckpoint,
    TrialMetricPoint,
    TrialPublic,
    TrialStatus,
    TuneSpec,
)
from api.schemas.trials import better, metric_value
from service.db.event_models import CheckpointRow, ExploitRow, SearchResultRow, TrialMetricRow, TrialRow
from service.db.models import JobRow
from service.events import trial_phases
from service.events.reads.replay import Exploit, replay_spec
from service.stored.specs import stored_search

# ----------------------------------------------------------------------------- reads


class TrialService:
    """Reads of a search's trials, metric series, lineage and best trial."""

    def __init__(self, sessions: sessionmaker) -> None:
        self.sessions = sessions

    def _search(self, s: Session, job_id: str) -> JobRow:
        job = s.get(JobRow, job_id)
        if job is None:
            raise job_not_found(job_id)
        if job.kind != "tune":
            raise Conflict(
                f"Job {job_id} is a {job.kind} job; trials, lineage and the best trial exist for searches (kind tune).",
                code="not_a_search",
            )
        return job

    def trials(self, job_id: str) -> list[TrialPublic]:
        with self.sessions() as s:
            job = self._search(s, job_id)
            rows = s.scalars(select(TrialRow).where(TrialRow.job_id == job_id).order_by(TrialRow.trial_id)).all()
            search = _spec(job)
            return [_trial_public(job, search, r) for r in rows]

    def trial_metrics(self, job_id: str, trial_id: str, since: int = -1) -> list[TrialMetricPoint]:
        with self.sessions() as s:
            self._search(s, job_id)
            if s.scalar(select(TrialRow.id).where(TrialRow.job_id == job_id, TrialRow.trial_id == trial_id)) is None:
                raise NotFound(
                    f"Search {job_id} has no trial {trial_id!r}. List them with GET /v1/jobs/{job_id}/trials.",
                    code="trial_not_found",
                )
            rows = s.scalars(
                select(TrialMetricRow)
                .where(
                    TrialMetricRow.job_id == job_id, TrialMetricRow.trial_id == trial_id, TrialMetricRow.src_seq > since
                )
                .order_by(TrialMetricRow.attempt, TrialMetricRow.src_seq)
            ).all()
            return [
                TrialMetricPoint(seq=r.src_seq, ts=r.ts, epoch=r.epoch, step=r.step, metrics=r.values, config=r.config)
                for r in rows
            ]

    def lineage(self, job_id: str) -> list[ExploitPublic]:
        with self.sessions() as s:
            self._search(s, job_id)
            rows = s.scalars(
                select(ExploitRow).where(ExploitRow.job_id == job_id).order_by(ExploitRow.attempt, ExploitRow.src_seq)
            ).all()
            return [
                ExploitPublic(
                    seq=r.src_seq,
                    ts=r.ts,
                    trial_id=r.trial_id,
                    donor_trial_id=r.donor_trial_id,
                    donor_time=r.donor_time,
                    trial_time=r.trial_time,
                    donor_metric=r.donor_metric,
                    old_config=r.old_config,
                    donor_config=r.donor_config,
                    new_config=r.new_config,
                    checkpoint_path=r.checkpoint_path,
                )
                for r in rows
            ]

    def best(self, job_id: str) -> BestTrialPublic:
        """The search's result once it ended; before that, the best report so far."""
        with self.sessions() as s:
            job = self._search(s, job_id)
            search = _spec(job)
            metric, mode = search.metric, search.mode
            final = s.get(SearchResultRow, job_id)
            if final is not None:
                return BestTrialPublic(
                    trial_id=final.trial_id,
                    metric=metric,
                    mode=mode,
                    value=final.value,
                    config=final.config,
                    metrics=final.values,
                    final=True,
                    checkpoint=_checkpoint(s, job_id, final.checkpoint_path),
                )
            best = best_report(s, job_id, metric, mode)
            if best is None:
                raise NotFound(f"Search {job_id} has no report of {metric!r} yet.", code="no_reports")
            return BestTrialPublic(
                trial_id=best.trial_id,
                metric=metric,
                mode=mode,
                value=float(best.values[metric]),
                config=best.config,
                metrics=best.values,
                final=False,
            )

    def replay(self, job_id: str) -> TrainSpec:
        """The best trial of a finished search as a ``kind: train`` spec (``service.events.reads.replay``)."""
        with self.sessions() as s:
            job = self._search(s, job_id)
            final = s.get(SearchResultRow, job_id)
            if final is None:
                raise Conflict(
                    f"Search {job_id} is {job.status} and has no final best trial yet; a replay needs a search that "
                    "succeeded. Wait for it (GET /v1/jobs/{id}) or see the best so far at GET /v1/jobs/{id}/best.",
                    code="search_not_finished",
                )
            rows = s.scalars(select(ExploitRow).where(ExploitRow.job_id == job_id)).all()
            exploits = [
                Exploit(
                    (r.attempt, r.src_seq),
                    r.trial_id,
                    r.donor_trial_id,
                    r.donor_time or 0.0,
                    r.old_config or {},
                    r.new_config or {},
                )
                for r in rows
            ]
            configs = {t.trial_id: t.config or {} for t in s.scalars(select(TrialRow).where(TrialRow.job_id == job_id))}
            return replay_spec(_spec(job), final.trial_id, exploits, configs)


def _spec(job: JobRow) -> TuneSpec:
    try:
        return stored_search(job.spec)
    except ValueError as exc:  # pydantic's ValidationError included
        raise Conflict(
            f"The stored spec of search {job.id} no longer validates on this server ({str(exc)[:300]}); "
            "its trials cannot be read here. Read them with the server version that ran it.",
            code="stored_spec_invalid",
        ) from None


def best_report(s: Session, job_id: str, metric: str | None, mode: str | None) -> TrialMetricRow | None:
    """The search's best report so far: the trial whose best value ingestion keeps is the
    best (the first row of ``ix_trials_job_best``; a tie goes to the earliest report), and
    the report holding it is read by its key. Never a read of every report."""
    value = TrialRow.best_metric.desc() if mode == "max" else TrialRow.best_metric.asc()
    q = select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.best_metric.is_not(None))
    trial = s.scalars(q.order_by(value, TrialRow.best_attempt, TrialRow.best_seq, TrialRow.id).limit(1)).first()
    if trial is None:
        return None
    if trial.best_seq is not None:
        key = (TrialMetricRow.attempt == trial.best_attempt, TrialMetricRow.src_seq == trial.best_seq)
        report = s.scalar(select(TrialMetricRow).where(TrialMetricRow.job_id == job_id, *key))
        if report is not None:
            return report
    # A best kept before the report's key was (stores older than migration 0005): that trial's reports.
    best: TrialMetricRow | None = None
    q = select(TrialMetricRow).where(TrialMetricRow.job_id == job_id, TrialMetricRow.trial_id == trial.trial_id)
    for row in s.scalars(q.order_by(TrialMetricRow.attempt, TrialMetricRow.src_seq)):
        v = metric_value(row.values.get(metric))
        if v is not None and (best is None or better(v, float(best.values[metric]), mode)):
            best = row
    return best


_ENDED_AS = {JobStatus.CANCELLED: TrialStatus.CANCELLED, JobStatus.FAILED: TrialStatus.ERROR}


def _trial_public(job: JobRow, search: TuneSpec, r: TrialRow) -> TrialPublic:
    status = TrialStatus(r.status)
    job_status = JobStatus(job.status)
    if status.is_live() and job_status.is_terminal():
        # The driver ended (cancel, failure) before it could say: the job's end is the trial's.
        status = _ENDED_AS.get(job_status, TrialStatus.TERMINATED)
    amount = search.budget_amount
    stopped_early = (
        status == TrialStatus.TERMINATED and amount is not None and r.last_time is not None and r.last_time < amount
    )
    start_phases, exploit_phases = trial_phases.public(r, search.trainable == "function")
    return TrialPublic(
        trial_id=r.trial_id,
        status=status.value,
        config=r.config or {},
        reports=r.reports,
        last_metrics=r.last_metrics,
        best_metric=r.best_metric,
        stopped_early=stopped_early,
        exploits=r.exploits,
        error=r.error,
        note=r.note,
        first_metric_s=r.first_metric_s,
        start_phases=start_phases,
        exploit_phases=exploit_phases,
    )


def _checkpoint(s: Session, job_id: str, path: str | None) -> TrialCheckpoint | None:
    if not path:
        return None
    row = s.scalar(select(CheckpointRow).where(CheckpointRow.job_id == job_id, CheckpointRow.path == path))
    if row is None:
        return TrialCheckpoint(path=path)
    return TrialCheckpoint(id=row.id, path=path, epoch=row.epoch, step=row.step)
