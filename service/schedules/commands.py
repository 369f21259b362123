"""The schedule commands and reads for a caller: create (its cron, time zone and job spec
checked first, so nothing is stored that cannot fire), list and read (with the next firing
times), pause, resume and delete. A schedule belongs to a project, and reads and changes
like that project's jobs: a caller outside it finds no such schedule (404), a viewer
reads it but may not change it (403)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Callable, Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from api.errors import NotFound, QuotaExceeded
from api.schemas import JobPublic, JobSpec
from api.schemas.schedules import ScheduleList, SchedulePublic, ScheduleSpec
from service.db.models import utcnow
from service.db.schedule_models import ScheduleRow
from service.eventlog.log import record
from service.schedules import cron
from service.settings.scheduling import SchedulingSettings
from service.tenancy.caller import Caller

MAX_LISTED = 1000


class JobPort(Protocol):
    """What schedules ask of the job commands (service/jobs.py), handed in by the composition root."""

    on_submit: Callable[[], None]

    def validate(self, spec: JobSpec, project: str) -> None: ...

    def insert(self, s: Session, spec: JobSpec, *, actor: str, project: str, user_id: int | None) -> JobPublic: ...

    def cancel(self, job_id: str, *, actor: str) -> JobPublic: ...


def schedule_not_found(schedule_id: str) -> NotFound:
    return NotFound(f"No schedule {schedule_id!r}. List schedules with GET /v1/schedules.", code="schedule_not_found")


def public(row: ScheduleRow, next_runs: int) -> SchedulePublic:
    runs: list[datetime] = []
    if not row.paused and row.next_tick is not None and next_runs:
        first = cron.aware(row.next_tick)
        runs = [first, *cron.next_ticks(row.cron, row.timezone, first, next_runs - 1)] if next_runs > 1 else [first]
    return SchedulePublic(
        id=row.id,
        name=row.name,
        project=row.project,
        owner=row.owner,
        cron=row.cron,
        timezone=row.timezone,
        concurrency=row.concurrency,
        catch_up=row.catch_up,
        paused=row.paused,
        job=row.job,
        created_at=row.created_at,
        last_tick=row.last_tick,
        last_job_id=row.last_job_id,
        last_outcome=row.last_outcome,
        fired=row.fired,
        next_runs=runs,
    )


class Schedules:
    def __init__(self, sessions: sessionmaker, jobs: JobPort, settings: SchedulingSettings) -> None:
        self.sessions = sessions
        self.jobs = jobs
        self.settings = settings

    def create(self, spec: ScheduleSpec, caller: Caller, project: str) -> SchedulePublic:
        """Store a schedule in ``project`` (the route decided the caller may submit there)."""
        cron.check(spec.cron, spec.timezone)  # 422 invalid_cron / invalid_timezone
        job = spec.job.model_copy(update={"project": project})
        self.jobs.validate(job, project)  # what POST /v1/jobs would refuse, refused now
        now = utcnow()
        row = ScheduleRow(
            id="s" + uuid.uuid4().hex[:11],
            name=spec.name,
            project=project,
            owner=caller.name,
            owner_id=caller.user_id,
            cron=" ".join(spec.cron.split()),
            timezone=spec.timezone,
            concurrency=spec.concurrency,
            catch_up=spec.catch_up,
            paused=spec.paused,
            job=job.model_dump(mode="json"),
            created_at=now,
            next_tick=cron.next_ticks(spec.cron, spec.timezone, now, 1)[0],
        )
        with self.sessions.begin() as s:
            held = s.scalar(select(func.count()).select_from(ScheduleRow).where(ScheduleRow.project == project))
            limit = self.settings.max_schedules_per_project
            if held >= limit:
                raise QuotaExceeded(
                    f"Project {project} holds {held} schedules, its limit ({limit}, "
                    f"{SchedulingSettings.env_name('max_schedules_per_project')}). Delete one it no longer needs.",
                    code="too_many_schedules",
                    details=[{"quota": "schedules", "project": project, "used": held, "limit": limit}],
                )
            s.add(row)
            record(s, "schedule_created", actor=caller.name, schedule=row.id, name=row.name, project=project)
        return public(row, 3)

    def list(self, caller: Caller, *, limit: int = 100, next_runs: int = 3) -> ScheduleList:
        """The schedules of the caller's projects, newest first."""
        q = select(ScheduleRow).order_by(ScheduleRow.created_at.desc(), ScheduleRow.id).limit(min(limit, MAX_LISTED))
        if caller.projects is not None:
            q = q.where(ScheduleRow.project.in_(caller.projects))
        with self.sessions() as s:
            rows = list(s.scalars(q))
        return ScheduleList(items=[public(r, next_runs) for r in rows])

    def get(self, schedule_id: str, caller: Caller, *, next_runs: int = 3) -> SchedulePublic:
        with self.sessions() as s:
            return public(self._readable(s, schedule_id, caller), next_runs)

    def set_paused(self, schedule_id: str, paused: bool, caller: Caller) -> SchedulePublic:
        """Pause, or resume from now: the ticks that passed while it was paused are handled as skipped."""
        with self.sessions.begin() as s:
            row = self._writable(s, schedule_id, caller)
            if row.paused != paused:
                row.paused = paused
                if not paused:
                    now = utcnow()
                    passed = cron.latest_tick(row.cron, row.timezone, now)
                    if passed > cron.aware(row.created_at) and (
                        row.last_tick is None or cron.aware(row.last_tick) < passed
                    ):
                        row.last_tick, row.last_outcome = passed, "skipped: paused over its tick"
                    row.next_tick = cron.next_ticks(row.cron, row.timezone, now, 1)[0]
                kind = "schedule_paused" if paused else "schedule_resumed"
                record(s, kind, actor=caller.name, schedule=row.id, project=row.project)
            return public(row, 3)

    def delete(self, schedule_id: str, caller: Caller) -> None:
        """The schedule goes; the jobs it submitted stay (their labels still name it)."""
        with self.sessions.begin() as s:
            row = self._writable(s, schedule_id, caller)
            s.delete(row)
            record(s, "schedule_deleted", actor=caller.name, schedule=row.id, name=row.name, project=row.project)

    def _readable(self, s: Session, schedule_id: str, caller: Caller) -> ScheduleRow:
        row = s.get(ScheduleRow, schedule_id)
        if row is None or not caller.can_read(row.project):
            raise schedule_not_found(schedule_id)  # another project's reads exactly as a missing one
        return row

    def _writable(self, s: Session, schedule_id: str, caller: Caller) -> ScheduleRow:
        row = self._readable(s, schedule_id, caller)
        caller.require_write(row.project, "schedules")
        return row
