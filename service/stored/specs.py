"""A job's stored spec read back as the contract's typed model.

The store keeps the JSON a spec's model dumped at submit. Every read of it on the server
goes through here, so a fact of the contract (a search's time axis, its metric and mode,
its budget) is derived once, by ``TrainSpec``/``TuneSpec``, and never again from raw keys.
"""

from __future__ import annotations

from typing import Any

from api.schemas import JobSpec, TuneSpec, parse_job_spec


def stored_spec(spec: dict[str, Any]) -> JobSpec:
    """A job's spec as stored (raises pydantic's ``ValidationError``, a ``ValueError``,
    if it no longer validates)."""
    return parse_job_spec(spec)


def stored_search(spec: dict[str, Any]) -> TuneSpec:
    """A search's spec as stored; ``ValueError`` when the spec is not a search's."""
    parsed = parse_job_spec(spec)
    if not isinstance(parsed, TuneSpec):
        raise ValueError(f"a {parsed.kind} job's spec is not a search's")
    return parsed
