"""Events: what a running job tells the server, typed.

A job's driver (and a search's driver) writes each event as one log line,
``RAYDOCK_EVENT {json}``, and also pushes it over HTTP. The server validates every
event from either channel with :func:`parse_event`; an event that does not validate is
dropped and counted on its job, never trusted. Extra fields are ignored so an older
server reads a newer driver's events. ``(attempt, type family, seq)`` identifies an
event, so the two channels store it once.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    TypeAdapter,
)

# The driver's environment names have their home in api.cluster_contract; kept importable here.
from api.cluster_contract import LAUNCH_SHA256_ENV, LAUNCH_URI_ENV, PREEMPT_URI_ENV  # noqa: F401
from api.schemas.common import bounded_json

MARKER = "RAYDOCK_EVENT "

# The header of every events post naming the Ray submission id of the attempt that sends it.
SUBMISSION_HEADER = "Raydock-Submission-Id"
MAX_SEQ = 2**53  # JSON numbers stay exact below this
MAX_METRICS = 512
MAX_TEXT = 64 * 1024  # messages and tracebacks are cut to this before they are sent

Seq = Annotated[int, Field(ge=0, lt=MAX_SEQ)]
Key = Annotated[str, StringConstraints(min_length=1, max_length=200)]
MAX_TRIAL_ID = 64  # the store's trial id columns hold this many characters
# A trial id names a trial in lists, logs and trackers: one line of text, never a path (no
# "/" or "\\", no control characters, not "." or ".."). Ray Tune's ids are letters, digits and "_".
TRIAL_ID_RE = r"^[^/\\\x00-\x1f\x7f-\x9f]+$"


def _not_dots(v: str) -> str:
    if v in (".", ".."):
        raise ValueError("a trial id is not '.' or '..'")
    return v


Id = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_TRIAL_ID, pattern=TRIAL_ID_RE), AfterValidator(_not_dots)
]
Path = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


def _metric_value(v: Any) -> Any:
    # Nothing is coerced: an int too large for the store is refused rather than turned
    # into a float, and "1" stays a string.
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int) and -(2**63) <= v < 2**63:
        return v
    if isinstance(v, float) and math.isfinite(v):
        return v
    if isinstance(v, str) and len(v) <= 1000:
        return v
    raise ValueError("a metric value is a finite number, an int64, a bool, null or a string of at most 1000 characters")


MetricValue = Annotated[
    Union[bool, int, float, str, None],
    PlainValidator(_metric_value, json_schema_input_type=Union[bool, int, float, str, None]),
]
Metrics = Annotated[dict[Key, MetricValue], Field(max_length=MAX_METRICS)]
# Searched values: dotted path -> any JSON value (a choice may hold lists or objects).
Config = Annotated[dict[Key, Any], Field(max_length=MAX_METRICS), BeforeValidator(bounded_json)]


class Event(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    seq: Seq = Field(description="Position in the sender's sequence for this kind of event.")
    ts: FiniteFloat = Field(default=0.0, ge=0.0, description="Unix time the event was made.")


class StartedEvent(Event):
    type: Literal["started"]


class MetricEvent(Event):
    type: Literal["metric"]
    metrics: Metrics


class CheckpointEvent(Event):
    type: Literal["checkpoint"]
    path: Path
    metrics: Metrics = Field(default_factory=dict)


class WorkerFailureEvent(Event):
    type: Literal["worker_failure"]
    reason: Text = ""


class ErrorEvent(Event):
    """The job's code or cluster failed. TIMEOUT and CANCELLED are the server's to decide."""

    type: Literal["error"]
    cause: Literal["USER_CODE", "NO_RESOURCES", "INFRASTRUCTURE"]
    message: Text = ""
    traceback: Text = ""


class ResultEvent(Event):
    """A training run ended: its final metrics and last checkpoint."""

    type: Literal["result"]
    metrics: Metrics = Field(default_factory=dict)
    path: Path | None = None


class WorkerNode(BaseModel):
    model_config = ConfigDict(extra="ignore")

    ip: Annotated[str, StringConstraints(max_length=64)]
    node_id: Annotated[str, StringConstraints(max_length=128)]


class WorkerGroupEvent(Event):
    type: Literal["worker_group"]
    world_size: Annotated[int, Field(ge=0, le=1_000_000)]
    nodes: Annotated[list[WorkerNode], Field(max_length=100_000)]
    trial_id: Id | None = Field(default=None, description="The search trial whose Train run started this group.")


# A job's start-up phases, in the order they happen; the meaning of each is in
# trainers/phases.py, which marks the job-side ones.
Phase = Literal[
    "queued",
    "admitted",
    "submitted",
    "driver_started",
    "workers_placed",
    "process_group_ready",
    "first_step",
    "first_metric",
]
PHASE_NAMES: tuple[str, ...] = Phase.__args__
# The phases only the server knows (its own clock): a job's event naming one is refused.
SERVER_PHASES = frozenset({"queued", "admitted", "submitted", "first_metric"})
JOB_PHASES: tuple[str, ...] = tuple(p for p in PHASE_NAMES if p not in SERVER_PHASES)


class PhaseEvent(Event):
    """A start-up phase of this attempt was reached at ``ts``; ``seq`` is the phase's
    place in ``PHASE_NAMES``, so each phase is stored at most once per attempt."""

    type: Literal["phase"]
    phase: Phase
    trial_id: Id | None = Field(default=None, description="The search trial whose Train worker marked it.")


class TrialMetricEvent(Event):
    type: Literal["trial_metric"]
    trial_id: Id
    metrics: Metrics
    config: Config = Field(default_factory=dict)


class TrialEvent(Event):
    type: Literal["trial"]
    trial_id: Id
    status: Literal["PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR"]
    config: Config = Field(default_factory=dict)
    error: Text | None = None
    note: Text | None = None  # what the user should know about the trial that is not a failure


class ExploitEvent(Event):
    """PBT cloned a donor trial into ``trial_id`` and perturbed its values."""

    type: Literal["exploit"]
    trial_id: Id
    donor_trial_id: Id
    donor_time: FiniteFloat | None = None
    trial_time: FiniteFloat | None = None
    donor_metric: FiniteFloat | None = None
    old_config: Config = Field(default_factory=dict)
    donor_config: Config = Field(default_factory=dict)
    new_config: Config = Field(default_factory=dict)
    checkpoint_path: Path | None = None


class BestTrialEvent(Event):
    """A search ended: its best trial."""

    type: Literal["best_trial"]
    trial_id: Id
    value: FiniteFloat
    config: Config = Field(default_factory=dict)
    metrics: Metrics = Field(default_factory=dict)
    checkpoint_path: Path | None = None


JobEvent = Annotated[
    Union[
        StartedEvent,
        MetricEvent,
        CheckpointEvent,
        WorkerFailureEvent,
        ErrorEvent,
        ResultEvent,
        WorkerGroupEvent,
        PhaseEvent,
        TrialMetricEvent,
        TrialEvent,
        ExploitEvent,
        BestTrialEvent,
    ],
    Field(discriminator="type"),
]
_adapter: TypeAdapter[JobEvent] = TypeAdapter(JobEvent)


def parse_event(obj: Any) -> JobEvent:
    """Validate one decoded event; raises ``pydantic.ValidationError``."""
    return _adapter.validate_python(obj)


def jsonable(value: Any) -> Any:
    """Metric values as JSON can carry them: non-finite floats as strings ("nan", "inf"),
    numpy/torch scalars as numbers, anything else as its text."""
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return jsonable(item())
        except (TypeError, ValueError):
            pass
    return str(value)


def event_json(event: Event) -> str:
    """The compact JSON of an event, as both channels carry it (a phase or worker group
    that names no trial as it did before they could)."""
    data = event.model_dump(mode="json")
    if "trial_id" in data and data["trial_id"] is None:
        del data["trial_id"]
    return json.dumps(data, separators=(",", ":"))


def event_line(event: Event) -> str:
    """The log line of an event: ``RAYDOCK_EVENT {json}``."""
    return MARKER + event_json(event)
