"""What every part of the contract shares: the strict base model, the bounds on names,
labels and integers, the job and trial status enums, the failure-cause enum, and the error body."""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

ENTRYPOINT_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"

INT64_MAX = 2**63 - 1
# Integers in paths and queries; larger values are refused with a 4xx before any query runs.
Int64 = Annotated[int, Field(ge=-(2**63), le=INT64_MAX)]
NonNegInt64 = Annotated[int, Field(ge=0, le=INT64_MAX)]

MAX_LABELS = 32
LABEL_KEY_RE = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$"
LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY_RE)]
# No NUL: PostgreSQL text cannot hold it (labels are indexed rows there too).
LabelValue = Annotated[str, StringConstraints(max_length=256, pattern=r"^[^\x00]*$")]
Labels = Annotated[
    dict[LabelKey, LabelValue],
    Field(
        max_length=MAX_LABELS,
        description=(
            f"Free labels to filter jobs by: at most {MAX_LABELS}, keys of 1-63 letters, digits, `. _ / -` "
            "(starting with a letter or digit), values of at most 256 characters (no NUL)."
        ),
    ),
]

# Free-form JSON (a user entrypoint's config, runtime_env, searched values): bounded so that
# every part of the server that stores, copies or serialises it can (a 900-deep object once
# passed validation and failed later with a 500).
MAX_JSON_DEPTH = 32
MAX_JSON_VALUES = 100_000


def bounded_json(value: Any) -> Any:
    """Refuse a value nested deeper than MAX_JSON_DEPTH or holding more than MAX_JSON_VALUES
    values; walked without recursion, so any depth is measured safely."""
    stack, seen = [(value, 0)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_JSON_VALUES:
            raise ValueError(f"holds more than {MAX_JSON_VALUES} values (all levels together); send less")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, (list, tuple)) else None
        if children is None:
            continue
        if depth >= MAX_JSON_DEPTH:
            raise ValueError(f"is nested more than {MAX_JSON_DEPTH} levels deep; flatten it")
        stack.extend((child, depth + 1) for child in children)
    return value


FreeJson = Annotated[dict[str, Any], BeforeValidator(bounded_json)]
FreeJsonList = Annotated[list[Any], BeforeValidator(bounded_json)]


class Strict(BaseModel):
    """Every spec model: unknown fields are refused (a typo fails loudly) and floats are finite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class JobStatus(str, enum.Enum):
    # Runs after other jobs (``after``, a pipeline's steps): joins the queue once they ended as asked.
    WAITING = "WAITING"
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    CANCELLING = "CANCELLING"
    # Stopped to give its borrowed room back: a last checkpoint, then back to QUEUED.
    PREEMPTED = "PREEMPTED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    def is_terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class TrialStatus(str, enum.Enum):
    """A search trial's status: Ray Tune's five, which the search's driver sends, and
    CANCELLED, which the server reads a live trial of a cancelled search as."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    # PBT paused it to clone another trial's weights, or it waits its turn: it will be back.
    PAUSED = "PAUSED"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"
    CANCELLED = "CANCELLED"

    def is_live(self) -> bool:
        return self in (TrialStatus.PENDING, TrialStatus.RUNNING, TrialStatus.PAUSED)

    def is_terminal(self) -> bool:
        return not self.is_live()


class FailureCause(str, enum.Enum):
    USER_CODE = "USER_CODE"  # the training code raised
    NO_RESOURCES = "NO_RESOURCES"  # the cluster could not give what the job asked for
    INFRASTRUCTURE = "INFRASTRUCTURE"  # Ray, the node, or raydock itself failed
    TIMEOUT = "TIMEOUT"  # the job ran past its max_runtime_s


class ErrorBody(BaseModel):
    code: str = Field(description="Machine-readable error code, e.g. `invalid_spec`.")
    message: str = Field(description="What went wrong and what to change.")
    details: list[dict[str, Any]] = Field(default_factory=list, description="Per-field problems, if any.")


class ErrorResponse(BaseModel):
    error: ErrorBody
