"""Events and logs at scale, on the store (SQLite and PostgreSQL) with no Ray behind it:
batched ingestion over both channels stores every event once, metric pages are complete
and downsampling keeps what a chart needs, and a capped log keeps its head and tail,
says what it dropped, and still takes in every event it held."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import select

from api.schemas import event_line, parse_event, parse_job_spec
from bench.harness.jobstore import dead_ray, job_service, set_columns, submit
from service.cluster.ray_backend import RayBackend
from service.db.engine import make_engine, make_sessionmaker
from service.db.event_models import LogChunkRow, MetricRow, TrialRow
from service.db.models import JobRow
from service.events import logs
from service.events.reads import series
from service.runtime import compose
from service.settings import Settings
from tests.support.specs import FIXTURES, user_spec


def metric(i: int, **values) -> dict:
    return {"type": "metric", "seq": i, "ts": 1000.0 + i, "metrics": {"loss": 1.0 / (i + 1), "step": i, **values}}


def log_text(events: list[dict], noise: str = "a worker printed this\n") -> str:
    return "".join(noise + event_line(parse_event(e)) + "\n" for e in events)


@pytest.fixture()
def running(database_url, tmp_path):
    service = job_service(database_url, tmp_path)
    job_id = submit(service)
    set_columns(service, job_id, status="RUNNING", attempt=1)
    return service, job_id


def stored(service, job_id: str) -> list[tuple[int, int, int]]:
    with service.sessions() as s:
        q = (
            select(MetricRow.seq, MetricRow.attempt, MetricRow.src_seq)
            .where(MetricRow.job_id == job_id)
            .order_by(MetricRow.seq)
        )
        return [tuple(r) for r in s.execute(q)]


def test_both_channels_store_every_event_once_across_batches_and_retries(running):
    service, job_id = running
    events = [metric(i) for i in range(600)]
    service.pushes.take(job_id, events[:150])  # a pushed batch
    service.pushes.take(job_id, events[100:200])  # a retried post overlapping it
    service.pushes.take(job_id, events[400:450])  # after a gap: the push does not skip ahead
    text = log_text(events)
    first, rest = text[: len(text) // 3], text[len(text) // 3 :]
    taken = service.ingest.log(job_id, first, 0)  # the log channel: up to its last full line
    assert 0 < taken <= len(first)
    assert service.ingest.log(job_id, first, 0) == 0  # the same read again is not the next text: refused
    service.ingest.log(job_id, first[taken:] + rest, taken)
    service.pushes.take(job_id, events[500:])  # late pushes of what the log brought
    assert stored(service, job_id) == [(i, 1, i) for i in range(600)]

    # A new attempt numbers its events from 0 again; the job's seq goes on.
    set_columns(service, job_id, attempt=2, log_offset=0)
    second = [metric(i) for i in range(20)]
    service.pushes.take(job_id, second[:5])
    service.ingest.log(job_id, log_text(second), 0)
    assert stored(service, job_id)[600:] == [(600 + i, 2, i) for i in range(20)]
    with service.sessions() as s:
        job = s.get(JobRow, job_id)
        assert (job.metrics_stored, job.attempt_metrics, job.latest_metrics["step"]) == (620, 20, 19)
        assert job.log_offset == len(log_text(second))


def test_a_batch_with_bad_events_stores_the_good_ones_and_counts_the_rest(running):
    service, job_id = running
    batch = [
        metric(0),
        {"type": "metric", "seq": -1, "metrics": {}},
        "not an event",
        metric(1),
        {"type": "nope", "seq": 2},
    ]
    service.pushes.take(job_id, batch)
    assert stored(service, job_id) == [(0, 1, 0), (1, 1, 1)]
    assert service.reads.get(job_id).dropped_events == 3


def test_metric_pages_are_complete_and_max_points_keeps_first_last_and_extremes(running):
    service, job_id = running
    rng = random.Random(0)
    events = [metric(i, acc=rng.random(), note="text") for i in range(2500)]
    events[1234]["metrics"]["acc"], events[77]["metrics"]["acc"] = 5.0, -5.0  # the extremes, mid-series
    service.pushes.take(job_id, events)

    seen, since, more = [], -1, True
    while more:
        page, more = service.reads.metrics(job_id, since, 700)
        seen += [p.seq for p in page]
        since = page[-1].seq
    assert seen == list(range(2500))
    assert service.reads.metrics(job_id, 2499, 700) == ([], False)

    points = service.reads.metrics_downsampled(job_id, -1, 100)
    assert len(points) <= 100
    assert (points[0].seq, points[0].metrics, points[-1].seq) == (0, events[0]["metrics"], 2499)
    assert sum(p.points for p in points) == 2500  # every report is in exactly one bucket
    assert [p.first_seq for p in points[1:]] == [0 + 1] + [p.seq + 1 for p in points[1:-1]]
    assert max(p.metrics_max["acc"] for p in points[1:]) == 5.0
    assert min(p.metrics_min["acc"] for p in points[1:]) == -5.0
    assert "note" not in points[1].metrics_min  # only numbers have extremes
    assert [p.seq for p in service.reads.metrics_downsampled(job_id, 2400, 500)] == list(
        range(2401, 2500)
    )  # fewer than asked: as stored
    with service.sessions() as s:  # databases without JSON functions get the same buckets, made in Python
        assert series._downsample_here(s, job_id, -1, 100, 2499) == points
    window = service.reads.metrics_downsampled(job_id, 999, 10, until=1999)  # the next 1000 reports after seq 999
    assert (window[0].seq, window[-1].seq, sum(p.points for p in window)) == (1000, 1999, 1000)


def test_downsampled_series_from_rollups_equal_the_buckets_made_from_every_report(running):
    """Blocks kept at ingestion, over batches of any size and both channels, give the same
    points as buckets made from every stored report, for any window and max_points (the
    widths chosen reach three block levels, the ends single reports and smaller blocks)."""
    service, job_id = running
    rng = random.Random(1)
    n = 3000
    events = [
        metric(i, acc=rng.uniform(-1, 1), flag=i % 7 == 0, note="x", big=rng.randint(-(10**6), 10**6)) for i in range(n)
    ]
    events[2222]["metrics"]["acc"] = 9.0  # an extreme inside a wide block
    at = log_at = 0
    while at < n:  # batches of 1 to 300 events, some from the log channel
        size = rng.choice((1, 2, 17, 300))
        if rng.random() < 0.2:
            log_at += service.ingest.log(job_id, log_text(events[at : at + size]), log_at, final=True)
        else:
            service.pushes.take(job_id, events[at : at + size])
        at += size
    assert stored(service, job_id)[-1][0] == n - 1
    windows = [
        (-1, None, 2),
        (-1, None, 3),
        (-1, None, 5),
        (-1, None, 40),
        (-1, None, 500),
        (17, None, 4),
        (999, 1999, 10),
    ]
    windows += [(rng.randrange(-1, n - 100), None, rng.randrange(2, 60)) for _ in range(6)]
    windows += [
        (a, a + rng.randrange(100, 2000), rng.randrange(2, 30)) for a in (rng.randrange(0, n - 2000) for _ in range(5))
    ]
    with service.sessions() as s:
        for since, until, max_points in windows:
            points = series.downsample(s, job_id, since, max_points, until)
            last = min(n - 1, until if until is not None else n - 1)
            assert points == series._downsample_here(s, job_id, since, max_points, last), (since, until, max_points)
            assert len(points) <= max_points and sum(p.points for p in points) == last - since
    whole = service.reads.metrics_downsampled(job_id, -1, 3)
    assert max(p.metrics_max["acc"] for p in whole[1:]) == 9.0 and "flag" not in whole[1].metrics_max


def test_a_capped_log_keeps_head_and_tail_says_what_it_dropped_and_takes_in_every_event(running):
    service, job_id = running
    cap = 256 * 1024
    service.ingest.max_log_bytes = cap
    events = [metric(i, text="é" * 50) for i in range(3000)]  # multi-byte characters: bytes are not characters
    text = log_text(events, noise="ü-noise " * 10 + "\n")
    at = 0
    for i in range(0, len(text), 50_000):  # as the monitor takes it in, read after read
        at += service.ingest.log(job_id, text[at : i + 50_000], at)
    at += service.ingest.log(job_id, text[at:], at, final=True)
    assert at == len(text)

    assert [s for s, _, _ in stored(service, job_id)] == list(range(3000))  # every event, once
    with service.sessions() as s:
        job = s.get(JobRow, job_id)
        whole, end = logs.read(s, job_id, 0, max_chunks=10_000)
        marks = s.scalars(
            select(LogChunkRow).where(LogChunkRow.job_id == job_id, LogChunkRow.dropped_bytes.is_not(None))
        ).all()
        assert end == job.log_end == len(text)
        assert len(marks) == 1
        head, tail = whole.split(marks[0].text)
        dropped = len(text.encode()) - len((head + tail).encode())
        assert (
            marks[0].text.strip()
            == f"[raydock: {dropped} bytes of this log were dropped here to keep it under RAYDOCK_MAX_LOG_BYTES={cap}]"
        )
        assert text.startswith(head) and text.endswith(tail)
        assert cap // 4 - 2000 <= len(head.encode()) <= cap // 4 and cap // 2 <= len((head + tail).encode()) <= cap
        # An offset inside the dropped middle reads the marker, then the tail.
        middle, _ = logs.read(s, job_id, len(text) // 2, max_chunks=10_000)
        assert middle == marks[0].text + tail


def test_log_ranges_return_every_character_once_across_chunk_boundaries(running):
    service, job_id = running
    text = "".join(f"line {i} {'ß' * (i % 300)}\n" for i in range(4000))  # ~1.3 MB: many 64 KiB chunks
    at = 0
    for size in (1, 70_000, 5, 200_000, 10**9):
        at += service.ingest.log(job_id, text[at : at + size], at, final=True)
    with service.sessions() as s:
        assert logs.read(s, job_id, 0, max_chunks=10_000) == (text, len(text))
        sizes = s.scalars(select(LogChunkRow.nbytes).where(LogChunkRow.job_id == job_id)).all()
        assert max(sizes) <= logs.CHUNK_BYTES and len(sizes) > 10
        for offset in (0, 1, 65_535, 65_536, 777_777, len(text) - 1, len(text)):
            out, pos = "", offset
            while True:  # what a follower does: small ranges until the end
                piece, pos = logs.read(s, job_id, pos, max_chunks=1)
                if not piece:
                    break
                out += piece
            assert out == text[offset:]


def test_ingested_events_count_nothing_twice_when_a_log_read_is_retried_after_a_restart(running):
    service, job_id = running
    text = log_text([metric(i) for i in range(50)])
    half = text.index("\n", len(text) // 2) + 1
    service.ingest.log(job_id, text[:half], 0)
    # A restarted server's tail sends the log from the start; the stored offset skips what it has.
    with service.sessions() as s:
        offset = s.get(JobRow, job_id).log_offset
    assert offset == half
    service.ingest.log(job_id, text[offset:], offset)
    assert [s for s, _, _ in stored(service, job_id)] == list(range(50))
    with service.sessions() as s:
        assert logs.read(s, job_id, 0) == (text, len(text))


@pytest.mark.parametrize(
    "budget, unit",
    [
        (None, "training_iteration"),  # the loop's own end: Tune's count of reports is the axis
        ({"reports": 50}, "training_iteration"),
        ({"epochs": 5}, "epoch"),
        ({"steps": 500}, "step"),
    ],
)
def test_a_trials_time_is_read_on_the_searchs_own_axis(database_url, tmp_path, budget, unit):
    # A user loop that reports its epoch and step within every epoch: each report is a
    # different number on each axis, so a trial read by the wrong unit shows.
    settings = Settings(
        storage={"data_dir": tmp_path, "database_url": database_url},
        cluster={"ray_address": dead_ray()},
        code={"code_root": str(FIXTURES / "usercode")},
    )
    service = compose(settings, make_sessionmaker(make_engine(database_url)), RayBackend(dead_ray(), timeout_s=2))
    search = {
        "kind": "tune",
        "base": user_spec("userpkg.steps:train"),
        "search_space": {"config.lr": {"type": "loguniform", "low": 0.001, "high": 0.1}},
        "metric": "loss",
        "mode": "min",
        "num_trials": 2,
    }
    if budget is not None:
        search["budget"] = budget
    spec = parse_job_spec(search)
    assert spec.unit == unit  # the contract's axis
    job, _ = service.jobs.submit(spec)
    set_columns(service, job.id, status="RUNNING", attempt=1)
    at = {"epoch": 2, "step": 230, "training_iteration": 7}
    report = {"type": "trial_metric", "seq": 0, "ts": 1.0, "trial_id": "t0", "metrics": {"loss": 0.5, **at}}
    service.ingest.take(job.id, [report])
    with service.sessions() as s:
        trial = s.scalar(select(TrialRow).where(TrialRow.job_id == job.id))
    assert (trial.last_time, trial.best_metric) == (at[unit], 0.5)


def test_a_search_whose_stored_spec_no_longer_validates_is_refused_with_a_code(running):
    from api.errors import Conflict
    from bench.harness.attacks import SEARCH
    from service.events.reads.trials import TrialService

    service, _ = running
    job, _ = service.jobs.submit(parse_job_spec(SEARCH))
    set_columns(service, job.id, spec={**SEARCH, "metric": ""})  # e.g. a bound this server added
    trials = TrialService(service.sessions)
    for read in (trials.trials, trials.best):
        with pytest.raises(Conflict) as refused:
            read(job.id)
        assert refused.value.code == "stored_spec_invalid" and "no longer validates" in refused.value.message


def test_every_event_type_has_one_writer_and_a_driver_sends_only_tunes_trial_statuses():
    from typing import get_args

    from api.schemas import TrialEvent, TrialStatus
    from api.schemas.events import JobEvent
    from service.events.ingest import WRITERS

    assert set(WRITERS) == set(get_args(get_args(JobEvent)[0]))
    sent = set(get_args(TrialEvent.model_fields["status"].annotation))
    assert sent == {s.value for s in TrialStatus} - {TrialStatus.CANCELLED.value}
    assert {s.value for s in TrialStatus if s.is_live()} == {"PENDING", "RUNNING", "PAUSED"}


@pytest.mark.parametrize(
    "ended, live_reads", [("CANCELLED", "CANCELLED"), ("FAILED", "ERROR"), ("SUCCEEDED", "TERMINATED")]
)
def test_a_live_trial_of_an_ended_search_reads_as_the_searchs_end(running, ended, live_reads):
    from bench.harness.attacks import SEARCH
    from service.events.reads.trials import TrialService

    service, _ = running
    job, _ = service.jobs.submit(parse_job_spec(SEARCH))
    set_columns(service, job.id, status="RUNNING", attempt=1)
    said = {"t0": "RUNNING", "t1": "TERMINATED", "t2": "PAUSED", "t3": "ERROR", "t4": "PENDING"}
    events = [
        {"type": "trial", "seq": i, "ts": 1.0, "trial_id": t, "status": st} for i, (t, st) in enumerate(said.items())
    ]
    service.ingest.take(job.id, events)
    trials = TrialService(service.sessions)
    assert {t.trial_id: t.status for t in trials.trials(job.id)} == said  # the search still runs
    set_columns(service, job.id, status=ended)
    read = {t.trial_id: t.status for t in trials.trials(job.id)}
    assert read == {"t0": live_reads, "t1": "TERMINATED", "t2": live_reads, "t3": "ERROR", "t4": live_reads}
