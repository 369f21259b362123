"""The job spec: a training job or a search, told apart by ``kind`` (no kind = train)."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Discriminator, Tag, TypeAdapter

from api.schemas.train import TrainSpec
from api.schemas.tune import TuneSpec

JOB_KINDS = ("train", "tune")


def job_kind(value: Any) -> str:
    """The discriminator of ``JobSpec``: a spec without ``kind`` is a training job."""
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if kind is not None else "train"


JobSpec = Annotated[
    Union[Annotated[TrainSpec, Tag("train")], Annotated[TuneSpec, Tag("tune")]],
    Discriminator(
        job_kind, custom_error_type="invalid_kind", custom_error_message="kind must be train (the default) or tune"
    ),
]
job_spec_adapter: TypeAdapter[JobSpec] = TypeAdapter(JobSpec)


def parse_job_spec(data: dict[str, Any]) -> JobSpec:
    """Validate a plain dict (from JSON or YAML) into a JobSpec."""
    return job_spec_adapter.validate_python(data)


def code_spec(spec: JobSpec) -> TrainSpec:
    """The training spec whose code and environment a job runs: a training job's own,
    a search's ``base`` (every trial runs it)."""
    return spec.base if isinstance(spec, TuneSpec) else spec
