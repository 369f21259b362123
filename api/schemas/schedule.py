"""A hyperparameter schedule: the optimizer's values by epoch or step, which the built-in
loops apply as they train (``trainers.skeleton``). A search's replay
(``GET /v1/jobs/{id}/best/replay``) gives its best trial's PBT schedule as one."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from api.schemas.common import Strict

# The fields a running optimizer can change between steps.
SCHEDULABLE = ("optimizer.lr", "optimizer.weight_decay", "optimizer.momentum")
MAX_INTERVALS = 10_000


class ScheduleInterval(Strict):
    at: int = Field(
        ge=0,
        le=100_000_000,
        description="The epoch or step count (completed) from which these values apply; the first interval is at 0.",
    )
    values: dict[str, float] = Field(
        min_length=1,
        max_length=len(SCHEDULABLE),
        description=f"Dotted field paths ({', '.join(SCHEDULABLE)}) and their values from `at` on.",
    )


class HyperparameterSchedule(Strict):
    unit: Literal["epoch", "step"] = Field(description="What `at` counts: completed epochs or optimizer steps.")
    intervals: list[ScheduleInterval] = Field(
        min_length=1, max_length=MAX_INTERVALS, description="In increasing `at`, the first at 0."
    )

    @model_validator(mode="after")
    def _ordered(self) -> "HyperparameterSchedule":
        if self.intervals[0].at != 0:
            raise ValueError(
                f"the first interval must be at 0 (it is at {self.intervals[0].at}): it sets the starting values"
            )
        ats = [i.at for i in self.intervals]
        if any(b <= a for a, b in zip(ats, ats[1:])):
            raise ValueError(f"intervals must be in strictly increasing `at`; got {ats[:20]}")
        for interval in self.intervals:
            unknown = sorted(set(interval.values) - set(SCHEDULABLE))
            if unknown:
                raise ValueError(f"{unknown[0]} cannot be scheduled; a schedule sets {', '.join(SCHEDULABLE)}")
        return self

    def values_at(self, count: int) -> dict[str, float]:
        """Every scheduled value in effect once ``count`` epochs or steps are done."""
        out: dict[str, float] = {}
        for interval in self.intervals:
            if interval.at > count:
                break
            out.update(interval.values)
        return out
