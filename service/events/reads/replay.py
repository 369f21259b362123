"""A search's best trial replayed as one training job: the values its weights were
trained with, interval by interval, read from the PBT lineage.

A PBT trial's weights have a history across trials: when trial B clones donor D at
D's epoch T, B's weights up to T are D's, trained with D's values (themselves perhaps
cloned earlier), and from T on B's, with B's new values. ``segments`` walks that back
from the best trial; ``replay_spec`` turns it into a ``kind: train`` spec whose
``schedule`` sets the optimizer values at each interval's start.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from api.errors import Conflict
from api.schemas import TrainSpec, TuneSpec, apply_values
from api.schemas.schedule import MAX_INTERVALS, SCHEDULABLE, HyperparameterSchedule


@dataclass(frozen=True)
class Exploit:
    key: tuple[int, int]  # (attempt, seq): the order of the search's decisions
    trial_id: str
    donor_trial_id: str
    donor_time: float
    old_config: dict[str, Any]
    new_config: dict[str, Any]


MAX_LINEAGE = MAX_INTERVALS  # clones walked back from one trial: a schedule holds no more intervals


def segments(
    trial_id: str, exploits: list[Exploit], configs: dict[str, dict], before: tuple[int, int] | None = None
) -> list[tuple[int, dict]]:
    """``(from_time, values)`` of the weights ``trial_id`` held just before decision
    ``before`` (None: at the end), in increasing time.

    Walked back clone by clone, without recursion: each step is the trial's last clone
    before the decision, and what its donor held before that clone counts only up to the
    clone's time (and every later clone's time). A lineage of more than ``MAX_LINEAGE``
    clones is refused (409 ``lineage_too_deep``)."""
    by_trial: dict[str, list[Exploit]] = {}
    for e in exploits:
        by_trial.setdefault(e.trial_id, []).append(e)
    firsts = {t: own[0] for t, own in by_trial.items()}  # the trial's values before its first clone
    for own in by_trial.values():
        own.sort(key=lambda e: e.key)
    keys = {t: [e.key for e in own] for t, own in by_trial.items()}
    backwards: list[tuple[int, dict]] = []
    until = math.inf  # a segment counts only if it starts before every later clone's time
    for _ in range(MAX_LINEAGE + 1):
        own = by_trial.get(trial_id, [])
        n = len(own) if before is None else bisect.bisect_left(keys.get(trial_id, []), before)
        if n == 0:
            first = firsts.get(trial_id)
            if 0 < until:
                backwards.append((0, dict(first.old_config if first else configs.get(trial_id, {}))))
            return backwards[::-1]
        last = own[n - 1]
        at = int(last.donor_time)
        if at < until:
            backwards.append((at, dict(last.new_config)))
        until = min(until, at)
        trial_id, before = last.donor_trial_id, last.key
    raise Conflict(
        f"This trial's weights go back through more than {MAX_LINEAGE} clones; a replay schedules at most "
        f"{MAX_INTERVALS} intervals. Read its lineage (GET /v1/jobs/{{id}}/lineage) instead.",
        code="lineage_too_deep",
    )


def replay_spec(search: TuneSpec, best_trial: str, exploits: list[Exploit], configs: dict[str, dict]) -> TrainSpec:
    """The best trial as a training job: the base spec with its first values, the
    search's budget, and a schedule of the optimizer values it trained with."""
    if search.base.is_user_code or search.unit not in ("epoch", "step"):
        raise Conflict(
            "A replay schedules the built-in loops' optimizer values; this search runs user code, "
            "whose loop reads its values from `config`. Use its lineage (GET /v1/jobs/{id}/lineage) instead.",
            code="not_replayable",
        )
    parts = segments(best_trial, exploits, configs)
    fixed = {p for p in search.search_space if p not in SCHEDULABLE}
    for at, values in parts[1:]:
        changed = sorted(p for p in fixed if values.get(p) != parts[0][1].get(p))
        if changed:
            raise Conflict(
                f"The best trial's {changed[0]} changed at {search.unit} {at}; a replay schedules only "
                f"{', '.join(SCHEDULABLE)}. Search {changed[0]} without PBT, or mutate only optimizer values "
                "(pbt.hyperparam_mutations).",
                code="not_replayable",
            )
    intervals: list[dict[str, Any]] = []
    for at, values in parts:
        scheduled = {p: float(v) for p, v in values.items() if p in SCHEDULABLE}
        if scheduled and (not intervals or intervals[-1]["values"] != scheduled):
            intervals.append({"at": at, "values": scheduled})
    try:
        spec = apply_values(search.base.model_dump(mode="json"), parts[0][1])
        spec.update(name=f"{search.name}-replay"[:128], epochs=search.budget.epochs, max_steps=search.budget.steps)
        if intervals:
            spec["schedule"] = HyperparameterSchedule(unit=search.unit, intervals=intervals).model_dump(mode="json")
        return TrainSpec.model_validate(spec)
    except (ValidationError, ValueError) as exc:  # what the search's events stored, not what the caller sent
        first = exc.errors(include_url=False)[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise Conflict(
            f"The lineage this search stored does not make a training spec ({first[:300]}). "
            "Read it at GET /v1/jobs/{id}/lineage instead.",
            code="not_replayable",
        ) from None
