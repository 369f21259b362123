"""Starting a job's attempt on Ray exactly once, and keeping Ray's jobs in step with ours.

An attempt is started in three steps, each safe to repeat after any crash or network
failure:

1. ``prepare``: the Ray submission id (``raydock-<job>-<attempt>-<nonce>``) is fixed and stored
   with the hash of a fresh events token, while the job stays QUEUED. The token, the
   submission id and the spec go into a launch file under the job's own storage prefix
   (0600); the driver is given only its URI, so neither sits in Ray's job list nor in the
   size-limited env, and deletes the file once read (``trainers.launch.take_launch``).
   Jobs can write that prefix, so the file is written without following a link planted
   there (``storage.write_private``), and its sha256 is stored and handed to the driver
   in its environment: a file rewritten since is refused, not run.
2. ``backend.submit`` with that id; a submit of an id Ray already has is recognised.
3. ``confirm``: the attempt counts (``attempt``, ``ray_job_id``, STARTING) in one
   compare-and-set. A job cancelled meanwhile is not started: its Ray job is stopped.

A failure between 2 and 3 leaves the job QUEUED with its submission id, and the next
pass submits the same id again, which Ray recognises. ``reconcile`` stops every Ray job
this store started whose raydock job is not active in that attempt (cancelled during
a submit, failed while the cluster was unreachable, deleted).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import sessionmaker

from api.cluster_contract import (
    LAUNCH_SHA256_ENV,
    LAUNCH_URI_ENV,
    PREEMPT_URI_ENV,
    SEARCH_STALL_ENV,
    WARM_IDLE_ENV,
)
from api.errors import ClusterUnavailable, Conflict, InvalidSpec
from api.schemas import CODE_REF_PREFIX, FailureCause, JobSpec, JobStatus, code_spec
from api.schemas.launch import LaunchFile
from service import lifecycle
from service.cluster.ray_backend import RayBackend
from service.code.packages import CodeStore, altered
from service.code.user_code import check_user_code
from service.db.leases import Fence
from service.db.models import JobRow
from service.eventlog.log import record
from service.events.tokens import new_events_token
from service.files import storage
from service.scheduling import rank_plan
from service.scheduling.elastic_grant import launched_spec
from service.scheduling.preemption import marker_uri
from service.settings import Settings
from service.stored import phases
from service.stored.specs import stored_spec

log = logging.getLogger("raydock.attempts")

ACTIVE = (
    JobStatus.STARTING.value,
    JobStatus.RUNNING.value,
    JobStatus.CANCELLING.value,
    JobStatus.PREEMPTED.value,
)


def submission_id(job_id: str, attempt: int) -> str:
    # Unique per preparation: an attempt number given back (a cancel during its submit)
    # must never make Ray recognise the stopped job as the new one.
    return f"raydock-{job_id}-{attempt}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Prepared:
    job_id: str
    kind: str
    attempt: int
    submission_id: str
    launch_uri: str
    runtime_env: dict
    previous: str | None  # the Ray job of the attempt before, stopped before this one starts
    # What the driver holds for the workers it runs as local ranks (service.scheduling.rank_plan); None: worker actors.
    resources: dict[str, float] | None = None


class Attempts:
    """``store_id``: this store's id, put on every Ray job it starts (``reconcile`` stops only its own)."""

    def __init__(self, settings: Settings, sessions: sessionmaker, backend: RayBackend, code: CodeStore, store_id: str):
        self.settings = settings
        self.sessions = sessions
        self.backend = backend
        self.code = code  # uploaded packages: where Ray fetches one, and its hash checked again
        self.store_id = store_id
        self.faults = self.settings.faults  # test-only (service/settings/faults.py)
        self._faulted: set[str] = set()

    # ------------------------------------------------------------------ start

    def start(self, job_id: str, fence: Fence | None = None) -> None:
        """Prepare, submit and confirm one attempt. Raises ClusterUnavailable when Ray
        did not answer (the job stays QUEUED with its submission id, to be retried), and
        LeaseLost when ``fence`` (the monitor's lease) is no longer held: nothing is admitted
        or counted then, and a Ray job already submitted carries the id the new holder submits."""
        prepared = self.prepare(job_id, fence)
        if prepared is None:
            return
        if prepared.previous:
            self.backend.stop(prepared.previous)  # one driver per job, whatever the last attempt left
        metadata = {"raydock_job": job_id, "raydock_attempt": str(prepared.attempt), "raydock_store": self.store_id}
        sent = time.time()  # the submitted phase: a driver may start before Ray's answer is back
        try:
            self.backend.submit(
                prepared.submission_id, prepared.kind, prepared.runtime_env, metadata, prepared.resources
            )
        except ClusterUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - Ray refused the job: say why, keep the record
            if "No available agent" in str(exc):
                return  # a head that just started has no job agent yet: the same id is submitted again
            self._fail_unstarted(
                job_id, FailureCause.INFRASTRUCTURE, f"{type(exc).__name__}: {exc}", "Ray refused the job", fence
            )
            return
        self._inject_faults(job_id)
        self.confirm(job_id, prepared.submission_id, prepared.attempt, sent, fence)

    def _inject_faults(self, job_id: str) -> None:
        if self.faults.delay_after_submit:
            time.sleep(self.faults.delay_after_submit)
        if self.faults.fail_after_submit and job_id not in self._faulted:
            self._faulted.add(job_id)
            raise RuntimeError(
                f"{self.faults.env_name('test_faults')}: injected failure after the Ray submit of {job_id}"
            )

    def prepare(self, job_id: str, fence: Fence | None = None) -> Prepared | None:
        """Fix the attempt's submission id and write its launch file; None when the job
        is no longer QUEUED. A job prepared before (a retry) keeps its id and file. With
        ``fence``, the admission commits only while the monitor's lease is held under it."""
        with self.sessions() as s:
            job = s.get(JobRow, job_id)
            if job is None or job.status != JobStatus.QUEUED.value:
                return None
            attempt, sid, kind = job.attempt + 1, job.submission_id, job.kind
            spec_json = launched_spec(job.spec, job.granted_workers)  # an elastic job's max as granted
            previous, launch_sha256 = job.ray_job_id, job.launch_sha256
            init_checkpoint = job.init_checkpoint  # resolved when its dependencies ended (service/pipelines/)
        prefix, name = (
            storage.job_prefix(self.settings.storage.resolved_storage_path, job_id),
            f"{storage.LAUNCH_DIR}/launch-{attempt}.json",
        )
        uri = storage.join(prefix, name)
        if sid is None:
            sid = submission_id(job_id, attempt)
            token, digest = new_events_token()
            resources = rank_plan.entrypoint_resources(stored_spec(spec_json), self.settings, self.backend)
            launch = self._launch(job_id, attempt, sid, spec_json, token, resources, init_checkpoint)
            data = launch.model_dump_json().encode()
            launch_sha256 = hashlib.sha256(data).hexdigest()
            if fence is not None:  # a replica that lost the monitor must not rewrite the holder's file
                with self.sessions.begin() as s:
                    fence.hold(s)
            storage.write_private(prefix, name, data)
            with self.sessions.begin() as s:
                if fence is not None:
                    fence.hold(s)  # first: a take-over waits for this admission, or refuses it
                fixed = s.execute(
                    update(JobRow)
                    .where(JobRow.id == job_id, JobRow.status == JobStatus.QUEUED.value, JobRow.submission_id.is_(None))
                    .values(submission_id=sid, events_token_hash=digest, launch_sha256=launch_sha256),
                    execution_options={"synchronize_session": False},
                ).rowcount
                if fixed == 1:
                    record(s, "admitted", job_id=job_id, attempt=attempt)
                    row = s.get(JobRow, job_id)
                    row.start_phases = phases.added(row.start_phases, "admitted") or row.start_phases
            if fixed != 1:
                return None  # cancelled (or prepared elsewhere) meanwhile
        else:
            resources = self._launched_resources(uri, launch_sha256)
        spec = stored_spec(spec_json)
        if not self._code_still_allowed(job_id, spec, fence):
            return None
        train = code_spec(spec)
        runtime_env = dict(train.runtime_env or {})
        env = {
            **self._env(kind, uri),
            LAUNCH_SHA256_ENV: launch_sha256 or "",
            PREEMPT_URI_ENV: marker_uri(prefix, attempt),
        }
        runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **env}
        if train.working_dir:
            runtime_env["working_dir"] = train.working_dir
        elif train.is_user_code and train.code:  # an uploaded package: Ray fetches and unpacks it on each node
            runtime_env["working_dir"] = self.code.fetch_uri(train.code.removeprefix(CODE_REF_PREFIX))
        return Prepared(job_id, kind, attempt, sid, uri, runtime_env, previous, resources)

    def _launched_resources(self, uri: str, sha256: str | None) -> dict[str, float] | None:
        """The local ranks' resources an earlier preparation of this attempt wrote into its
        launch file: a submit retried must hold what its driver will run. A file whose bytes
        are no longer the server's (rewritten by a job) says nothing; its driver refuses it."""
        try:
            with storage.open_random_access(uri) as f:
                data = f.read()
            if hashlib.sha256(data).hexdigest() != sha256:
                log.warning("the launch file %s was changed after the server wrote it", uri)
                return None
            return LaunchFile.model_validate_json(data).local_ranks
        except (OSError, ValueError):  # a pydantic ValidationError is a ValueError
            return None

    def _code_still_allowed(self, job_id: str, spec: JobSpec, fence: Fence | None = None) -> bool:
        """The policy again, as the attempt starts: Ray zips a server path now, not at the
        submit, so a link or a file added under it since fails the job (USER_CODE, with
        the policy's message) instead of being shipped; a job stored before a policy
        change (a resume) meets today's policy; and an uploaded package is hashed again,
        since jobs can write the storage path: rewritten there, Ray must not run it."""
        train = code_spec(spec)
        if not train.is_user_code:
            return True
        try:
            check_user_code(spec, self.settings)
            sha256 = train.code.removeprefix(CODE_REF_PREFIX) if train.code else None
            if sha256 and not self.code.verify(sha256):
                raise altered(sha256)
        except (InvalidSpec, Conflict) as exc:
            self._fail_unstarted(
                job_id,
                FailureCause.USER_CODE,
                f"{exc.code}: {exc.message}",
                "the job's code changed since the submit",
                fence,
            )
            return False
        return True

    def _fail_unstarted(
        self, job_id: str, cause: FailureCause, error: str, reason: str, fence: Fence | None = None
    ) -> None:
        """Fail a job Ray never started, if it is still QUEUED; its submission id goes with it.
        With ``fence``, only while the monitor's lease is held (a replica paused past it fails
        nothing its new holder may be starting)."""
        with self.sessions.begin() as s:
            if fence is not None:
                fence.hold(s)
            job = s.get(JobRow, job_id)
            if job is not None and job.status == JobStatus.QUEUED.value:
                lifecycle.fail(s, job, cause, error, reason=reason)
                job.submission_id = None

    def _launch(
        self,
        job_id: str,
        attempt: int,
        sid: str,
        spec: dict,
        token: str,
        resources: dict | None,
        init_checkpoint: str | None = None,
    ) -> LaunchFile:
        return LaunchFile(
            job_id=job_id,
            attempt=attempt,
            submission_id=sid,
            storage_path=self.settings.storage.resolved_storage_path,
            # Not its webhooks: the driver has no use for them, and a webhook URL may carry a token
            # that other jobs on the cluster must not read.
            spec={k: v for k, v in spec.items() if k != "notify"},
            events_url=f"{self.settings.http.events_base_url}/v1/internal/jobs/{job_id}/events",
            events_token=token,
            local_ranks=resources,
            trial_ranks=self.settings.startup.local_ranks and spec.get("kind") == "tune",
            init_checkpoint=init_checkpoint,
        )

    def _env(self, kind: str, launch_uri: str) -> dict[str, str]:
        """The driver's environment: where its launch file is, and Ray settings. Nothing
        secret: Ray's job list shows these to every job on the cluster."""
        return {
            LAUNCH_URI_ENV: launch_uri,
            "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(self.settings.startup.train_health_check_interval_s),
            "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": str(self.settings.startup.worker_start_timeout_s),
            "RAY_DEDUP_LOGS": "0",
            "PYTHONUNBUFFERED": "1",
            WARM_IDLE_ENV: str(self.settings.startup.warm_idle_s),  # read by a cold driver that starts the pool
            SEARCH_STALL_ENV: str(self.settings.startup.search_stall_s),  # a search's stall guard (tuning/stall.py)
            **graceful_stop_env(kind),  # a cancelled run hands its CPUs back at once
            # An object store's endpoint and region (never a credential): without them the
            # driver's pyarrow asks AWS's public host where the bucket is.
            **self.settings.storage.object_store_env,
            **self.settings.cluster.data_cache_env,  # the node's dataset cache, when the operator turned it on
        }

    def confirm(
        self, job_id: str, sid: str, attempt: int, sent: float | None = None, fence: Fence | None = None
    ) -> None:
        """Ray has the attempt: count it (``submitted`` at ``sent``, when its submit went
        out). A job cancelled meanwhile gets its Ray job stopped. With ``fence``, only while
        the monitor's lease is held under it (else LeaseLost, the job left as it was)."""
        with self.sessions.begin() as s:
            if fence is not None:
                fence.hold(s)
            job = s.get(JobRow, job_id)
            if job is not None and job.ray_job_id == sid and job.status in ACTIVE:
                return  # confirmed already (a pass before this one): its Ray job is the job's and runs on
            if job is None:
                started = False
            else:
                also = {"attempt": attempt, "ray_job_id": sid, "submission_id": None, "log_offset": 0}
                if (submitted := phases.added(job.start_phases, "submitted", sent)) is not None:
                    also["start_phases"] = submitted
                started = job.submission_id == sid and lifecycle.transition(
                    s, job, JobStatus.STARTING, reason="submitted to Ray", also=also
                )
                if not started and job.submission_id == sid:
                    job.submission_id = None
        if not started:
            # Cancelled (or deleted) while it was being submitted: the Ray job must not train on.
            log.info("job %s ended while its attempt %s was submitted: stopping %s", job_id, attempt, sid)
            self.backend.stop(sid)

    # ------------------------------------------------------------------ reconcile

    def reconcile(self) -> list[str]:
        """Stop the Ray jobs of this store whose raydock job is not active in that
        attempt; returns their submission ids."""
        ours = [j for j in self.backend.list_jobs() if j.is_active and j.metadata.get("raydock_store") == self.store_id]
        if not ours:
            return []
        ids = {j.metadata.get("raydock_job", "") for j in ours}
        with self.sessions() as s:
            rows = {
                r.id: r
                for r in s.execute(
                    select(JobRow.id, JobRow.status, JobRow.ray_job_id, JobRow.submission_id).where(JobRow.id.in_(ids))
                )
            }
        stopped = []
        for rj in ours:
            row = rows.get(rj.metadata.get("raydock_job", ""))
            active = row is not None and (
                (row.status in ACTIVE and row.ray_job_id == rj.submission_id)
                or (row.status == JobStatus.QUEUED.value and row.submission_id == rj.submission_id)
            )
            if not active:
                log.warning("stopping Ray job %s: its raydock job is not running that attempt", rj.submission_id)
                self.backend.stop(rj.submission_id)
                stopped.append(rj.submission_id)
        return stopped


def graceful_stop_env(kind: str) -> dict[str, str]:
    """How Ray stops a job's driver (read by Ray's job supervisor, which runs with the
    job's environment). A training job's: with SIGINT, which Ray Train answers by aborting
    the run cleanly. Ray's default, SIGTERM, kills the Train controller before it
    withdraws its share of the cluster from Ray Train's resource coordinator, and elastic
    jobs then cannot grow into the freed CPUs until that share expires (180 s). A search's:
    SIGTERM, which its driver answers by having Tune save the search one last time
    (``tuning.search_driver``), with the same 15 s before Ray's SIGKILL instead of 3."""
    if kind == "train":
        return {"RAY_JOB_STOP_SIGNAL": "SIGINT", "RAY_JOB_STOP_WAIT_TIME_S": "15"}
    return {"RAY_JOB_STOP_WAIT_TIME_S": "15"}
