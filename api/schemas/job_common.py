"""What every job spec holds whatever its kind: its name, labels, queue priority and
deadlines. ``TrainSpec`` and ``TuneSpec`` derive from ``JobCommon``; each narrows
``kind`` to its own literal (the ``JobSpec`` discriminator) and gives ``name`` its default."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from api.schemas.common import NAME_RE, Labels, Strict
from api.schemas.dependencies import DependencyList, InitFrom
from api.schemas.eventlog import MAX_NOTIFY, NotifySpec
from api.schemas.tracking import TrackingSpec

MAX_DURATION_S = 366 * 86_400  # a year: longer deadlines are typos

JobName = Annotated[str, Field(pattern=NAME_RE, description="Human-readable name (letters, digits, . _ -).")]
PROJECT_RE = r"^[a-z][a-z0-9-]{0,62}$"
DEFAULT_PROJECT = "default"
ProjectName = Annotated[
    str,
    Field(
        pattern=PROJECT_RE,
        description="Project slug: a lowercase letter, then up to 62 lowercase letters, digits or `-`.",
    ),
]


class JobCommon(Strict):
    kind: str
    name: JobName
    labels: Labels = Field(default_factory=dict)
    tracking: TrackingSpec | None = Field(
        default=None,
        description="Export the job's reports to TensorBoard and/or MLflow as they arrive (see the README's tracking section).",
    )
    project: ProjectName | None = Field(
        default=None,
        description="The project the job runs in (its visibility, quota and fair share); leave out for the "
        "caller's default project (GET /v1/me).",
    )
    priority: int = Field(
        default=0,
        ge=-1000,
        le=1000,
        description="Queue priority: higher starts first; equal priorities start in arrival order.",
    )
    max_runtime_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_DURATION_S,
        description="Fail the job (cause TIMEOUT) if an attempt runs longer than this many seconds (a resume starts a new count).",
    )
    scheduling_timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_DURATION_S,
        description="Fail the job (cause NO_RESOURCES) if the cluster cannot start it within this many seconds of submission.",
    )
    notify: list[NotifySpec] = Field(
        default_factory=list,
        max_length=MAX_NOTIFY,
        description="Webhooks for this job's events (at most 5); each is signed with its own secret (GET /v1/jobs/{id}/webhooks).",
    )
    after: DependencyList = Field(default_factory=list)
    init_from: InitFrom | None = Field(
        default=None,
        description="Start from a checkpoint of another job of the project (a training job: the one it starts "
        "from, as a resumed job does; a search's id: its best trial's). Runs after that job as if named in "
        "`after` with status SUCCEEDED, unless `after` names it otherwise.",
    )
