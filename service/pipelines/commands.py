"""The pipeline commands and reads for a caller: submit (the graph and every step's job
checked first, then every step stored as a job in one transaction: all or none), read and
list (each step's status), cancel (every step not ended) and resume (the steps that failed
or were stopped run again, the succeeded ones are kept). A pipeline belongs to a project
and reads and changes like that project's jobs: a caller outside it finds no such
pipeline (404), a viewer reads it but may not change it (403)."""

from __future__ import annotations

import uuid
from typing import Callable, Protocol

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from api.errors import Conflict, InvalidSpec, NotFound
from api.schemas import CancelledJobs, JobPublic, JobSpec, JobStatus, parse_job_spec
from api.schemas.dependencies import After, InitFrom
from api.schemas.pipelines import (
    PIPELINE_LABEL,
    STEP_LABEL,
    PipelineList,
    PipelinePublic,
    PipelineSpec,
    PipelineStep,
    PipelineStepPublic,
)
from service import lifecycle
from service.db.models import JobRow, utcnow
from service.db.pipeline_models import PipelineRow
from service.eventlog.log import record
from service.pipelines import dependencies, graph
from service.settings.scheduling import SchedulingSettings
from service.tenancy.caller import Caller

MAX_LISTED = 1000
_ENDED = {s.value for s in JobStatus if s.is_terminal()}


class JobPort(Protocol):
    """What pipelines ask of the job commands (service/jobs.py), handed in by the composition root."""

    on_submit: Callable[[], None]

    def validate(self, spec: JobSpec, project: str) -> None: ...

    def insert(
        self, s: Session, spec: JobSpec, *, actor: str, project: str, user_id: int | None, pipeline_id: str | None
    ) -> JobPublic: ...

    def cancel_many(self, job_ids: list[str], *, actor: str) -> CancelledJobs: ...

    def resume(self, job_id: str, *, actor: str) -> JobPublic: ...


def pipeline_not_found(pipeline_id: str) -> NotFound:
    return NotFound(f"No pipeline {pipeline_id!r}. List pipelines with GET /v1/pipelines.", code="pipeline_not_found")


def overall(statuses: list[str]) -> JobStatus:
    """The pipeline's status from its steps'."""
    if any(s not in _ENDED for s in statuses):
        return JobStatus.RUNNING
    if all(s == JobStatus.SUCCEEDED.value for s in statuses):
        return JobStatus.SUCCEEDED
    return JobStatus.FAILED if JobStatus.FAILED.value in statuses else JobStatus.CANCELLED


