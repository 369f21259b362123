"""Why a run failed, as the server records it: an exception from ``fit()`` (or from
setting the run up) mapped to a cause, a one-line message and the traceback's tail.

- ``USER_CODE``: a worker raised (the user's loop, or a built-in loop on the user's
  data or settings), or the job's code could not be loaded;
- ``NO_RESOURCES``: the worker group never got its resources;
- ``INFRASTRUCTURE``: anything else (Ray, the node, the storage).

Cancels and deadlines are the server's to decide: a stopped driver reports nothing.

Every failure reads the same way, for a training job, a trial and a search: the root
exception's ``Type: message`` first, then the user's own frames, then Ray's and
raydock's (``readable``); no terminal colour codes. A search trial fails with a
``TrialFailed`` that carries that text through Tune, which wraps it in its own frames.
"""

from __future__ import annotations

import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

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


class TrialFailed(Exception):
    """A search trial's failure, already readable: its cause, headline and frames."""

    def __init__(self, cause: str, message: str, details: str) -> None:
        super().__init__(message)
        self.cause, self.message, self.details = cause, message, details

    def __reduce__(self):
        # Survives the trip through Ray and Tune's pickled error file.
        return (TrialFailed, (self.cause, self.message, self.details))

    def __str__(self) -> str:
        return f"{self.message}\n\n{self.details}"


def classify(exc: BaseException) -> Failure:
    """Map a failed run to its cause, its root exception's ``Type: message`` and its
    frames (the user's first)."""
    from ray.train import ControllerError, WorkerGroupError

    if isinstance(unwrap(exc), TrialFailed):
        exc = unwrap(exc)
        return Failure(FailureCause(exc.cause), exc.message, exc.details[:TRACEBACK_TAIL_CHARS])
    if isinstance(exc, WorkerGroupError):
        errors = list(getattr(exc, "worker_failures", {}).values())
        root = errors[0] if errors else exc
        # Ray formats the workers' tracebacks into the error message; the exception
        # objects arrive unpickled without their frames.
        tb = getattr(exc, "_error_message", "") or "".join(traceback.format_exception(root))
        return Failure(FailureCause.USER_CODE, headline(root), readable(tb)[:TRACEBACK_TAIL_CHARS])
    text = "".join(traceback.format_exception(exc))
    tail = readable(text)[:TRACEBACK_TAIL_CHARS]  # the user's frames lead: keep the head
    if isinstance(exc, ControllerError) and "start" in str(exc).lower() and "timed out" in text.lower():
        return Failure(FailureCause.NO_RESOURCES, NO_RESOURCES_MESSAGE, tail)
    root = _root(unwrap(exc))
    if isinstance(root, (ImportError, AttributeError, ValueError)):
        return Failure(FailureCause.USER_CODE, headline(root), tail)
    return Failure(FailureCause.INFRASTRUCTURE, headline(root), tail)


def unwrap(exc: BaseException) -> BaseException:
    """The exception inside Ray's wrappers (``RayTaskError.cause``,
    ``ControllerError.controller_failure``)."""
    for _ in range(10):
        inner = getattr(exc, "cause", None) or getattr(exc, "controller_failure", None)
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc


def _root(exc: BaseException) -> BaseException:
    """The first exception of a chain: what went wrong before anything wrapped it."""
    seen = {id(exc)}
    while (inner := exc.__cause__ or exc.__context__) is not None and id(inner) not in seen:
        exc = unwrap(inner)
        seen.add(id(exc))
    return exc


def headline(exc: BaseException) -> str:
    """``Type: message``, one line, no colour codes."""
    text = strip_ansi(f"{type(exc).__name__}: {exc}").strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ----------------------------------------------------------------------------- frames

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
FRAME = re.compile(r'^ *File "(?P<path>[^"]+)", line \d+, in [^\n]*(?:\n(?! *File ")(?:    |\t)[^\n]*)*', re.M)
# Frames of raydock's own cluster code, next to the user's tests and fixtures.
OWN_CODE = tuple(str(Path(__file__).resolve().parents[1] / d) + "/" for d in ("trainers", "tuning", "service", "api"))
LIBRARY_MARKERS = ("site-packages/", "dist-packages/", "/lib/python3", "<frozen ")


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def is_users(path: str) -> bool:
    return not (path.startswith(OWN_CODE) or any(m in path for m in LIBRARY_MARKERS))


def readable(text: str) -> str:
    """A traceback's text rearranged: the user's frames first, then Ray's and raydock's,
    each in call order, then the exception lines as they were (chained causes, Ray's
    error snippets); no colour codes."""
    text = strip_ansi(text)
    frames = list(FRAME.finditer(text))
    if not frames:
        return text.strip()
    users = [m[0].strip("\n") for m in frames if is_users(m["path"])]
    others = [m[0].strip("\n") for m in frames if not is_users(m["path"])]
    rest = FRAME.sub("", text)
    rest = "\n".join(
        line for line in rest.splitlines() if line.strip() and not line.startswith("Traceback (most recent call last)")
    )
    parts = []
    if users:
        parts.append("Your code (most recent call last):\n" + "\n".join(users))
    if others:
        parts.append("Ray and raydock (most recent call last):\n" + "\n".join(others))
    parts.append(rest)
    return "\n\n".join(parts).strip()


def report_failure(failure: Failure) -> int:
    """Send the failure to the server, print its traceback to the job's log, and give
    the driver's exit status."""
    events.emit(
        ErrorEvent(type="error", seq=0, cause=failure.cause.value, message=failure.message, traceback=failure.traceback)
    )
    events.flush()
    print(failure.traceback, file=sys.stderr, flush=True)
    return 1
