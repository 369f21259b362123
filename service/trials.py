"""The trials of hyperparameter searches (``kind: tune`` jobs) in the store, and the
reads the API serves from them.

A search's driver sends ``trial_metric``, ``trial``, ``exploit`` and ``result`` events
(``tuning/events.py``) on the same two channels as any job; ``apply_event`` stores each
once, keyed like job metrics by (attempt, seq), and refuses to let a late, older
``trial`` event roll a trial's status back. Rows go with their job (ON DELETE CASCADE).
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text, UniqueConstraint, func, select
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker

from api.errors import NotFound
from api.schemas import JobStatus
from api.schemas import BestTrialPublic, ExploitPublic, TrialCheckpoint, TrialMetricPoint, TrialPublic
from service.store import Base, CheckpointRow, JobRow

LIVE_STATUSES = ("PENDING", "RUNNING", "PAUSED")


class TrialRow(Base):
    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("job_id", "trial_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    trial_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="PENDING")
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    reports: Mapped[int] = mapped_column(Integer, default=0)
    last_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    best_metric: Mapped[float | None] = mapped_column(Float)
    last_time: Mapped[float | None] = mapped_column(Float)  # its latest epoch or step
    exploits: Mapped[int] = mapped_column(Integer, default=0)
    # (attempt, seq) of the status event applied last: older ones arriving late are ignored.
    event_attempt: Mapped[int] = mapped_column(Integer, default=0)
    event_seq: Mapped[int] = mapped_column(Integer, default=-1)


class TrialMetricRow(Base):
    __tablename__ = "trial_metrics"
    __table_args__ = (UniqueConstraint("job_id", "attempt", "src_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    src_seq: Mapped[int] = mapped_column(Integer)
    trial_id: Mapped[str] = mapped_column(String(64), index=True)
    ts: Mapped[float] = mapped_column(Float)
    epoch: Mapped[int | None] = mapped_column(Integer)
    step: Mapped[int | None] = mapped_column(Integer)
    values: Mapped[dict[str, Any]] = mapped_column(JSON)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class ExploitRow(Base):
    __tablename__ = "trial_exploits"
    __table_args__ = (UniqueConstraint("job_id", "attempt", "src_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    src_seq: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)
    trial_id: Mapped[str] = mapped_column(String(64))
    donor_trial_id: Mapped[str] = mapped_column(String(64))
    donor_time: Mapped[float | None] = mapped_column(Float)
    trial_time: Mapped[float | None] = mapped_column(Float)
    donor_metric: Mapped[float | None] = mapped_column(Float)
    old_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    donor_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    new_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    checkpoint_path: Mapped[str | None] = mapped_column(Text)


class SearchResultRow(Base):
    __tablename__ = "search_results"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    trial_id: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    values: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    checkpoint_path: Mapped[str | None] = mapped_column(Text)


# ----------------------------------------------------------------------------- events in


def apply_event(s: Session, job: JobRow, event: dict[str, Any]) -> bool:
    """Store a search event of ``job``; False when it is not one (the job service
    handles it as usual)."""
    if job.kind != "tune":
        return False
    handler = _HANDLERS.get(event.get("type"))
    if handler is None:
        return False
    handler(s, job, event)
    return True


def _trial(s: Session, job: JobRow, trial_id: str) -> TrialRow:
    row = s.scalar(select(TrialRow).where(TrialRow.job_id == job.id, TrialRow.trial_id == trial_id))
    if row is None:
        row = TrialRow(job_id=job.id, trial_id=trial_id, status="PENDING", config={}, reports=0, exploits=0, event_attempt=0, event_seq=-1)
        s.add(row)
        s.flush()
    return row


def _seen(s: Session, table, job: JobRow, seq: int) -> bool:
    q = select(func.count()).select_from(table).where(table.job_id == job.id, table.attempt == job.attempt, table.src_seq == seq)
    return bool(s.scalar(q))


def _on_metric(s: Session, job: JobRow, event: dict[str, Any]) -> None:
    seq = int(event.get("seq", 0))
    if _seen(s, TrialMetricRow, job, seq):
        return
    m, trial_id = event.get("metrics") or {}, str(event.get("trial_id"))
    s.add(TrialMetricRow(
        job_id=job.id, attempt=job.attempt, src_seq=seq, trial_id=trial_id, ts=float(event.get("ts", 0.0)),
        epoch=_int(m.get("epoch")), step=_int(m.get("step")), values=m, config=event.get("config") or {},
    ))  # fmt: skip
    row = _trial(s, job, trial_id)
    row.reports += 1
    row.last_metrics = m
    unit = "step" if (job.spec.get("budget") or {}).get("steps") else "epoch"
    row.last_time = _float(m.get(unit))
    value = _float(m.get(job.spec.get("metric")))
    if value is not None and (row.best_metric is None or _better(value, row.best_metric, job.spec.get("mode"))):
        row.best_metric = value
    s.flush()


def _on_trial(s: Session, job: JobRow, event: dict[str, Any]) -> None:
    row = _trial(s, job, str(event.get("trial_id")))
    key = (job.attempt, int(event.get("seq", 0)))
    if key <= (row.event_attempt, row.event_seq):
        return
    row.event_attempt, row.event_seq = key
    row.status = str(event.get("status") or row.status)
    row.config = event.get("config") or row.config
    if event.get("error"):
        row.error = str(event["error"])
    s.flush()


def _on_exploit(s: Session, job: JobRow, event: dict[str, Any]) -> None:
    seq = int(event.get("seq", 0))
    if _seen(s, ExploitRow, job, seq):
        return
    s.add(ExploitRow(
        job_id=job.id, attempt=job.attempt, src_seq=seq, ts=float(event.get("ts", 0.0)),
        trial_id=str(event.get("trial_id")), donor_trial_id=str(event.get("donor_trial_id")),
        donor_time=_float(event.get("donor_time")), trial_time=_float(event.get("trial_time")),
        donor_metric=_float(event.get("donor_metric")), old_config=event.get("old_config") or {},
        donor_config=event.get("donor_config") or {}, new_config=event.get("new_config") or {},
        checkpoint_path=event.get("checkpoint_path"),
    ))  # fmt: skip
    _trial(s, job, str(event.get("trial_id"))).exploits += 1
    s.flush()


def _on_result(s: Session, job: JobRow, event: dict[str, Any]) -> None:
    row = s.get(SearchResultRow, job.id) or SearchResultRow(job_id=job.id)
    row.attempt, row.trial_id = job.attempt, str(event.get("trial_id"))
    row.value = float(event.get("value"))
    row.config, row.values = event.get("config") or {}, event.get("metrics") or {}
    row.checkpoint_path = event.get("checkpoint_path")
    s.add(row)
    job.latest_metrics = {**row.values, "trial_id": row.trial_id}
    s.flush()


_HANDLERS = {"trial_metric": _on_metric, "trial": _on_trial, "exploit": _on_exploit, "result": _on_result}


# ----------------------------------------------------------------------------- reads


class TrialService:
    """Reads of a search's trials, metric series, lineage and best trial."""

    def __init__(self, sessions: sessionmaker) -> None:
        self.sessions = sessions

    def _search(self, s: Session, job_id: str) -> JobRow:
        job = s.get(JobRow, job_id)
        if job is None:
            raise NotFound(f"No job {job_id!r}. List jobs with GET /v1/jobs.", code="job_not_found")
        if job.kind != "tune":
            raise NotFound(
                f"Job {job_id} is a {job.kind} job; trials, lineage and the best trial exist for searches (kind tune).",
                code="not_a_search",
            )
        return job

    def trials(self, job_id: str) -> list[TrialPublic]:
        with self.sessions() as s:
            job = self._search(s, job_id)
            rows = s.scalars(select(TrialRow).where(TrialRow.job_id == job_id).order_by(TrialRow.trial_id)).all()
            return [_trial_public(job, r) for r in rows]

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
                .where(TrialMetricRow.job_id == job_id, TrialMetricRow.trial_id == trial_id, TrialMetricRow.src_seq > since)
                .order_by(TrialMetricRow.attempt, TrialMetricRow.src_seq)
            ).all()
            return [TrialMetricPoint(seq=r.src_seq, ts=r.ts, epoch=r.epoch, step=r.step, metrics=r.values, config=r.config) for r in rows]

    def lineage(self, job_id: str) -> list[ExploitPublic]:
        with self.sessions() as s:
            self._search(s, job_id)
            rows = s.scalars(select(ExploitRow).where(ExploitRow.job_id == job_id).order_by(ExploitRow.attempt, ExploitRow.src_seq)).all()
            return [
                ExploitPublic(
                    seq=r.src_seq, ts=r.ts, trial_id=r.trial_id, donor_trial_id=r.donor_trial_id, donor_time=r.donor_time,
                    trial_time=r.trial_time, donor_metric=r.donor_metric, old_config=r.old_config,
                    donor_config=r.donor_config, new_config=r.new_config, checkpoint_path=r.checkpoint_path,
                )  # fmt: skip
                for r in rows
            ]

    def best(self, job_id: str) -> BestTrialPublic:
        """The search's result once it ended; before that, the best report so far."""
        with self.sessions() as s:
            job = self._search(s, job_id)
            metric, mode = job.spec.get("metric"), job.spec.get("mode")
            final = s.get(SearchResultRow, job_id)
            if final is not None:
                return BestTrialPublic(
                    trial_id=final.trial_id, metric=metric, mode=mode, value=final.value, config=final.config,
                    metrics=final.values, final=True, checkpoint=_checkpoint(s, job_id, final.checkpoint_path),
                )  # fmt: skip
            best: TrialMetricRow | None = None
            for row in s.scalars(select(TrialMetricRow).where(TrialMetricRow.job_id == job_id)):
                value = _float(row.values.get(metric))
                if value is not None and (best is None or _better(value, float(best.values[metric]), mode)):
                    best = row
            if best is None:
                raise NotFound(f"Search {job_id} has no report of {metric!r} yet.", code="no_reports")
            return BestTrialPublic(
                trial_id=best.trial_id, metric=metric, mode=mode, value=float(best.values[metric]),
                config=best.config, metrics=best.values, final=False,
            )  # fmt: skip


