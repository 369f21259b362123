"""What every job's ``start_phases`` must look like: the phases it reached, named in
their order, each at or after the one before it (seconds after the attempt's queueing)."""

from __future__ import annotations

from api.schemas.events import PHASE_NAMES

SERVER_SIDE = ("queued", "admitted", "submitted")


def assert_phases(phases: dict[str, float] | None, *expected: str) -> None:
    assert phases, "the job has no start_phases"
    names = list(phases)
    assert names == [p for p in PHASE_NAMES if p in phases], names  # in the phases' order
    assert {*SERVER_SIDE, *expected} <= set(names), (expected, phases)
    values = list(phases.values())
    assert values[0] == 0.0 and all(a <= b for a, b in zip(values, values[1:])), phases
