"""Jobs in SQL, on SQLite and on a real PostgreSQL: keyset pages, label filters, the
stored queue position and admission's reads of the queue. No Ray: jobs stay QUEUED."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import event, select

from api.errors import InvalidSpec
from api.schemas import JobStatus
from bench.harness.jobstore import job_service, set_columns, submit
from service.db.listing import decode_cursor, encode_cursor
from service.db.models import JobRow, TransitionRow, utcnow
from service.scheduling import admission, queue


@pytest.fixture()
def service(database_url, tmp_path):
    svc = job_service(database_url, tmp_path)
    yield svc
    svc.sessions.kw["bind"].dispose()


def newest_first(service, status: JobStatus | None = None) -> list[str]:
    with service.sessions() as s:
        q = select(JobRow.id).order_by(JobRow.created_at.desc(), JobRow.id.desc())
        if status is not None:
            q = q.where(JobRow.status == status.value)
        return list(s.scalars(q))


def test_keyset_pages_are_complete_and_stable_while_jobs_are_added(service):
    ids = [submit(service, name=f"p{i}") for i in range(23)]
    # Ten jobs made in the same instant: only the id orders them.
    set_columns(service, ids[5:15], created_at=utcnow() - timedelta(hours=1))
    service.jobs.cancel(ids[0]), service.jobs.cancel(ids[7]), service.jobs.cancel(ids[12])
    expected = newest_first(service)

    seen, cursor, pages = [], None, 0
    while True:
        page = service.reads.list(status=None, labels={}, limit=4, cursor=cursor)
        assert page.total == 23 + 2 * pages  # the count includes jobs added meanwhile
        seen += [j.id for j in page.items]
        pages += 1
        submit(service, name=f"late{pages}"), submit(service, name=f"late{pages}b")  # newer: before the first page
        if page.next is None:
            break
        cursor = page.next
    assert seen == expected  # every job once, in order, none of those added while paging
    assert pages == 6

    cancelled = service.reads.list(status=JobStatus.CANCELLED, labels={}, limit=2)
    rest = service.reads.list(status=JobStatus.CANCELLED, labels={}, limit=2, cursor=cancelled.next)
    assert [j.id for j in cancelled.items + rest.items] == newest_first(service, JobStatus.CANCELLED)
    assert rest.next is None and cancelled.total == 3


LABELLED = [
    {},
    {"team": "a"},
    {"team": "A"},
    {"team": "a", "env": "prod"},
    {"team": ""},
    {"env": "prod"},
    {"team": "a b=c"},
    {"k.x/y-z": "ünï"},
    {"team": "a "},
    {"env": "prod", "team": "b"},
]
FILTERS = [
    {},
    {"team": "a"},
    {"team": ""},
    {"team": "a", "env": "prod"},
    {"team": "A"},
    {"env": "prod"},
    {"team": "a b=c"},
    {"missing": "x"},
    {"k.x/y-z": "ünï"},
    {"team": "a "},
    {"team": "%"},
    {"team": "_"},
]


def test_label_filters_in_sql_match_the_python_semantics(service):
    jobs = {submit(service, name=f"l{i}", labels=labels): labels for i, labels in enumerate(LABELLED)}
    for wanted in FILTERS:
        page = service.reads.list(status=None, labels=wanted, limit=100)
        matching = {job_id for job_id, labels in jobs.items() if all(labels.get(k) == v for k, v in wanted.items())}
        assert {j.id for j in page.items} == matching, wanted
        assert page.total == len(matching), wanted
    only_queued = service.reads.list(status=JobStatus.RUNNING, labels={"team": "a"}, limit=100)
    assert only_queued.items == [] and only_queued.total == 0


def test_a_cursor_not_handed_out_is_refused_with_a_code(service):
    submit(service)
    good = encode_cursor(utcnow(), "jabc")
    assert decode_cursor(good)[1] == "jabc"
    for bad in (
        "garbage!",
        "x" * 300,
        "W10",
        "WyJ4Il0",
        good[:-3],
        "eyJhIjoxfQ",
        "WzEsMl0",
        "WyJub3QtYS1kYXRlIiwiaiJd",
    ):
        with pytest.raises(InvalidSpec) as err:
            service.reads.list(status=None, labels={}, limit=5, cursor=bad)
        assert err.value.code == "invalid_cursor" and err.value.status == 422, bad


def queue_order_in_python(service) -> list[str]:
    with service.sessions() as s:
        rows = s.execute(
            select(JobRow.id, JobRow.priority, JobRow.queued_at).where(
                JobRow.status == "QUEUED", JobRow.submission_id.is_(None)
            )
        ).all()
    return [r.id for r in sorted(rows, key=lambda r: (-r.priority, r.queued_at, r.id))]


def test_queue_positions_are_stored_in_queue_order_and_rewritten_only_when_they_move(service):
    ids = [submit(service, name=f"q{i}", priority=[0, 5, 0, 2, 5][i % 5]) for i in range(70)]
    set_columns(service, ids[10:30], queued_at=utcnow())  # equal arrival: the id decides
    set_columns(service, ids[3], submission_id="raydock-being-submitted")  # out of line
    with service.sessions.begin() as s:
        assert queue.store_positions(s) == 69
        assert queue.store_positions(s) == 0  # nothing moved: nothing written
    order = queue_order_in_python(service)
    assert len(order) == 69 and ids[3] not in order
    assert [service.reads.get(job_id).queue_position for job_id in order] == list(range(1, 70))
    assert service.reads.get(ids[3]).queue_position is None
    with service.sessions() as s:  # the head, read a batch at a time, is the same order
        assert [q.id for q in queue.head(s, skip={order[1]})] == [order[0], *order[2:]]

    service.jobs.cancel(order[0])
    with service.sessions.begin() as s:
        assert queue.store_positions(s) == 68  # every job behind it moved up one
    assert service.reads.get(order[1]).queue_position == 1 and service.reads.get(order[0]).queue_position is None

    # Re-ranked from the first job that entered the line: one queued at the end moves no
    # one else; one of a middle priority moves those behind it.
    last = submit(service, name="last")
    with service.sessions.begin() as s:
        assert queue.store_positions(s, touched={last}) == 1
    middle = submit(service, name="middle", priority=3)
    with service.sessions.begin() as s:
        queue.store_positions(s, touched={middle})
    order = queue_order_in_python(service)
    assert [service.reads.get(job_id).queue_position for job_id in order] == list(range(1, len(order) + 1))

    # A job that left the line and was deleted before the places were stored again
    # (retention, DELETE) still moves those behind it up.
    gone = order[len(order) // 2]
    service.jobs.cancel(gone)
    service.jobs.delete(gone)
    with service.sessions.begin() as s:
        assert queue.store_positions(s, touched={gone}) == len(order) - len(order) // 2 - 1
    order = queue_order_in_python(service)
    assert [service.reads.get(job_id).queue_position for job_id in order] == list(range(1, len(order) + 1))


def test_a_tick_with_no_cluster_fails_late_jobs_types_old_ones_and_writes_only_changes(service):
    ids = [submit(service, name=f"t{i}") for i in range(5)]
    late = submit(service, name="late", scheduling_timeout_s=5)
    set_columns(service, late, queued_at=utcnow() - timedelta(seconds=60))
    set_columns(
        service, ids[0], demand_cpus=None, demand_gpus=None, holds_cpus=None, holds_gpus=None
    )  # stored before 0003
    set_columns(service, ids[1], demand_cpus=None, spec={"kind": "train", "model": {"type": "nope"}})
    monitor = service.monitor
    monitor.queue.admit()

    failed = service.reads.get(late)
    assert failed.status == JobStatus.FAILED and failed.status_reason == "no resources within scheduling_timeout_s=5"
    assert failed.failure_cause.value == "NO_RESOURCES" and "within 5s" in failed.error
    assert service.reads.get(ids[1]).status == JobStatus.FAILED  # unreadable: fails alone
    with service.sessions() as s:
        typed = s.get(JobRow, ids[0])
        assert (typed.demand_cpus, typed.holds_cpus, typed.demand_gpus) == (2.0, 2.0, 0.0)
    waiting = [service.reads.get(i) for i in (ids[0], *ids[2:])]
    assert [j.queue_position for j in waiting] == [1, 2, 3, 4]
    assert all(j.status_reason.startswith("waiting for the Ray cluster") for j in waiting)

    engine = service.sessions.kw["bind"]
    changed = []

    def count(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE"):
            changed.append(cursor.rowcount)

    event.listen(engine, "after_cursor_execute", count)
    try:
        monitor.queue.admit()  # the same queue, the same cluster: nothing to write
    finally:
        event.remove(engine, "after_cursor_execute", count)
    assert sum(changed) == 0  # no row written (no UPDATE sent at all, or one that matched nothing)

    # A tick looks again at what was submitted or moved since the last one.
    newer = submit(service, name="newer")
    service.jobs.cancel(ids[0])
    monitor.queue.admit()
    assert service.reads.get(newer).queue_position == 4 and service.reads.get(newer).status_reason.startswith(
        "waiting for the Ray cluster"
    )
    assert [service.reads.get(i).queue_position for i in ids[2:]] == [1, 2, 3]


def test_admission_starts_the_head_in_order_and_stops_at_the_first_that_waits():
    now = utcnow()
    queued = [admission.Queued(f"j{i}", cpus, 0.0, now) for i, cpus in enumerate([1, 2, 3, 1, 1])]
    plan = admission.plan(iter(queued), (4.0, 0.0))
    assert plan.start == ["j0", "j1"]  # j2 needs 3 of the 1 left; j3 would fit but never overtakes
    assert plan.seen == {"j0", "j1", "j2"} and plan.reasons == {
        "j2": "waiting for resources: needs 3 CPUs / 0 GPUs, 1 / 0 free"
    }
    again = admission.plan(iter([admission.Queued("j2", 3, 0.0, now, reason=plan.reasons["j2"])]), (1.0, 0.0))
    assert again.start == [] and again.reasons == {}  # unchanged reason: not rewritten
    gpu = admission.plan(iter([admission.Queued("g", 1, 1.0, now)]), (8.0, 0.0))
    assert gpu.start == [] and "needs 1 CPUs / 1 GPUs" in gpu.reasons["g"]


def test_cancel_many_cancels_queued_jobs_in_one_go_and_says_why_for_the_rest(service):
    queued = [submit(service, name=f"c{i}") for i in range(4)]
    done = submit(service, name="done")
    set_columns(service, done, status="SUCCEEDED", finished_at=utcnow())
    with service.sessions.begin() as s:
        queue.store_positions(s)
    result = service.jobs.cancel_many([*queued, done, "jmissing", queued[0]])
    assert result.cancelled == queued
    assert [(r.id, r.code) for r in result.refused] == [(done, "job_finished"), ("jmissing", "job_not_found")]
    for job_id in queued:
        job = service.reads.get(job_id)
        assert job.status == JobStatus.CANCELLED and job.queue_position is None and job.finished_at is not None
    with service.sessions() as s:
        moves = s.execute(
            select(TransitionRow.job_id, TransitionRow.from_status, TransitionRow.to_status).where(
                TransitionRow.job_id.in_(queued)
            )
        ).all()
    assert sorted(moves) == sorted((j, "QUEUED", "CANCELLED") for j in queued)
    again = service.jobs.cancel_many(queued)
    assert again.cancelled == [] and {r.code for r in again.refused} == {"job_finished"}
