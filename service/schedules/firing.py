"""The schedules' background unit (built in service/runtime.py ``units``, leased and
fenced like the monitor): each run finds the schedules whose next tick is due and handles
the latest due tick of each: fires it (an ordinary job, submitted as the schedule's owner
into its project through the job commands, so quotas and fair share apply), or skips it
(the previous job still runs under ``forbid``; a tick missed while the server was down
under ``catch_up: skip``), or records why the job was refused.

Exactly once per tick: handling a tick moves the schedule's ``last_tick`` forward with a
compare-and-set (only from an earlier tick, only while not paused) in the same transaction
that inserts its job and proves the unit's lease (``Fence.hold``). A second replica, or this
one after a restart, finds the tick handled and does nothing; a crash before the commit
leaves neither the job nor the tick, and the next run fires it."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import sessionmaker

from api.errors import Conflict, NotFound, RaydockError
from api.schemas import JobStatus, parse_job_spec
from api.schemas.schedules import SCHEDULE_LABEL, TICK_LABEL
from service.db.leases import Fence, LeaseLost
from service.db.models import JobRow, utcnow
from service.db.schedule_models import ScheduleRow
from service.db.tenancy_models import UserRow
from service.eventlog.log import record
from service.schedules import cron
from service.schedules.commands import JobPort
from service.settings.scheduling import SchedulingSettings
from service.tenancy.caller import Caller, roles_of

log = logging.getLogger("raydock.schedules")

BATCH = 100  # due schedules handled per run; the rest at the next
MIN_WAIT_S = 0.05
WAKE_AFTER_TICK_S = 0.01  # a sleep may end a hair before the wall clock reaches the tick


def tick_label(tick: datetime) -> str:
    return tick.strftime("%Y-%m-%dT%H:%M:%SZ")


class Firing:
    def __init__(self, sessions: sessionmaker, jobs: JobPort, settings: SchedulingSettings) -> None:
        self.sessions = sessions
        self.jobs = jobs
        self.settings = settings
        self.next_due: datetime | None = None  # the earliest next tick, as of the last run

    def fire_due(self, fence: Fence | None = None, now: datetime | None = None) -> int:
        """Handle every due schedule's latest tick; the jobs submitted."""
        now = now or utcnow()
        due_now = (ScheduleRow.paused.is_(False), ScheduleRow.next_tick <= now)
        with self.sessions() as s:
            due = list(s.scalars(select(ScheduleRow.id).where(*due_now).order_by(ScheduleRow.next_tick).limit(BATCH)))
        fired = 0
        for schedule_id in due:
            try:
                fired += self.handle(schedule_id, now, fence)
            except LeaseLost:
                raise  # another replica runs the unit now: this one stops here
            except Exception:  # noqa: BLE001 - one schedule's trouble never holds up the others
                log.exception("schedule %s: its tick could not be handled", schedule_id)
        if fired:
            self.jobs.on_submit()  # the monitor looks at the queue once for the lot, not once per job
        with self.sessions() as s:
            self.next_due = s.scalar(select(func.min(ScheduleRow.next_tick)).where(ScheduleRow.paused.is_(False)))
        return fired

    def wait_s(self) -> float:
        """The unit's next pause: until the earliest next tick (so a tick fires as it comes,
        not up to a cadence later), at most ``schedule_interval_s`` (a schedule made or
        resumed meanwhile is seen within it)."""
        most = self.settings.schedule_interval_s
        if self.next_due is None:
            return most
        until = (cron.aware(self.next_due) - utcnow()).total_seconds() + WAKE_AFTER_TICK_S
        return min(max(until, MIN_WAIT_S), most)

    def handle(self, schedule_id: str, now: datetime, fence: Fence | None = None) -> int:
        """Fire or skip ``schedule_id``'s latest tick at or before ``now``: 1 if a job was submitted."""
        with self.sessions() as s:
            row = s.get(ScheduleRow, schedule_id)
            if row is None or row.paused or row.next_tick is None or cron.aware(row.next_tick) > now:
                return 0
            tick = cron.latest_tick(row.cron, row.timezone, now)
            following = cron.next_ticks(row.cron, row.timezone, tick, 1)[0]
            late = (now - tick).total_seconds()
            previous = s.get(JobRow, row.last_job_id) if row.last_job_id else None
            running = previous is not None and not JobStatus(previous.status).is_terminal()
            refusal = self._owner_refusal(s, row)
            owner, owner_id, project = row.owner, row.owner_id, row.project
            concurrency, catch_up, job = row.concurrency, row.catch_up, dict(row.job)
        base = {"schedule_id": schedule_id, "tick": tick, "following": following}
        if late > self.settings.schedule_grace_s and catch_up == "skip":
            return self._skip(
                **base, outcome=f"skipped: found {late:.0f} s after its tick (catch_up=skip)", fence=fence
            )
        if refusal:
            return self._skip(**base, outcome=f"refused: {refusal}", fence=fence)
        if running and concurrency == "forbid":
            outcome = f"skipped: job {previous.id} of the previous firing is {previous.status} (concurrency=forbid)"
            return self._skip(**base, outcome=outcome, fence=fence)
        if running and concurrency == "replace":
            try:  # before the new job, so the two never run side by side
                self.jobs.cancel(previous.id, actor=owner)
            except (Conflict, NotFound):
                pass  # it ended meanwhile
        labels = {**job.get("labels", {}), SCHEDULE_LABEL: schedule_id, TICK_LABEL: tick_label(tick)}
        spec = parse_job_spec({**job, "labels": labels, "project": project})
        try:
            self.jobs.validate(spec, project)
            with self.sessions.begin() as s:
                if fence is not None:
                    fence.hold(s)  # first: a take-over waits for this firing, or refuses it
                if not self._claim(s, **base, outcome="fired"):
                    return 0  # another replica, or an earlier run, handled this tick
                made = self.jobs.insert(s, spec, actor=owner, project=project, user_id=owner_id)
                s.execute(
                    update(ScheduleRow)
                    .where(ScheduleRow.id == schedule_id)
                    .values(last_job_id=made.id, fired=ScheduleRow.fired + 1)
                )
                record(
                    s,
                    "schedule_fired",
                    job_id=made.id,
                    actor=owner,
                    schedule=schedule_id,
                    tick=tick.isoformat(),
                    late_s=round(late, 3),
                )
        except RaydockError as exc:  # the job was refused (its quota, its code package, the cluster)
            return self._skip(**base, outcome=f"refused: {exc.message}", fence=fence)
        return 1

    def _claim(self, s, *, schedule_id: str, tick: datetime, following: datetime, outcome: str) -> bool:
        """Move the schedule's last tick to ``tick`` if no one has: whether this caller did."""
        moved = s.execute(
            update(ScheduleRow)
            .where(
                ScheduleRow.id == schedule_id,
                ScheduleRow.paused.is_(False),
                or_(ScheduleRow.last_tick.is_(None), ScheduleRow.last_tick < tick),
            )
            .values(last_tick=tick, next_tick=following, last_outcome=outcome[:1000])
        ).rowcount
        return moved == 1

    def _skip(self, *, schedule_id: str, tick: datetime, following: datetime, outcome: str, fence: Fence | None) -> int:
        with self.sessions.begin() as s:
            if fence is not None:
                fence.hold(s)
            if self._claim(s, schedule_id=schedule_id, tick=tick, following=following, outcome=outcome):
                record(s, "schedule_skipped", schedule=schedule_id, tick=tick.isoformat(), outcome=outcome)
        return 0

    def _owner_refusal(self, s, row: ScheduleRow) -> str | None:
        """Why the schedule's owner may no longer submit to its project; None when they may."""
        if row.owner_id is None:
            return None  # RAYDOCK_API_TOKEN's server admin
        user = s.get(UserRow, row.owner_id)
        if user is None:
            return f"its owner {row.owner!r} no longer exists; delete it, or create it again as another user"
        caller = Caller(user.name, user.id, bool(user.is_admin), roles_of(s, user.id))
        if not caller.can_write(row.project):
            return f"its owner {row.owner!r} may no longer submit to project {row.project!r}"
        return None
