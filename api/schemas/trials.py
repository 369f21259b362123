"""What the API answers about a search: its trials, their metric series, PBT's lineage
and the best trial."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field


def metric_value(v: Any) -> float | None:
    """A reported metric as a number a search ranks, or None. Only finite ints and
    floats are values: a bool, a string (even "0.5"), None, NaN and infinities are not,
    wherever a report is ranked (the search's driver, ingestion, the best-so-far read)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def better(value: float, than: float, mode: Literal["min", "max"] | None) -> bool:
    """Whether ``value`` beats ``than`` in a search of ``mode`` (a tie does not)."""
    return value > than if mode == "max" else value < than


class ExploitPhases(BaseModel):
    """A trial's restart after one PBT exploit, each phase in seconds after the decision
    (None until reached)."""

    at: float = Field(description="Unix time PBT decided the trial clones its donor.")
    paused: float | None = Field(default=None, description="The trial's run was stopped (PAUSED or PENDING).")
    restored: float | None = Field(
        default=None,
        description="The trial runs again from the donor's checkpoint: its new Train worker group is up "
        "(a function trainable: its new process started).",
    )
    first_step: float | None = Field(default=None, description="Rank 0 finished its first step after the restore.")
    first_metric: float | None = Field(default=None, description="The trial's first report after the restore.")


class TrialPublic(BaseModel):
    trial_id: str = Field(description="Tune's id of the trial.")
    status: str = Field(description="PENDING, RUNNING, PAUSED, TERMINATED or ERROR (CANCELLED once the job was).")
    config: dict[str, Any] = Field(description="The trial's current values of the searched fields (dotted paths).")
    reports: int = Field(description="Reports received from the trial.")
    last_metrics: dict[str, Any] | None = Field(default=None, description="The trial's latest report.")
    best_metric: float | None = Field(default=None, description="The trial's best value of the search metric so far.")
    stopped_early: bool = Field(default=False, description="Ended before its budget (stopped by the scheduler).")
    exploits: int = Field(default=0, description="How many times the trial cloned another one (PBT).")
    error: str | None = Field(default=None, description="Why the trial failed, when it did.")
    note: str | None = Field(
        default=None,
        description="What to know about the trial that is not a failure, e.g. that PBT cannot carry its loop's weights.",
    )
    first_metric_s: float | None = Field(
        default=None,
        description="Seconds from the trial's start (the search driver saw it RUNNING) to its first report stored: "
        "the trial's own start-up.",
    )
    start_phases: dict[str, float] = Field(
        default_factory=dict,
        description="The trial's start-up phases reached so far, in seconds after it was queued: queued, placed "
        "(its Train worker group is up; a function trainable: its process started), first_step (rank 0's first "
        "step; a function trainable: its first report) and first_metric (its first report).",
    )
    exploit_phases: list[ExploitPhases] = Field(
        default_factory=list,
        description="Each restart after a PBT exploit (the latest 100), oldest first.",
    )


class TrialMetricPoint(BaseModel):
    seq: int = Field(description="Position in the search's report sequence (across trials).")
    ts: float = Field(description="Unix time the report reached the search driver.")
    epoch: int | None = None
    step: int | None = None
    metrics: dict[str, Any]
    config: dict[str, Any] = Field(description="The trial's searched values when it made the report.")


class ExploitPublic(BaseModel):
    seq: int = Field(description="Order of the event within the search.")
    ts: float = Field(description="Unix time of the decision.")
    trial_id: str = Field(description="The trial that cloned (the bottom of the population).")
    donor_trial_id: str = Field(description="The trial it cloned weights and hyperparameters from.")
    donor_time: float | None = Field(default=None, description="The donor's epoch or step at its cloned checkpoint.")
    trial_time: float | None = Field(
        default=None, description="The cloning trial's own epoch or step when it gave up its run."
    )
    donor_metric: float | None = Field(default=None, description="The donor's search metric at that checkpoint.")
    old_config: dict[str, Any] = Field(description="The cloning trial's values before.")
    donor_config: dict[str, Any] = Field(description="The donor's values.")
    new_config: dict[str, Any] = Field(description="The perturbed values the trial goes on with.")
    checkpoint_path: str | None = Field(default=None, description="The donor checkpoint the trial restarted from.")


class TrialCheckpoint(BaseModel):
    id: int | None = Field(
        default=None, description="Id in the job's checkpoint list (GET /v1/jobs/{id}/checkpoints/{cid}/download)."
    )
    path: str = Field(description="Where the checkpoint lives in storage.")
    epoch: int | None = None
    step: int | None = None


class BestTrialPublic(BaseModel):
    trial_id: str = Field(description="The best trial.")
    metric: str
    mode: str
    value: float = Field(description="Its best value of the metric.")
    config: dict[str, Any] = Field(description="The searched values it had when it reported that value.")
    metrics: dict[str, Any] = Field(description="That whole report.")
    final: bool = Field(description="True once the search ended; before, the best so far.")
    checkpoint: TrialCheckpoint | None = Field(default=None, description="Its best checkpoint, once final.")
