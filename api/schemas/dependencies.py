"""What a job runs after and what it starts from: ``after`` (jobs, or steps of its pipeline,
that must end first, and how) and ``init_from`` (the checkpoint of one of them it starts
from). Part of every job spec (``JobCommon``) and of a pipeline's steps
(``api.schemas.pipelines``). A plain job names jobs by id; a pipeline's step names its
other steps by name, and the server stores them as the ids of those steps' jobs."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from api.schemas.common import NAME_RE, Strict

MAX_AFTER = 16  # dependencies of one job
JobRef = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")]
StepName = Annotated[str, StringConstraints(pattern=NAME_RE)]
# SUCCEEDED: run only after it succeeded; FAILED: only after it failed (an on-failure step);
# ENDED: after it ended whatever its status.
AfterStatus = Literal["SUCCEEDED", "FAILED", "ENDED"]
CheckpointChoice = Literal["best", "latest"]


class _Ref(Strict):
    job: JobRef | None = Field(default=None, description="The id of a job of the same project.")
    step: StepName | None = Field(default=None, description="In a pipeline: the name of another of its steps.")

    @model_validator(mode="after")
    def _one(self):
        if (self.job is None) == (self.step is None):
            raise ValueError("name exactly one of `job` (a job id) or `step` (a step of the same pipeline)")
        return self

    @property
    def ref(self) -> str:
        return self.job if self.job is not None else f"step {self.step}"


class After(_Ref):
    """One job (or step) this job runs after."""

    status: AfterStatus = Field(
        default="SUCCEEDED",
        description="What it must end as: SUCCEEDED (the default), FAILED, or ENDED (any end: SUCCEEDED, FAILED "
        "or CANCELLED). Ending otherwise stops this job (CANCELLED, its reason naming the dependency).",
    )


class InitFrom(_Ref):
    """The checkpoint this job starts from: one the server lists as complete for that job."""

    checkpoint: CheckpointChoice = Field(
        default="best",
        description="best: the checkpoint best by the job's checkpoint.score_metric (its latest when it has "
        "none), or a search's best trial's; latest: the newest.",
    )


def satisfied(wanted: str, status: str) -> bool:
    """Whether a dependency that ended as ``status`` satisfies ``wanted`` (an AfterStatus)."""
    return wanted == "ENDED" or wanted == status


DependencyList = Annotated[
    list[After],
    Field(
        max_length=MAX_AFTER,
        description=f"Jobs this one runs after (at most {MAX_AFTER}): it WAITs until each has ended as asked, "
        "then joins the queue; one that ends otherwise stops it.",
    ),
]
