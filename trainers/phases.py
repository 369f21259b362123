"""Start-up phases of a job: where its seconds between POST and the first metric go.

``PHASES`` are the phases in the order they happen; ``GET /v1/jobs/{id}`` returns the
latest attempt's as ``start_phases`` (seconds after the attempt was queued: the POST,
or the requeue of a retry). Where each is marked:

==================== ======================================================= ==========
phase                when                                                    marked by
==================== ======================================================= ==========
queued               the attempt entered the queue (POST, retry, resume)     server
admitted             admission found it room                                 server
submitted            its Ray job was submitted                               server
driver_started       the job's driver process started (its start time, so    driver
                     the driver's own imports count after it)
workers_placed       the Train worker actors are up on their nodes           controller
process_group_ready  the torch process group is initialised on every rank    controller
first_step           rank 0 finished its first training step (the built-in   rank 0
                     loops; user code may mark it, else its first report)
first_metric         the server stored the attempt's first metric            server
==================== ======================================================= ==========

How a mark travels: :func:`mark` builds a typed ``PhaseEvent`` (``api.schemas``) with
the time it happened and sends it as every event of the job goes (``trainers.events``).
A process that holds the job's events channel (the driver; the Train controller,
whose callbacks carry it there) calls :func:`bind` once, and its marks are also pushed
over HTTP at once. Any other process of the job (a Train worker, a forked rank) writes
the event line to its stdout: Ray forwards worker output to the driver's log, which
the server reads for events anyway, so the mark arrives a second or so later with the
time it happened. The server accepts the job-side phases only (``JOB_PHASES``), each
once per attempt, at a time between the attempt's queueing and now.

Only rank 0 marks (``RANK`` unset or ``0``): every rank reaching its first step is
the same phase. A phase is marked once per process; a second ``mark`` of it is a no-op.
This module imports neither torch nor ray: a process may mark before it imports them.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from api.schemas.events import JOB_PHASES, PHASE_NAMES, PhaseEvent, event_line
from trainers.launch import EventsChannel

PHASES: tuple[str, ...] = PHASE_NAMES

_lock = threading.Lock()
_marked: set[str] = set()
_channel: tuple[int, EventsChannel] | None = None  # (pid that bound it, channel)
_trial: str | None = None  # the search trial this process's marks belong to


def bind(channel: EventsChannel) -> None:
    """Push this process's marks through ``channel`` as well as the log. Bound per
    process: a child forked after ``bind`` writes to the log only (the pusher thread
    does not survive a fork)."""
    global _channel
    _channel = (os.getpid(), channel)


def for_trial(trial_id: str) -> None:
    """This process is a Train worker of search trial ``trial_id``: its marks name the
    trial (each trial's start-up, and each restart after an exploit, is its own)."""
    global _trial
    with _lock:
        _trial = trial_id
        _marked.clear()


def mark(name: str, ts: float | None = None) -> None:
    """Record that this job reached start-up phase ``name`` at ``ts`` (Unix time; now
    when None). Callable from any process of a job; a no-op on ranks other than 0 and
    for a phase this process already marked. Raises ``ValueError`` for a name that is
    not a job-side phase (the server marks ``queued``, ``admitted``, ``submitted`` and
    ``first_metric`` itself)."""
    if name not in JOB_PHASES:
        raise ValueError(f"{name!r} is not a phase a job marks; one of {', '.join(JOB_PHASES)}")
    if os.environ.get("RANK", "0") != "0":
        return
    with _lock:
        if name in _marked:
            return
        _marked.add(name)
    ts = time.time() if ts is None else ts
    event = PhaseEvent(type="phase", seq=PHASES.index(name), phase=name, ts=ts, trial_id=_trial)
    bound = _channel
    if bound is not None and bound[0] == os.getpid():
        from trainers import events  # the pusher: only where a channel is bound

        events.emit(event, bound[1])
    else:
        sys.stdout.write(event_line(event) + "\n")  # one write: no other thread's text inside the line
        sys.stdout.flush()


def process_started_at() -> float:
    """Unix time this process started (Linux: its start in /proc against the boot
    clock, to 10 ms), else now. The driver marks ``driver_started`` with it, so
    Python's start-up and the driver's imports count after the phase, not before."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start, clock ticks after boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(age, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()
