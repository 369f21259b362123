"""Why a run failed, as the server records it: an exception from ``fit()`` (or from
setting the run up) mapped to a cause, a one-line message and the traceback's tail.

- ``USER_CODE``: a worker raised (the user's loop, or a built-in loop on the user's
  data or settings), or the job's code could not be loaded;
- ``NO_RESOURCES``: the worker group never got its resources;
- ``INFRASTRUCTURE``: anything else (Ray, the node, the storage).

Cancels and deadlines are the server's to decide: a stopped driver reports nothing.
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass

from api.schemas import ErrorEvent, FailureCause
from trainers import events

TRACEBACK_TAIL_CHARS = 4000
MESSAGE_CHARS = 4000
NO_RESOURCES_MESSAGE = (
    "the cluster could not start the worker group in time: not enough free resources "
    "(lower scaling.num_workers / cpus_per_worker or add nodes)"
)


@dataclass(frozen=True)
class Failure:
    cause: FailureCause
    message: str
    traceback: str

    def __post_init__(self) -> None:
        # An exception's text can be any size; the event carries a bounded one.
        object.__setattr__(self, "message", self.message[:MESSAGE_CHARS])


def classify(exc: BaseException) -> Failure:
    """Map a failed run to its cause, message and traceback tail."""
    from ray.train import ControllerError, WorkerGroupError

    if isinstance(exc, WorkerGroupError):
        errors = list(getattr(exc, "worker_failures", {}).values())
        root = errors[0] if errors else exc
        # Ray formats the workers' tracebacks into the error message; the exception
        # objects arrive unpickled without their frames.
        tb = getattr(exc, "_error_message", "") or "".join(traceback.format_exception(root))
        return Failure(FailureCause.USER_CODE, _first_line(root), tb[-TRACEBACK_TAIL_CHARS:])
    text = "".join(traceback.format_exception(exc))
    tail = text[-TRACEBACK_TAIL_CHARS:]
    if isinstance(exc, ControllerError) and "start" in str(exc).lower() and "timed out" in text.lower():
        return Failure(FailureCause.NO_RESOURCES, NO_RESOURCES_MESSAGE, tail)
    if isinstance(exc, (ImportError, AttributeError, ValueError)):
        return Failure(FailureCause.USER_CODE, f"{type(exc).__name__}: {exc}", tail)
    return Failure(FailureCause.INFRASTRUCTURE, f"{type(exc).__name__}: {exc}", tail)


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def report_failure(failure: Failure) -> int:
    """Send the failure to the server, print its traceback to the job's log, and give
    the driver's exit status."""
    events.emit(ErrorEvent(type="error", seq=0, cause=failure.cause.value, message=failure.message, traceback=failure.traceback))
    events.flush()
    print(failure.traceback, file=sys.stderr, flush=True)
    return 1
