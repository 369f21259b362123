"""Failure classification (trainers.failures): real exceptions, as a run raises them,
mapped to the cause, message and traceback the server records."""

from __future__ import annotations

from ray.train import ControllerError, WorkerGroupError

from api.schemas import ErrorEvent, FailureCause, parse_event
from trainers.failures import MESSAGE_CHARS, TRACEBACK_TAIL_CHARS, classify


def raised(exc: BaseException) -> BaseException:
    """``exc`` with a traceback, as ``fit()`` hands it over."""
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return caught


def test_a_worker_error_is_the_users_code_with_the_workers_traceback():
    root = ZeroDivisionError("division by zero")
    failure = classify(raised(WorkerGroupError("rank 0: Traceback ...\n  loop.py line 3\nZeroDivisionError", {0: root, 1: KeyError("x")})))
    assert failure.cause is FailureCause.USER_CODE
    assert failure.message == "ZeroDivisionError: division by zero"
    assert "loop.py line 3" in failure.traceback


def test_a_worker_group_that_never_starts_is_no_resources():
    timeout = RuntimeError("The worker group startup timed out after 30.0 seconds waiting for 8 workers.")
    failure = classify(raised(ControllerError(timeout)))
    assert failure.cause is FailureCause.NO_RESOURCES
    assert "lower scaling.num_workers" in failure.message


def test_code_that_cannot_load_is_the_users_and_anything_else_infrastructure():
    assert classify(raised(ModuleNotFoundError("No module named 'userpkg'"))).cause is FailureCause.USER_CODE
    assert classify(raised(AttributeError("entrypoint 'a:b': module 'a' has no function 'b'"))).cause is FailureCause.USER_CODE
    other = classify(raised(ControllerError(ConnectionError("GCS unreachable"))))
    assert other.cause is FailureCause.INFRASTRUCTURE
    assert other.message.startswith("ControllerError: ") and "GCS unreachable" in other.message


def test_a_huge_failure_still_makes_a_valid_error_event():
    failure = classify(raised(ValueError("x" * 200_000)))
    assert len(failure.message) == MESSAGE_CHARS and len(failure.traceback) == TRACEBACK_TAIL_CHARS
    event = ErrorEvent(type="error", seq=0, cause=failure.cause.value, message=failure.message, traceback=failure.traceback)
    assert parse_event(event.model_dump(mode="json")) == event
