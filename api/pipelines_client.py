"""The SDK's pipelines (``Client`` has these methods):

p = client.submit_pipeline({"name": "pretrain-finetune", "steps": [
    {"name": "pretrain", "job": {"model": {"type": "mlp"}, "epochs": 2}},
    {"name": "finetune", "job": {"model": {"type": "mlp"}, "epochs": 3},
     "init_from": {"step": "pretrain", "checkpoint": "best"}},
]})
p = client.wait_pipeline(p.id)          # until every step ended
[(s.name, s.status) for s in p.steps]
client.cancel_pipeline(p.id); client.resume_pipeline(p.id)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from api.code_upload import with_uploaded_code
from api.schemas import JobStatus
from api.schemas.pipelines import PipelineList, PipelinePublic, PipelineSpec


class PipelinesClient:
    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...  # Client's

    def submit_pipeline(
        self, spec: PipelineSpec | dict[str, Any], *, base_dir: str | Path | None = None
    ) -> PipelinePublic:
        """Submit a pipeline: every step stored as a job at once, or none. A dict is validated
        locally first; a user-code step's ``working_dir`` is uploaded as ``submit`` does."""
        if isinstance(spec, dict):
            spec = PipelineSpec.model_validate(spec)
        steps = []
        for step in spec.steps:
            job, self.last_upload = with_uploaded_code(self, step.job, base_dir, None)
            steps.append(step.model_copy(update={"job": job}))
        body = spec.model_copy(update={"steps": steps}).model_dump(mode="json")
        for part in (body, *(s["job"] for s in body["steps"]), *((s["job"].get("base") or {}) for s in body["steps"])):
            if part.get("project", "") is None:
                del part["project"]  # unset: the server picks
        return PipelinePublic.model_validate(self.request("POST", "/v1/pipelines", json=body).json())

    def pipeline(self, pipeline_id: str) -> PipelinePublic:
        return PipelinePublic.model_validate(self.request("GET", f"/v1/pipelines/{pipeline_id}").json())

    def pipelines(self, *, limit: int = 100) -> list[PipelinePublic]:
        """The pipelines of this client's projects, newest first."""
        r = self.request("GET", "/v1/pipelines", params={"limit": limit})
        return PipelineList.model_validate(r.json()).items

    def cancel_pipeline(self, pipeline_id: str) -> PipelinePublic:
        """Cancel every step that has not ended."""
        return PipelinePublic.model_validate(self.request("POST", f"/v1/pipelines/{pipeline_id}/cancel").json())

    def resume_pipeline(self, pipeline_id: str) -> PipelinePublic:
        """Run the FAILED and CANCELLED steps again; SUCCEEDED ones are kept."""
        return PipelinePublic.model_validate(self.request("POST", f"/v1/pipelines/{pipeline_id}/resume").json())

    def wait_pipeline(self, pipeline_id: str, timeout: float = 600.0, poll_s: float = 1.0) -> PipelinePublic:
        """Poll until every step has ended; TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            p = self.pipeline(pipeline_id)
            if p.status != JobStatus.RUNNING:
                return p
            if time.monotonic() > deadline:
                raise TimeoutError(f"pipeline {pipeline_id} still running after {timeout:g}s: {p.steps}")
            time.sleep(poll_s)
