"""The stored shape of a job's start-up phases (``jobs.start_phases``): the latest
attempt's phases, ``{phase: Unix time}``. Moving a job to QUEUED (its POST, a resume)
starts them afresh with ``queued``; the server adds ``admitted``, ``submitted`` and
``first_metric`` itself, and takes the job's own marks as phase events
(``service/events/ingest.py``). Each phase is stored once per attempt: the first
time it is reached counts."""

from __future__ import annotations

import time
from typing import Any


def fresh(now: float | None = None) -> dict[str, float]:
    """The phases of an attempt just queued."""
    return {"queued": time.time() if now is None else now}


def origin(stored: dict[str, Any] | None) -> float | None:
    """When the attempt was queued: what its phases count from."""
    at = (stored or {}).get("queued")
    return float(at) if isinstance(at, (int, float)) else None


def added(stored: dict[str, Any] | None, name: str, ts: float | None = None) -> dict[str, float] | None:
    """The phases with ``name`` reached at ``ts`` (now when None), as a new dict (so the
    ORM sees the change); None when the attempt already has it."""
    stored = stored or {}
    if name in stored:
        return None
    return {**stored, name: time.time() if ts is None else ts}
