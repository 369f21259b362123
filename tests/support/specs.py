"""A user-code job spec over the fixtures' ``usercode`` folder (``tests/fixtures``)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def user_spec(entrypoint: str, **overrides) -> dict:
    spec = {
        "name": "user-code",
        "entrypoint": entrypoint,
        "working_dir": str(FIXTURES / "usercode"),
        "config": {},
        "scaling": {"num_workers": 2},
    }
    spec.update(overrides)
    return spec
