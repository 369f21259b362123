"""Waiting on a real system: poll a predicate until it returns something truthy."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float, what: str, poll: float = 0.25):
    """Return the predicate's first truthy value; fail saying what was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def run_to_end(job, timeout: float):
    """Wait for an SDK ``Job`` to end; one still running at the timeout (or when the wait
    fails) is cancelled, so a failing test leaves the cluster free. Returns the job."""
    try:
        wait_for(lambda: job.refresh().status.is_terminal(), timeout, f"job {job.id} to end")
    finally:
        if not job.refresh().status.is_terminal():
            job.cancel()
    return job
