"""Failure classification (trainers.failures): real exceptions, as a run raises them,
mapped to the cause, message and traceback the server records."""

from __future__ import annotations

from ray.train import ControllerError, WorkerGroupError

from api.schemas import ErrorEvent, FailureCause, parse_event
from trainers.failures import MESSAGE_CHARS, TRACEBACK_TAIL_CHARS, TrialFailed, classify, readable


def raised(exc: BaseException) -> BaseException:
    """``exc`` with a traceback, as ``fit()`` hands it over."""
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return caught


def test_a_worker_error_is_the_users_code_with_the_workers_traceback():
    root = ZeroDivisionError("division by zero")
    failure = classify(
        raised(
            WorkerGroupError("rank 0: Traceback ...\n  loop.py line 3\nZeroDivisionError", {0: root, 1: KeyError("x")})
        )
    )
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
    assert (
        classify(raised(AttributeError("entrypoint 'a:b': module 'a' has no function 'b'"))).cause
        is FailureCause.USER_CODE
    )
    other = classify(raised(ControllerError(ConnectionError("GCS unreachable"))))
    assert other.cause is FailureCause.INFRASTRUCTURE
    # The root exception first, not the wrapper's "Training failed due to controller error:".
    assert other.message == "ConnectionError: GCS unreachable"
    assert "ControllerError" in other.traceback


def test_a_huge_failure_still_makes_a_valid_error_event():
    failure = classify(raised(ValueError("x" * 200_000)))
    assert len(failure.message) == MESSAGE_CHARS and len(failure.traceback) == TRACEBACK_TAIL_CHARS
    event = ErrorEvent(
        type="error", seq=0, cause=failure.cause.value, message=failure.message, traceback=failure.traceback
    )
    assert parse_event(event.model_dump(mode="json")) == event


# What a search trial's error file held before: Tune's and Ray's frames around the
# user's, in colour, the user's exception at the very end.
TUNE_ERROR_TEXT = """\x1b[36mray::ImplicitFunc.train()\x1b[39m (pid=4242, ip=127.0.0.1, actor_id=ab, repr=run_trial)
  File "/venv/lib/python3.11/site-packages/ray/tune/trainable/trainable.py", line 331, in train
    raise skipped from exception_cause(skipped)
  File "/venv/lib/python3.11/site-packages/ray/air/_internal/util.py", line 107, in run
    self._ret = self._target(*self._args, **self._kwargs)
Traceback (most recent call last):
  File "/srv/jobs/code/userpkg/model.py", line 12, in forward
    return self.layer(x) / scale
  File "/srv/jobs/code/userpkg/loop.py", line 40, in train
    loss = model(batch)
ZeroDivisionError: \x1b[31mdivision by zero\x1b[0m
"""


def test_a_traceback_reads_user_frames_first_without_colour():
    text = readable(TUNE_ERROR_TEXT)
    assert "\x1b" not in text
    assert text.startswith('Your code (most recent call last):\n  File "/srv/jobs/code/userpkg/model.py", line 12')
    assert text.index("userpkg/loop.py") < text.index("Ray and raydock") < text.index("ray/tune/trainable/trainable.py")
    assert text.rstrip().endswith("ZeroDivisionError: division by zero")


def test_a_trial_failure_survives_ray_and_tune_wrapping_it():
    import pickle

    from ray.exceptions import RayTaskError

    trial = TrialFailed(
        "USER_CODE", "ValueError: learning rate 5 is out of range", "Your code (most recent call last): ..."
    )
    wrapped = RayTaskError("ImplicitFunc.train", TUNE_ERROR_TEXT, pickle.loads(pickle.dumps(trial)))
    failure = classify(raised(wrapped))
    assert failure.cause is FailureCause.USER_CODE
    assert failure.message == "ValueError: learning rate 5 is out of range"
    assert failure.traceback.startswith("Your code")
