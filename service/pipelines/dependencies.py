"""A job's dependencies as the server keeps them: the (job id, wanted status) pairs it
waits for, read from its stored spec (``after``, and ``init_from``'s job, which counts as
``after`` with SUCCEEDED unless ``after`` names it otherwise); checked at submit (each a
job of the job's own project) and said in words."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.errors import InvalidSpec
from api.schemas import JobSpec
from api.schemas.pipelines import STEP_LABEL
from service.db.models import JobRow

WAITS = {"SUCCEEDED": "to succeed", "FAILED": "to fail", "ENDED": "to end"}


def effective(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """(job id, wanted status) of each job a stored spec runs after, in order, each once."""
    out: dict[str, str] = {}
    for item in spec.get("after") or []:
        if isinstance(item, dict) and item.get("job"):
            out.setdefault(str(item["job"]), str(item.get("status") or "SUCCEEDED"))
    init = spec.get("init_from")
    if isinstance(init, dict) and init.get("job"):
        out.setdefault(str(init["job"]), "SUCCEEDED")
    return list(out.items())


def waits(spec: JobSpec) -> bool:
    return bool(spec.after) or spec.init_from is not None


def check(s: Session, spec: JobSpec, project: str) -> dict[str, dict[str, Any] | None]:
    """Refuse (422) a dependency that names a step outside a pipeline, or a job that is not
    one of ``project``'s: a job runs only after jobs of its own project. A job of another
    project reads as a missing one, so a submit learns nothing of other projects. Returns the
    labels of the jobs named (their step names say them in the waiting reason)."""
    refs = [(f"after[{i}]", a) for i, a in enumerate(spec.after)]
    if spec.init_from is not None:
        refs.append(("init_from", spec.init_from))
    if not refs:
        return {}
    for where, ref in refs:
        if ref.step is not None:
            raise InvalidSpec(
                f"{where}.step {ref.step!r}: a step can be named only inside a pipeline (POST /v1/pipelines). "
                "Name the job by its id instead (`job: ID`).",
                code="step_outside_pipeline",
                details=[{"loc": [where, "step"], "msg": "only in a pipeline"}],
            )
    ids = {ref.job for _, ref in refs}
    rows = s.execute(select(JobRow.id, JobRow.project, JobRow.labels).where(JobRow.id.in_(ids))).all()
    found = {r.id: r.project for r in rows}
    for where, ref in refs:
        if found.get(ref.job) != project:
            raise InvalidSpec(
                f"{where}.job: there is no job {ref.job} in project {project!r}. A job runs only after jobs of its "
                "own project: name a job of this project (GET /v1/jobs), or submit this one to that job's project.",
                code="dependency_not_found",
                details=[{"loc": [where, "job"], "msg": "no such job in this project"}],
            )
    return {r.id: r.labels for r in rows}


def name(job_id: str, labels: dict[str, Any] | None) -> str:
    """How a reason names a dependency: its step (with its job), or its job."""
    step = (labels or {}).get(STEP_LABEL)
    return f"step {step!r} (job {job_id})" if step else f"job {job_id}"


def waiting_reason(deps: list[tuple[str, str]], labels: dict[str, dict[str, Any] | None]) -> str:
    said = ", ".join(f"{name(d, labels.get(d))} {WAITS.get(w, 'to end')}" for d, w in deps)
    return f"waiting for {said}"
