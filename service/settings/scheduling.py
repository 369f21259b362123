"""Who runs next: the default quota, fair share's memory, preemption's grace, and how
schedules fire (service/schedules/). The
``scheduling`` section of ``service.settings.Settings``."""

from __future__ import annotations

from pydantic import Field, field_validator

from api.schemas.quotas import QuotaSpec
from service.settings.section import Section


class SchedulingSettings(Section):
    default_quota: QuotaSpec = Field(
        default_factory=QuotaSpec,
        description="The quota of a project with none of its own (JSON, the body of PUT /v1/projects/{name}/quota); "
        "unset: unlimited, guarantee 0.",
    )
    fair_share_half_life_s: float = Field(
        default=3600.0,
        le=366 * 86_400,
        description="Half-life of the recent usage that orders projects in the queue.",
    )
    preemption_grace_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="How long a preempted job has to write a last checkpoint before its Ray job is stopped.",
    )

    schedule_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="The longest the schedules unit sleeps (it wakes at each next tick): how soon it sees a schedule "
        "made or resumed on another replica.",
    )
    schedule_grace_s: float = Field(
        default=60.0,
        ge=1,
        le=86_400,
        description="A tick found later than this (the server was down) counts as missed: a schedule with "
        "catch_up=skip skips it, one with catch_up=once runs it once.",
    )
    max_schedules_per_project: int = Field(
        default=100, ge=1, le=10_000, description="Schedules a project may hold; a create past it gets 429."
    )

    max_pipeline_steps: int = Field(
        default=32,
        ge=1,
        le=64,
        description="Steps one pipeline may have (POST /v1/pipelines); more get 422 `too_many_steps`.",
    )

    @field_validator("fair_share_half_life_s")
    @classmethod
    def _half_life(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(
                "RAYDOCK_FAIR_SHARE_HALF_LIFE_S must be more than 0 seconds: 0 would switch fair share off "
                "(recent usage would never count). Set it to how long usage should weigh, e.g. 3600."
            )
        return v
