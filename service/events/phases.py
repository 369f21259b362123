"""A job's start-up phases as its events bring them in (the stored shape is
``service/stored/phases.py``; where each phase is marked, ``trainers/phases.py``).

A job may set only its own phases (``JOB_PHASES``: driver_started, workers_placed,
process_group_ready, first_step) and only in its current attempt (ingest takes events of
the running attempt alone); each once (the first to arrive counts: both channels carry
every event, so a repeat is no fault), under its own sequence number, and at a time
between its attempt's queueing and now, give or take the clock drift between a node and
the server. ``first_metric`` is the server's: when it stored the attempt's first report.
"""

from __future__ import annotations

import time

from api.schemas.events import JOB_PHASES, PHASE_NAMES, PhaseEvent
from service.db.models import JobRow
from service.events.limits import Dropped
from service.stored import phases

BEHIND_S = 2.0  # a node's clock may run this far behind the server's
AHEAD_S = 60.0  # ... or this far ahead


def take(job: JobRow, event: PhaseEvent, now: float | None = None) -> None:
    """Store a phase the job marked; raises ``Dropped`` for one it may not set."""
    if event.phase not in JOB_PHASES:
        raise Dropped(f"phase {event.phase!r} is the server's to mark; a job marks {', '.join(JOB_PHASES)}")
    if event.seq != PHASE_NAMES.index(event.phase):
        raise Dropped(
            f"phase {event.phase!r} came with seq {event.seq}, not its place {PHASE_NAMES.index(event.phase)}"
        )
    origin = phases.origin(job.start_phases)
    if origin is None:
        return  # a job queued before phases were recorded: nothing to count from
    now = time.time() if now is None else now
    if not origin - BEHIND_S <= event.ts <= now + AHEAD_S:
        raise Dropped(
            f"phase {event.phase!r} at {event.ts:.3f} is outside this attempt (queued at {origin:.3f}, now {now:.3f})"
        )
    stored = phases.added(job.start_phases, event.phase, max(event.ts, origin))
    if stored is not None:
        job.start_phases = stored


def first_metric(job: JobRow) -> None:
    """The attempt's first report is stored now (the caller knows it is the first)."""
    stored = phases.added(job.start_phases, "first_metric") if job.start_phases else None
    if stored is not None:
        job.start_phases = stored
