"""Pipelines and jobs that run after others, through the server's parts (service/runtime.py's
``compose``) on real SQLite and PostgreSQL, no Ray: a bad graph is refused at submit with
its code and nothing is stored; a pipeline is stored all or none; the monitor's release
step (service/pipelines/release.py) queues a step once its dependencies ended as asked,
with the checkpoint its init_from resolves to (only one the server lists as complete for
that job), stops what depends on a failed step with a reason naming it, and moves nothing
under a lost lease; cancel and resume act on the whole pipeline. Over HTTP, with the SDK
and CLI: tests/test_pipelines_http.py; on the Ray cluster: tests/test_pipelines_ray.py."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from api.checkpoint_manifest import MANIFEST_FILE, render
from api.errors import InvalidSpec, QuotaExceeded
from api.schemas import JobStatus, QuotaSpec, parse_job_spec
from api.schemas.pipelines import PIPELINE_LABEL, STEP_LABEL, PipelineSpec
from bench.harness.jobstore import job_service, set_columns
from bench.harness.specs import digits_spec
from service.db.event_models import CheckpointRow
from service.db.leases import LeaseLost, Leases
from service.db.models import JobRow
from service.db.pipeline_models import PipelineRow
from service.files import storage
from service.runtime import Runtime
from service.tenancy import quotas
from service.tenancy.caller import Caller

ADMIN = Caller("admin", None, True)


def step(name: str, **more) -> dict:
    return {"name": name, "job": digits_spec(name=f"{name}-job"), **more}


def pipeline(*steps: dict, **more) -> PipelineSpec:
    return PipelineSpec.model_validate({"name": "pl", "steps": list(steps), **more})


@pytest.fixture()
def service(tmp_path):
    runtime = job_service(f"sqlite:///{tmp_path / 'store.db'}", tmp_path / "data")
    yield runtime
    runtime.sessions.kw["bind"].dispose()


@pytest.fixture(scope="module")
def refusing(tmp_path_factory):
    """One store for the refusals: nothing is stored by any of them."""
    tmp = tmp_path_factory.mktemp("refusals")
    runtime = job_service(f"sqlite:///{tmp / 'store.db'}", tmp / "data")
    yield runtime
    runtime.sessions.kw["bind"].dispose()


@pytest.fixture()
def either(database_url, tmp_path):
    runtime = job_service(database_url, tmp_path / "data")
    yield runtime
    runtime.sessions.kw["bind"].dispose()


def stored(service: Runtime) -> tuple[int, int]:
    with service.sessions() as s:
        return s.scalar(select(func.count()).select_from(JobRow)), s.scalar(
            select(func.count()).select_from(PipelineRow)
        )


def statuses(service: Runtime, pipeline_id: str) -> dict[str, tuple[str, str | None]]:
    got = service.pipelines.get(pipeline_id, ADMIN)
    return {st.name: (st.status.value, st.status_reason) for st in got.steps}


def release(service: Runtime, fence=None) -> int:
    return service.monitor.release.release(fence)


BAD = [
    (
        "cycle",
        [step("a", after=[{"step": "c"}]), step("b", after=[{"step": "a"}]), step("c", after=[{"step": "b"}])],
        "pipeline_cycle",
        "a -> c -> b -> a",
    ),
    ("self", [step("a", after=[{"step": "a"}])], "pipeline_cycle", "itself"),
    ("unknown step", [step("a"), step("b", after=[{"step": "nope"}])], "unknown_step", "'nope'"),
    ("unknown init_from step", [step("a"), step("b", init_from={"step": "nope"})], "unknown_step", "init_from"),
    ("duplicate names", [step("a"), step("a")], "duplicate_step", "steps[0]"),
    ("too many steps", [step(f"s{i}") for i in range(33)], "too_many_steps", "RAYDOCK_MAX_PIPELINE_STEPS"),
    (
        "step job with its own after",
        [step("a"), {"name": "b", "job": {**digits_spec(), "after": [{"job": "j1"}]}}],
        "dependency_in_step_job",
        "put them on the step",
    ),
    (
        "step in another project",
        [step("a"), {"name": "b", "job": digits_spec(project="beta")}],
        "cross_project_step",
        "'beta'",
    ),
    ("unknown job", [step("a", after=[{"job": "j0000000000x"}])], "dependency_not_found", "j0000000000x"),
]


@pytest.mark.parametrize("what,steps,code,hint", BAD, ids=[b[0] for b in BAD])
def test_a_bad_graph_is_refused_with_its_code_and_nothing_is_stored(refusing, what, steps, code, hint):
    with pytest.raises(InvalidSpec) as refused:
        refusing.pipelines.submit(pipeline(*steps), ADMIN, "default")
    assert refused.value.status == 422 and refused.value.code == code, refused.value.message
    assert hint in refused.value.message
    assert stored(refusing) == (0, 0)


def test_a_dependency_in_another_project_reads_as_missing(service):
    service.projects.create("beta", ADMIN)
    theirs, _ = service.jobs.submit(parse_job_spec(digits_spec(name="theirs")), project="beta")
    for spec in (
        digits_spec(after=[{"job": theirs.id}]),
        digits_spec(init_from={"job": theirs.id, "checkpoint": "latest"}),
    ):
        with pytest.raises(InvalidSpec) as refused:
            service.jobs.submit(parse_job_spec(spec), project="default")
        assert refused.value.code == "dependency_not_found" and "own project" in refused.value.message
    with pytest.raises(InvalidSpec) as by_step:
        service.jobs.submit(parse_job_spec(digits_spec(after=[{"step": "a"}])))
    assert by_step.value.code == "step_outside_pipeline"
    assert stored(service)[0] == 1  # only beta's own job


def test_a_pipeline_is_stored_all_or_none(service):
    service.projects.create("alpha", ADMIN)
    with service.sessions.begin() as s:
        quotas.set_quota(s, "alpha", QuotaSpec(max_queued=2))
    three = pipeline(step("a"), step("b", after=[{"step": "a"}]), step("c", after=[{"step": "b"}]))
    with pytest.raises(QuotaExceeded):
        service.pipelines.submit(three, ADMIN, "alpha")  # the third step is past max_queued (WAITING counts)
    assert stored(service) == (0, 0)
    made = service.pipelines.submit(three.model_copy(update={"steps": three.steps[:2]}), ADMIN, "alpha")
    assert [(s.name, s.status.value) for s in made.steps] == [("a", "QUEUED"), ("b", "WAITING")]
    b = made.steps[1]
    assert b.after == [{"step": "a", "status": "SUCCEEDED"}] and "step 'a'" in b.status_reason
    with service.sessions() as s:
        job = s.get(JobRow, b.job_id)
        assert job.labels[PIPELINE_LABEL] == made.id and job.labels[STEP_LABEL] == "b"
        assert [(a["job"], a["status"]) for a in job.spec["after"]] == [(made.steps[0].job_id, "SUCCEEDED")]


def _checkpoint(service: Runtime, job_id: str, name: str, complete: bool, prefix: str | None = None) -> str:
    prefix = prefix or service.reads.prefix(job_id)
    files = {"model.pt": b"w" * 64, "state.json": b'{"format": 1, "step": 2, "epoch": 1}'}
    for rel, data in files.items():
        storage.write_private(prefix, f"{name}/{rel}", data)
    if complete:
        storage.write_private(prefix, f"{name}/{MANIFEST_FILE}", render({n: len(d) for n, d in files.items()}))
    else:
        storage.write_private(prefix, f"{name}/.uploading", b"")
    path = storage.join(prefix, name)
    with service.sessions.begin() as s:
        s.add(CheckpointRow(job_id=job_id, attempt=1, path=path, step=2, values={}))
    return path


def test_steps_start_when_their_dependencies_end_and_a_failed_one_stops_its_dependents(either):
    service = either
    made = service.pipelines.submit(
        pipeline(
            step("pre"),
            step("tune", init_from={"step": "pre", "checkpoint": "latest"}),
            step("eval", after=[{"step": "tune"}]),
            step("cleanup", after=[{"step": "pre", "status": "FAILED"}]),
            step("report", after=[{"step": "eval", "status": "ENDED"}]),
        ),
        ADMIN,
        "default",
    )
    ids = {s.name: s.job_id for s in made.steps}
    assert release(service) == 0  # nothing ended yet
    good = _checkpoint(service, ids["pre"], "ckpt-1", complete=True)
    _checkpoint(service, ids["pre"], "ckpt-2", complete=False)  # newer, but never sealed: not listed
    other = service.reads.prefix(ids["eval"])  # a row of pre's naming another job's folder: not pre's
    _checkpoint(service, ids["pre"], "ckpt-3", complete=True, prefix=other)
    set_columns(service, ids["pre"], status="SUCCEEDED")
    assert release(service) == 2
    now = statuses(service, made.id)
    assert now["tune"][0] == "QUEUED" and now["cleanup"][0] == "CANCELLED"
    assert "step 'pre'" in now["cleanup"][1] and "ended SUCCEEDED" in now["cleanup"][1], now["cleanup"]
    with service.sessions() as s:
        assert s.get(JobRow, ids["tune"]).init_checkpoint == good
    set_columns(service, ids["tune"], status="FAILED")
    assert release(service) == 2  # eval stopped, then report (it runs after eval whatever its end)
    now = statuses(service, made.id)
    assert now["eval"][0] == "CANCELLED" and "step 'tune'" in now["eval"][1]
    assert now["report"][0] == "QUEUED"
    assert service.pipelines.get(made.id, ADMIN).status == JobStatus.RUNNING  # report has not ended

    set_columns(service, ids["report"], status="SUCCEEDED")
    resumed = service.pipelines.resume(made.id, ADMIN)
    again = {s.name: s.status.value for s in resumed.steps}
    assert again == {
        "pre": "SUCCEEDED",
        "tune": "WAITING",
        "eval": "WAITING",
        "cleanup": "WAITING",
        "report": "SUCCEEDED",
    }
    release(service)
    again = statuses(service, made.id)
    assert again["tune"][0] == "QUEUED" and again["eval"][0] == "WAITING" and again["cleanup"][0] == "CANCELLED"

    cancelled = service.pipelines.cancel(made.id, ADMIN)
    assert {s.name: s.status.value for s in cancelled.steps} == {
        "pre": "SUCCEEDED",
        "tune": "CANCELLED",
        "eval": "CANCELLED",
        "cleanup": "CANCELLED",
        "report": "SUCCEEDED",
    }
    assert cancelled.status == JobStatus.CANCELLED


def test_init_from_without_a_complete_checkpoint_stops_the_step(service):
    made = service.pipelines.submit(pipeline(step("a"), step("b", init_from={"step": "a"})), ADMIN, "default")
    ids = {s.name: s.job_id for s in made.steps}
    _checkpoint(service, ids["a"], "half", complete=False)
    set_columns(service, ids["a"], status="SUCCEEDED")
    release(service)
    status, reason = statuses(service, made.id)["b"]
    assert status == "CANCELLED" and "left no complete checkpoint" in reason and "step 'a'" in reason


def test_a_waiting_steps_reason_names_what_it_still_waits_for_and_a_failed_dependency_stops_it_at_once(service):
    made = service.pipelines.submit(
        pipeline(
            step("a"),
            step("b"),
            step("c", after=[{"step": "a"}, {"step": "b"}]),
            step("d", after=[{"step": "b"}, {"step": "a"}]),
        ),
        ADMIN,
        "default",
    )
    ids = {s.name: s.job_id for s in made.steps}
    assert "step 'a'" in statuses(service, made.id)["c"][1] and "step 'b'" in statuses(service, made.id)["c"][1]
    set_columns(service, ids["a"], status="SUCCEEDED")
    assert release(service) == 0  # nothing queued or stopped: c and d still wait for b
    status, reason = statuses(service, made.id)["c"]
    assert status == "WAITING" and reason == f"waiting for step 'b' (job {ids['b']}) to succeed", reason
    assert release(service) == 0 and statuses(service, made.id)["c"][1] == reason  # written once
    # d waits for b first, then a: a's failure decides it while b still runs.
    set_columns(service, ids["a"], status="FAILED")
    assert release(service) == 2
    for name in ("c", "d"):
        status, reason = statuses(service, made.id)[name]
        assert status == "CANCELLED" and "step 'a'" in reason and "ended FAILED" in reason, (name, reason)


def test_a_replica_that_lost_the_monitor_releases_nothing(either):
    service = either
    engine = service.sessions.kw["bind"]
    a, b = Leases(engine, 60.0, holder="host-a/1/aa"), Leases(engine, 60.0, holder="host-b/2/bb")
    stale = a.claim(["monitor"])["monitor"]
    a.release()  # a pauses; b takes the monitor over
    fresh = b.claim(["monitor"])["monitor"]
    made = service.pipelines.submit(pipeline(step("a"), step("b", after=[{"step": "a"}])), ADMIN, "default")
    set_columns(service, made.steps[0].job_id, status="SUCCEEDED")
    with pytest.raises(LeaseLost):
        release(service, stale)
    assert statuses(service, made.id)["b"][0] == "WAITING"
    assert release(service, fresh) == 1
    assert statuses(service, made.id)["b"][0] == "QUEUED"


def test_a_waiting_job_cancels_and_a_plain_job_runs_after_another(service):
    first, _ = service.jobs.submit(parse_job_spec(digits_spec(name="first")))
    after, _ = service.jobs.submit(parse_job_spec(digits_spec(name="then", after=[{"job": first.id}])))
    assert after.status == JobStatus.WAITING and first.id in after.status_reason
    assert service.jobs.cancel(after.id).status == JobStatus.CANCELLED
    ended, _ = service.jobs.submit(
        parse_job_spec(digits_spec(name="any", after=[{"job": first.id, "status": "ENDED"}]))
    )
    service.jobs.cancel(first.id)
    release(service)
    assert service.reads.get(ended.id).status == JobStatus.QUEUED
