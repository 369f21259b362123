"""Schedules, as a client creates them and the API shows them: a cron expression in a time
zone and the job spec each firing submits (``POST /v1/schedules``). Each firing is an
ordinary job, labelled with its schedule (``SCHEDULE_LABEL``) and the tick it fired for
(``TICK_LABEL``). Not to be confused with ``api.schemas.schedule``, a hyperparameter
schedule inside one job."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, Field, StringConstraints, model_validator

from api.schemas.common import MAX_LABELS, NAME_RE, Strict
from api.schemas.job_common import ProjectName
from api.schemas.job_spec import JobSpec
from api.schemas.jobs import UtcDatetime

MAX_CRON_CHARS = 120
MAX_TIMEZONE_CHARS = 64
MAX_JOB_SPEC_CHARS = 64 * 1024  # the job spec a schedule keeps, as JSON
MAX_NEXT_RUNS = 10
SCHEDULE_LABEL = "raydock/schedule"  # on each firing's job: the schedule's id
TICK_LABEL = "raydock/tick"  # on each firing's job: the tick it fired for (ISO 8601, UTC)
SCHEDULE_ID_PATTERN = r"^s[0-9a-f]{11}$"
# The shorthands cron itself knows, spelled as five fields.
NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

Concurrency = Literal["forbid", "allow", "replace"]
CatchUp = Literal["skip", "once"]
CronExpression = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_CRON_CHARS, pattern=r"^[A-Za-z0-9*/,#?@ LW-]+$"),
    Field(
        description="When it fires: five cron fields (minute hour day-of-month month day-of-week, e.g. `0 3 * * *` "
        f"for 03:00 every day) or one of {', '.join(NICKNAMES)}; at most {MAX_CRON_CHARS} characters."
    ),
]
TimeZone = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_TIMEZONE_CHARS, pattern=r"^[A-Za-z0-9_+/-]+$"),
    Field(description="The IANA time zone the cron fields are read in (e.g. `Europe/Berlin`); `UTC` by default."),
]


class ScheduleSpec(Strict):
    """What POST /v1/schedules takes."""

    name: str = Field(pattern=NAME_RE, description="Human-readable name (letters, digits, . _ -).")
    cron: CronExpression
    timezone: TimeZone = "UTC"
    concurrency: Concurrency = Field(
        default="forbid",
        description="When a tick comes while the previous firing's job has not ended: `forbid` skips the tick, "
        "`allow` submits another job beside it, `replace` cancels it and submits the new one.",
    )
    catch_up: CatchUp = Field(
        default="skip",
        description="Ticks missed while the server was down (or a tick found later than RAYDOCK_SCHEDULE_GRACE_S): "
        "`skip` them all, or run `once` for the latest of them. Never one job per missed tick.",
    )
    paused: bool = Field(default=False, description="Created paused: it fires nothing until resumed.")
    project: ProjectName | None = Field(
        default=None,
        description="The project the schedule and its jobs belong to; leave out for the job spec's `project`, "
        "else the caller's default project.",
    )
    job: JobSpec = Field(
        description="The job each firing submits, as POST /v1/jobs takes it (checked when the schedule is created)."
    )

    @model_validator(mode="after")
    def _bounded(self) -> "ScheduleSpec":
        size = len(json.dumps(self.job.model_dump(mode="json")))
        if size > MAX_JOB_SPEC_CHARS:
            raise ValueError(f"job spec is {size} characters of JSON; a schedule keeps at most {MAX_JOB_SPEC_CHARS}")
        if len(self.job.labels) > MAX_LABELS - 2:
            raise ValueError(
                f"job.labels has {len(self.job.labels)} labels; a scheduled job may have at most {MAX_LABELS - 2} "
                f"(each firing adds {SCHEDULE_LABEL} and {TICK_LABEL})"
            )
        taken = {SCHEDULE_LABEL, TICK_LABEL} & set(self.job.labels)
        if taken:
            raise ValueError(f"job.labels may not set {sorted(taken)[0]}: each firing sets it")
        if self.project and self.job.project and self.project != self.job.project:
            raise ValueError(f"project is {self.project!r} but job.project is {self.job.project!r}; give one of them")
        return self


class SchedulePatch(Strict):
    """What PATCH /v1/schedules/{id} takes: pause or resume."""

    paused: bool = Field(
        description="true: fire nothing until resumed; false: resume (ticks that passed while paused are not run)."
    )


class SchedulePublic(BaseModel):
    id: str = Field(description="Schedule id.")
    name: str
    project: str = Field(description="The project it submits to.")
    owner: str = Field(description="The user whose schedule it is: its jobs are submitted as them.")
    cron: str
    timezone: str
    concurrency: Concurrency
    catch_up: CatchUp
    paused: bool
    job: dict = Field(description="The job spec each firing submits.")
    created_at: UtcDatetime
    last_tick: UtcDatetime | None = Field(default=None, description="The latest tick handled (fired or skipped).")
    last_job_id: str | None = Field(default=None, description="The job of the latest firing.")
    last_outcome: str | None = Field(
        default=None, description="What the latest tick did: fired, skipped (and why), or refused (and why)."
    )
    fired: int = Field(default=0, description="Jobs submitted by this schedule so far.")
    next_runs: list[UtcDatetime] = Field(
        default_factory=list, description=f"The next firing times (at most {MAX_NEXT_RUNS}; none while paused)."
    )


class ScheduleList(BaseModel):
    items: list[SchedulePublic]