def _trial_public(job: JobRow, r: TrialRow) -> TrialPublic:
    status = r.status
    job_status = JobStatus(job.status)
    if status in LIVE_STATUSES and job_status.is_terminal():
        # The driver ended (cancel, failure) before it could say: the job's end is the trial's.
        status = {JobStatus.CANCELLED: "CANCELLED", JobStatus.FAILED: "ERROR"}.get(job_status, "TERMINATED")
    budget = job.spec.get("budget") or {}
    amount = budget.get("epochs") or budget.get("steps")
    stopped_early = status == "TERMINATED" and amount is not None and r.last_time is not None and r.last_time < amount
    return TrialPublic(
        trial_id=r.trial_id, status=status, config=r.config or {}, reports=r.reports, last_metrics=r.last_metrics,
        best_metric=r.best_metric, stopped_early=stopped_early, exploits=r.exploits, error=r.error,
    )  # fmt: skip


def _checkpoint(s: Session, job_id: str, path: str | None) -> TrialCheckpoint | None:
    if not path:
        return None
    row = s.scalar(select(CheckpointRow).where(CheckpointRow.job_id == job_id, CheckpointRow.path == path))
    if row is None:
        return TrialCheckpoint(path=path)
    return TrialCheckpoint(id=row.id, path=path, epoch=row.epoch, step=row.step)


def _better(value: float, than: float, mode: str | None) -> bool:
    return value > than if mode == "max" else value < than


def _float(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None
