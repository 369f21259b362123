"""A search's best trial replayed as one training job: the values its weights were
trained with, interval by interval, read from the PBT lineage.

A PBT trial's weights have a history across trials: when trial B clones donor D at
D's epoch T, B's weights up to T are D's, trained with D's values (themselves perhaps
cloned earlier), and from T on B's, with B's new values. ``segments`` walks that back
from the best trial; ``replay_spec`` turns it into a ``kind: train`` spec whose
``schedule`` sets the optimizer values at each interval's start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.errors import Conflict
from api.schemas import TrainSpec, TuneSpec, apply_values
from api.schemas.schedule import SCHEDULABLE, HyperparameterSchedule


@dataclass(frozen=True)
class Exploit:
    key: tuple[int, int]  # (attempt, seq): the order of the search's decisions
    trial_id: str
    donor_trial_id: str
    donor_time: float
    old_config: dict[str, Any]
    new_config: dict[str, Any]


def segments(
    trial_id: str, exploits: list[Exploit], configs: dict[str, dict], before: tuple[int, int] | None = None
) -> list[tuple[int, dict]]:
    """``(from_time, values)`` of the weights ``trial_id`` held just before decision
    ``before`` (None: at the end), in increasing time."""
    own = [e for e in exploits if e.trial_id == trial_id and (before is None or e.key < before)]
    if not own:
        first = next((e for e in exploits if e.trial_id == trial_id), None)
        return [(0, dict(first.old_config if first else configs.get(trial_id, {})))]
    last = max(own, key=lambda e: e.key)
    at = int(last.donor_time)
    head = [s for s in segments(last.donor_trial_id, exploits, configs, last.key) if s[0] < at]
    return [*head, (at, dict(last.new_config))]


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
    spec = apply_values(search.base.model_dump(mode="json"), parts[0][1])
    spec.update(name=f"{search.name}-replay"[:128], epochs=search.budget.epochs, max_steps=search.budget.steps)
    if intervals:
        spec["schedule"] = HyperparameterSchedule(unit=search.unit, intervals=intervals).model_dump(mode="json")
    return TrainSpec.model_validate(spec)
