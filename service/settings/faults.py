"""Faults a test injects into the server process: ``RAYDOCK_TEST_FAULTS``, comma-separated.
``fail_after_submit`` raises once per job between the Ray submit and the database write;
``delay_after_submit=<s>`` waits there (so a cancel can land during a submit). Unset on
every real server."""

from __future__ import annotations

from pydantic import Field

from service.settings.section import Section


class FaultSettings(Section):
    test_faults: str = Field(default="", description="Test-only faults injected into the server (comma-separated).")

    @property
    def _named(self) -> dict[str, str]:
        return dict(f.partition("=")[::2] for f in self.test_faults.split(",") if f)

    @property
    def fail_after_submit(self) -> bool:
        return "fail_after_submit" in self._named

    @property
    def delay_after_submit(self) -> float:
        return float(self._named.get("delay_after_submit") or 0)