class Pipelines:
    def __init__(self, sessions: sessionmaker, jobs: JobPort, settings: SchedulingSettings) -> None:
        self.sessions = sessions
        self.jobs = jobs
        self.settings = settings

    # ------------------------------------------------------------------ submit

    def submit(self, spec: PipelineSpec, caller: Caller, project: str) -> PipelinePublic:
        """Store the pipeline in ``project`` (the route decided the caller may submit there)."""
        ordered = graph.check(spec, project, self.settings.max_pipeline_steps)  # 422s before anything is stored
        pipeline_id = "p" + uuid.uuid4().hex[:11]
        for i, step in enumerate(spec.steps):
            self.jobs.validate(self._job(spec, step, i, pipeline_id, project, {}, check=True), project)
        with self.sessions.begin() as s:
            ids: dict[str, str] = {}
            for step in ordered:  # each after the steps it names: their ids are known
                job = self._job(spec, step, spec.steps.index(step), pipeline_id, project, ids)
                made = self.jobs.insert(
                    s, job, actor=caller.name, project=project, user_id=caller.user_id, pipeline_id=pipeline_id
                )
                ids[step.name] = made.id
            row = PipelineRow(
                id=pipeline_id,
                name=spec.name,
                project=project,
                owner=caller.name,
                owner_id=caller.user_id,
                labels=spec.labels,
                steps=[{"name": st.name, "job_id": ids[st.name]} for st in spec.steps],
                created_at=utcnow(),
            )
            s.add(row)
            record(s, "pipeline_submitted", actor=caller.name, pipeline=pipeline_id, name=spec.name, project=project)
        self.jobs.on_submit()
        return self.get(pipeline_id, caller)

    def _job(self, spec: PipelineSpec, step: PipelineStep, i: int, pipeline_id: str, project: str, ids, check=False):
        """The step's job spec as stored: the pipeline's project and labels, its dependencies
        by job id (a step not stored yet, while only checking: left out)."""

        def job_of(ref) -> str | None:
            return ref.job if ref.step is None else ids.get(ref.step)

        after = [After(job=j, status=a.status) for a in step.after if (j := job_of(a)) is not None]
        init = step.init_from
        init_from = None
        if init is not None and (j := job_of(init)) is not None:
            init_from = InitFrom(job=j, checkpoint=init.checkpoint)
        labels = {**spec.labels, **step.job.labels, PIPELINE_LABEL: pipeline_id, STEP_LABEL: step.name}
        data = step.job.model_dump(mode="json", exclude_unset=True)
        data.update(labels=labels, project=project, kind=step.job.kind)
        if not check:
            data["after"] = [a.model_dump(mode="json", exclude_none=True) for a in after]
            if init_from is not None:
                data["init_from"] = init_from.model_dump(mode="json", exclude_none=True)
        try:
            return parse_job_spec(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidSpec(
                f"steps[{i}] ({step.name}).job: {first['msg']} at {'.'.join(map(str, first['loc']))} (the step's job "
                f"carries the pipeline's labels and {PIPELINE_LABEL}, {STEP_LABEL}: keep labels within the bound).",
                code="invalid_step",
                details=[{"loc": ["steps", i, "job", *first["loc"]], "msg": first["msg"]}],
            ) from None

    # ------------------------------------------------------------------ reads

    def get(self, pipeline_id: str, caller: Caller) -> PipelinePublic:
        with self.sessions() as s:
            return self._public(s, self._readable(s, pipeline_id, caller))

    def list(self, caller: Caller, *, limit: int = 100) -> PipelineList:
        """The pipelines of the caller's projects, newest first."""
        q = select(PipelineRow).order_by(PipelineRow.created_at.desc(), PipelineRow.id).limit(min(limit, MAX_LISTED))
        if caller.projects is not None:
            q = q.where(PipelineRow.project.in_(caller.projects))
        with self.sessions() as s:
            return PipelineList(items=[self._public(s, r) for r in s.scalars(q)])

    def _public(self, s: Session, row: PipelineRow) -> PipelinePublic:
        ids = [st["job_id"] for st in row.steps]
        jobs = {j.id: j for j in s.scalars(select(JobRow).where(JobRow.id.in_(ids)))}
        step_of = {st["job_id"]: st["name"] for st in row.steps}
        steps = []
        for st in row.steps:
            job = jobs.get(st["job_id"])
            if job is None:
                continue  # deleted since
            spec = job.spec or {}

            def named(ref: dict) -> dict:
                j = ref.get("job")
                kept = {k: v for k, v in ref.items() if v is not None and k not in ("job", "step")}
                return {"step": step_of[j], **kept} if j in step_of else {"job": j, **kept}

            steps.append(
                PipelineStepPublic(
                    name=st["name"],
                    job_id=job.id,
                    status=JobStatus(job.status),
                    status_reason=job.status_reason,
                    after=[named(a) for a in spec.get("after") or []],
                    init_from=named(spec["init_from"]) if spec.get("init_from") else None,
                    started_at=job.started_at,
                    finished_at=job.finished_at,
                )
            )
        return PipelinePublic(
            id=row.id,
            name=row.name,
            project=row.project,
            labels=row.labels or {},
            created_at=row.created_at,
            status=overall([st.status.value for st in steps]),
            steps=steps,
        )

    # ------------------------------------------------------------------ control

    def cancel(self, pipeline_id: str, caller: Caller) -> PipelinePublic:
        """Cancel every step that has not ended (waiting and queued ones at once, started
        ones through CANCELLING, as a job's cancel)."""
        with self.sessions.begin() as s:
            row = self._writable(s, pipeline_id, caller)
            ids = [st["job_id"] for st in row.steps]
            live = list(s.scalars(select(JobRow.id).where(JobRow.id.in_(ids), JobRow.status.not_in(_ENDED))))
            record(s, "pipeline_cancelled", actor=caller.name, pipeline=pipeline_id, project=row.project)
        if live:
            self.jobs.cancel_many(live, actor=caller.name)
        return self.get(pipeline_id, caller)

    def resume(self, pipeline_id: str, caller: Caller) -> PipelinePublic:
        """Run again every step that FAILED or was CANCELLED: one that runs after another step
        WAITs for it again, the others join the queue (from their last checkpoint, as a
        job's resume); SUCCEEDED steps are kept, and their outputs used again."""
        with self.sessions.begin() as s:
            row = self._writable(s, pipeline_id, caller)
            ids = [st["job_id"] for st in row.steps]
            jobs = {j.id: j for j in s.scalars(select(JobRow).where(JobRow.id.in_(ids)))}
            ended = (JobStatus.FAILED.value, JobStatus.CANCELLED.value)
            again = sorted((j for j in jobs.values() if j.status in ended), key=lambda j: j.id)  # locks in id order
            if not again:
                raise Conflict(
                    f"Pipeline {pipeline_id} has no FAILED or CANCELLED step to run again.",
                    code="pipeline_not_resumable",
                )
            fresh = {"events_token_hash": None, "submission_id": None, "queue_position": None}
            for job in again:
                deps = dependencies.effective(job.spec or {})
                if not deps:
                    continue  # resumed below, as a job is
                labels = {d: jobs[d].labels if d in jobs else None for d, _ in deps}
                reason = "resumed: " + dependencies.waiting_reason(deps, labels)
                lifecycle.transition(s, job, JobStatus.WAITING, reason=reason, also=fresh, actor=caller.name)
            first = [j.id for j in again if not dependencies.effective(j.spec or {})]
            record(s, "pipeline_resumed", actor=caller.name, pipeline=pipeline_id, project=row.project)
        for job_id in first:
            self.jobs.resume(job_id, actor=caller.name)
        self.jobs.on_submit()
        return self.get(pipeline_id, caller)

    def _readable(self, s: Session, pipeline_id: str, caller: Caller) -> PipelineRow:
        row = s.get(PipelineRow, pipeline_id)
        if row is None or not caller.can_read(row.project):
            raise pipeline_not_found(pipeline_id)  # another project's reads exactly as a missing one
        return row

    def _writable(self, s: Session, pipeline_id: str, caller: Caller) -> PipelineRow:
        row = self._readable(s, pipeline_id, caller)
        caller.require_write(row.project, "pipelines")
        return row
