"""The SDK's schedules (``Client`` has these methods):

s = client.create_schedule({"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin",
                            "job": {"name": "retrain", "model": {"type": "mlp"}, "epochs": 5}})
s.next_runs                          # the next firing times
client.pause_schedule(s.id); client.resume_schedule(s.id)
client.list(labels={SCHEDULE_LABEL: s.id})   # the jobs it submitted
client.delete_schedule(s.id)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from api.code_upload import with_uploaded_code
from api.schemas.schedules import ScheduleList, SchedulePatch, SchedulePublic, ScheduleSpec


class SchedulesClient:
    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...  # Client's

    def create_schedule(
        self, spec: ScheduleSpec | dict[str, Any], *, base_dir: str | Path | None = None
    ) -> SchedulePublic:
        """Create a schedule. A dict is validated locally first; a user-code job's
        ``working_dir`` is uploaded once, as ``submit`` does, and every firing runs that package."""
        if isinstance(spec, dict):
            spec = ScheduleSpec.model_validate(spec)
        job, self.last_upload = with_uploaded_code(self, spec.job, base_dir, None)
        body = spec.model_copy(update={"job": job}).model_dump(mode="json")
        for part in (body, body["job"], body["job"].get("base") or {}):
            if part.get("project", "") is None:
                del part["project"]  # unset: the server picks
        return SchedulePublic.model_validate(self.request("POST", "/v1/schedules", json=body).json())

    def schedules(self, *, limit: int = 100, next_runs: int = 3) -> list[SchedulePublic]:
        """The schedules of this client's projects, newest first, with their next firing times."""
        r = self.request("GET", "/v1/schedules", params={"limit": limit, "next_runs": next_runs})
        return ScheduleList.model_validate(r.json()).items

    def schedule(self, schedule_id: str, *, next_runs: int = 3) -> SchedulePublic:
        r = self.request("GET", f"/v1/schedules/{schedule_id}", params={"next_runs": next_runs})
        return SchedulePublic.model_validate(r.json())

    def pause_schedule(self, schedule_id: str) -> SchedulePublic:
        return self._patch(schedule_id, SchedulePatch(paused=True))

    def resume_schedule(self, schedule_id: str) -> SchedulePublic:
        """Fire again from the next tick on (ticks that passed while paused are not run)."""
        return self._patch(schedule_id, SchedulePatch(paused=False))

    def delete_schedule(self, schedule_id: str) -> None:
        """The schedule goes; the jobs it submitted stay."""
        self.request("DELETE", f"/v1/schedules/{schedule_id}")

    def _patch(self, schedule_id: str, patch: SchedulePatch) -> SchedulePublic:
        r = self.request("PATCH", f"/v1/schedules/{schedule_id}", json=patch.model_dump(mode="json"))
        return SchedulePublic.model_validate(r.json())
