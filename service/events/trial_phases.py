"""A search trial's start-up phases, taken from the events its search already sends: the
trial's statuses and reports (the search driver), its Train worker groups (the trial's
Train controller) and its first step (rank 0 of the trial's Train workers).

Stored on the trial's row (``trials.phases``) as Unix times, in segments: ``start`` (the
trial's first start) and one per PBT exploit, which restarts the trial from its donor's
checkpoint (``exploits``, in decision order, the latest ``MAX_EXPLOITS``)::

    {"start": {"queued": t, "running": t, "placed": t, "first_step": t, "first_metric": t},
     "exploits": [{"at": t, "paused": t, "running": t, "placed": t, "first_step": t, "first_metric": t}]}

A mark goes to the segment its time falls in (the start, or the latest exploit decided
before it), and the earliest mark of a kind in a segment counts: the worker's first step
arrives through the log a second after the report it preceded, and events of the two
channels arrive in any order. ``public`` turns a row's segments into what the API answers:
seconds after the trial was queued, and after each exploit's decision.
"""

from __future__ import annotations

from typing import Any

from api.schemas.trials import ExploitPhases
from service.db.event_models import TrialRow

MAX_EXPLOITS = 100
START_MARKS = frozenset({"queued", "running", "placed", "first_step", "first_metric"})
EXPLOIT_MARKS = frozenset({"paused", "running", "placed", "first_step", "first_metric"})


def _segments(row: TrialRow) -> dict[str, Any]:
    stored = row.phases or {}
    return {"start": dict(stored.get("start") or {}), "exploits": [dict(e) for e in stored.get("exploits") or []]}


def note(row: TrialRow, mark: str, ts: float) -> None:
    """The trial reached ``mark`` at ``ts``; kept when it is the segment's earliest."""
    phases = _segments(row)
    later = [e for e in phases["exploits"] if e["at"] <= ts]
    segment = later[-1] if later else phases["start"]
    if mark not in (EXPLOIT_MARKS if later else START_MARKS):
        return  # a trial is queued once; it pauses only for an exploit
    if mark in segment and segment[mark] <= ts:
        return
    segment[mark] = ts
    row.phases = phases  # a new object: the JSON column is written when it changes


def status(row: TrialRow, value: str, ts: float) -> None:
    """A trial status event's marks: PENDING is queued at the start and paused after an exploit."""
    if value == "RUNNING":
        note(row, "running", ts)
    elif value in ("PENDING", "PAUSED"):
        note(row, "queued", ts)
        note(row, "paused", ts)


def exploited(row: TrialRow, ts: float) -> None:
    """PBT decided at ``ts`` that the trial clones a donor: a new segment. Marks already
    kept that come after it belong to it."""
    phases = _segments(row)
    if any(e["at"] == ts for e in phases["exploits"]):
        return
    before = [e for e in phases["exploits"] if e["at"] < ts]
    prior = before[-1] if before else phases["start"]
    moved = {k: v for k, v in prior.items() if k in EXPLOIT_MARKS and v >= ts}
    for k in moved:
        del prior[k]
    segment = {"at": ts, **moved}
    phases["exploits"] = sorted([*phases["exploits"], segment], key=lambda e: e["at"])[-MAX_EXPLOITS:]
    row.phases = phases


def _after(origin: float | None, ts: float | None) -> float | None:
    return None if origin is None or ts is None else round(max(ts - origin, 0.0), 3)


def public(row: TrialRow, function_trainable: bool) -> tuple[dict[str, float], list[ExploitPhases]]:
    """The start phases (seconds after queued) and each exploit's (seconds after its
    decision). A Train loop's trial is placed when its Train worker group is up; a
    function trainable's, when Tune started its process, and its first step is its
    first report (nothing inside it marks one)."""
    phases = _segments(row)

    def placed(seg: dict[str, Any]) -> float | None:
        return seg.get("running") if function_trainable else seg.get("placed")

    def first_step(seg: dict[str, Any]) -> float | None:
        return seg.get("first_metric") if function_trainable else seg.get("first_step")

    start = phases["start"]
    origin = start.get("queued")
    marks = {"queued": origin, "placed": placed(start), "first_step": first_step(start)}
    marks["first_metric"] = start.get("first_metric")
    start_phases = {k: v for k, v in ((k, _after(origin, t)) for k, t in marks.items()) if v is not None}
    exploits = [
        ExploitPhases(
            at=e["at"],
            paused=_after(e["at"], e.get("paused")),
            restored=_after(e["at"], placed(e)),
            first_step=_after(e["at"], first_step(e)),
            first_metric=_after(e["at"], e.get("first_metric")),
        )
        for e in phases["exploits"]
    ]
    return start_phases, exploits
