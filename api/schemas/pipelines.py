"""Pipelines, as a client submits them and the API shows them: a small graph of jobs
(``POST /v1/pipelines``), each step a job spec with a name, the steps it runs ``after``
and the step's checkpoint it starts from (``init_from``), by step name. The server stores
every step as an ordinary job in one transaction, labelled with its pipeline
(``PIPELINE_LABEL``) and step (``STEP_LABEL``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints

from api.schemas.common import NAME_RE, JobStatus, Labels, Strict
from api.schemas.dependencies import DependencyList, InitFrom, StepName
from api.schemas.job_common import ProjectName
from api.schemas.job_spec import JobSpec
from api.schemas.jobs import UtcDatetime

MAX_STEPS = 64  # the schema's bound; RAYDOCK_MAX_PIPELINE_STEPS (at most this) is the server's
PIPELINE_LABEL = "raydock/pipeline"  # on each step's job: its pipeline's id
STEP_LABEL = "raydock/step"  # on each step's job: its step's name
PIPELINE_ID_PATTERN = r"^p[0-9a-f]{11}$"
PipelineId = Annotated[str, StringConstraints(pattern=PIPELINE_ID_PATTERN)]


class PipelineStep(Strict):
    name: StepName = Field(description="The step's name, unique in its pipeline (letters, digits, . _ -).")
    job: JobSpec = Field(
        description="The step's job spec (a training job or a search); its own `after` and `init_from` stay "
        "empty: the step's say them."
    )
    after: DependencyList = Field(default_factory=list)
    init_from: InitFrom | None = Field(
        default=None,
        description="The checkpoint this step starts from: `{step: NAME, checkpoint: best|latest}` (or a job id). "
        "It runs after that step as if named in `after` with status SUCCEEDED, unless `after` names it otherwise.",
    )


class PipelineSpec(Strict):
    """What POST /v1/pipelines takes."""

    name: str = Field(pattern=NAME_RE, description="Human-readable name (letters, digits, . _ -).")
    project: ProjectName | None = Field(
        default=None, description="The project of every step (leave the steps' own `project` out, or the same)."
    )
    labels: Labels = Field(default_factory=dict)
    steps: list[PipelineStep] = Field(
        min_length=1,
        max_length=MAX_STEPS,
        description="The steps; at most RAYDOCK_MAX_PIPELINE_STEPS (32 unless set). No cycles.",
    )


class PipelineStepPublic(BaseModel):
    name: str
    job_id: str = Field(description="The step's job (GET /v1/jobs/{id}).")
    status: JobStatus
    status_reason: str | None = None
    after: list[dict] = Field(
        default_factory=list, description="What it runs after: {step, status} (or {job, status} outside the pipeline)."
    )
    init_from: dict | None = None
    started_at: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None


class PipelinePublic(BaseModel):
    id: str
    name: str
    project: str
    labels: dict[str, str] = Field(default_factory=dict)
    created_at: UtcDatetime
    status: JobStatus = Field(
        description="RUNNING while any step has not ended; else SUCCEEDED when all did, FAILED when any failed, "
        "else CANCELLED."
    )
    steps: list[PipelineStepPublic]


class PipelineList(BaseModel):
    items: list[PipelinePublic]
