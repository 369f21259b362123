"""The pieces of /metrics and of the tracking export that need no server: metric names
and labels, the lifecycle's moves counted once committed (never when rolled back), the
scrape-time gauges read from a real SQLite store, and what submit refuses."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool
from starlette.routing import Route, compile_path

from api.errors import InvalidSpec
from api.schemas import FailureCause, JobStatus, parse_job_spec
from bench.harness.specs import digits_spec
from service import lifecycle
from service.db import event_models, tracking_models  # noqa: F401  (their tables join Base's metadata)
from service.db.engine import make_sessionmaker
from service.db.models import Base, JobRow, utcnow
from service.settings import Settings
from service.telemetry import instruments
from service.telemetry.collector import StoreCollector
from service.telemetry.latency import UNMATCHED, route_template, status_class
from service.tracking import enrol
from service.tracking.names import MAX_KEYS_PER_REPORT, mlflow_key, params, scalars, tensorboard_tag


def sample(registry, name: str, **labels) -> float:
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


@pytest.fixture()
def store():
    engine = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
    Base.metadata.create_all(engine)
    return make_sessionmaker(engine)


def add_job(sessions, job_id: str, status: JobStatus, kind: str = "train", **columns) -> None:
    now = utcnow()
    with sessions.begin() as s:
        s.add(
            JobRow(
                id=job_id,
                name="t",
                kind=kind,
                status=status.value,
                spec={},
                labels={},
                created_at=now,
                queued_at=columns.pop("queued_at", now),
                **columns,
            )
        )


# ----------------------------------------------------------------------------- names and labels


def test_metric_names_are_sanitised_per_tool_and_reports_bounded():
    assert mlflow_key("val/acc@top-1 (%)") == "val/acc_top-1 ___"
    assert tensorboard_tag("val/acc@top-1 (%)") == "val/acc_top-1____"
    assert len(mlflow_key("x" * 1000)) == 250 and mlflow_key("") == "_"
    report = {"step": 3, "loss": 0.5, "ok": True, "tag": "a", "nan": float("nan"), "inf": float("inf"), "n": 2}
    assert scalars(report) == {"loss": 0.5, "n": 2.0}  # no step, text, booleans or non-finite values
    assert len(scalars({f"k{i}": i for i in range(1000)})) == MAX_KEYS_PER_REPORT


def test_a_spec_flattens_to_dotted_params_within_mlflow_limits():
    spec = {
        "optimizer": {"name": "adam", "lr": 0.01},
        "model": {"hidden_sizes": [64, 32]},
        "x": None,
        "long": "v" * 9000,
    }
    out = params(spec)
    assert out["optimizer.lr"] == "0.01" and out["optimizer.name"] == "adam"
    assert out["model.hidden_sizes"] == "[64, 32]"
    assert "x" not in out and len(out["long"]) == 6000


def test_latency_labels_are_route_templates_and_status_classes():
    templates = [(compile_path(t)[0], t) for t in ("/v1/jobs/{job_id}", "/v1/jobs/{job_id}/metrics", "/healthz")]
    # A route included in a router knows only its own part of the path; the label is the whole template.
    scope = {"route": Route("/jobs/{job_id}", endpoint=lambda r: None), "path": "/v1/jobs/j0123"}
    assert route_template(scope, templates) == "/v1/jobs/{job_id}"
    scope = {"route": Route("/jobs/{job_id}/metrics", endpoint=lambda r: None), "path": "/v1/jobs/j0123/metrics"}
    assert route_template(scope, templates) == "/v1/jobs/{job_id}/metrics"
    assert route_template({"path": "/v1/jobs/j0123/nope"}, templates) == UNMATCHED  # one label, not one per path
    assert [status_class(s) for s in (200, 302, 404, 503, 0)] == ["2xx", "3xx", "4xx", "5xx", "other"]


def test_webhook_outcomes_are_a_closed_set():
    before = sample(instruments.REGISTRY, "raydock_webhook_deliveries_total", outcome="failed")
    instruments.webhook_delivered("delivered")
    instruments.webhook_delivered("no such outcome")
    assert sample(instruments.REGISTRY, "raydock_webhook_deliveries_total", outcome="failed") == before + 1
    assert sample(instruments.REGISTRY, "raydock_webhook_deliveries_total", outcome="no such outcome") == 0


# ----------------------------------------------------------------------------- moves, counted once committed


def test_moves_are_counted_when_committed_and_not_when_rolled_back(store):
    reg = instruments.REGISTRY
    add_job(store, "jq", JobStatus.QUEUED, queued_at=utcnow() - timedelta(seconds=30))
    failed = sample(reg, "raydock_job_failures_total", kind="train", cause="USER_CODE")
    waits = sample(reg, "raydock_admission_wait_seconds_count", kind="train")
    starts = sample(reg, "raydock_startup_seconds_count", kind="train")

    with store() as s:  # rolled back: nothing happened, nothing is counted, even when the session commits later
        lifecycle.transition(s, s.get(JobRow, "jq"), JobStatus.STARTING)
        s.rollback()
        s.commit()
    assert sample(reg, "raydock_admission_wait_seconds_count", kind="train") == waits

    for target in (JobStatus.STARTING, JobStatus.RUNNING):
        with store.begin() as s:
            lifecycle.transition(s, s.get(JobRow, "jq"), target)
    with store.begin() as s:
        lifecycle.fail(s, s.get(JobRow, "jq"), FailureCause.USER_CODE, "boom")
    assert sample(reg, "raydock_admission_wait_seconds_count", kind="train") == waits + 1
    assert sample(reg, "raydock_admission_wait_seconds_sum", kind="train") >= 30  # from queued_at
    assert sample(reg, "raydock_startup_seconds_count", kind="train") == starts + 1
    assert sample(reg, "raydock_job_failures_total", kind="train", cause="USER_CODE") == failed + 1


def test_a_mass_cancel_counts_each_job_it_moved(store):
    for i in range(3):
        add_job(store, f"jm{i}", JobStatus.QUEUED, kind="tune")
    before = sample(instruments.REGISTRY, "raydock_jobs_finished_total", kind="tune", status="CANCELLED")
    with store.begin() as s:
        lifecycle.transition_many(s, ["jm0", "jm1", "nope"], JobStatus.QUEUED, JobStatus.CANCELLED, reason="x")
    assert sample(instruments.REGISTRY, "raydock_jobs_finished_total", kind="tune", status="CANCELLED") == before + 2


# ----------------------------------------------------------------------------- gauges read at scrape time


def test_the_store_gauges_count_jobs_the_queue_and_only_running_jobs_by_id(store):
    t0 = time.monotonic()
    add_job(store, "ja", JobStatus.QUEUED, queued_at=utcnow() - timedelta(seconds=120))
    add_job(store, "jb", JobStatus.QUEUED, kind="tune")
    add_job(store, "jr", JobStatus.RUNNING, latest_metrics={"step": 7, "samples_per_s": 250.0, "mfu": 0.25})
    add_job(store, "jd", JobStatus.SUCCEEDED, latest_metrics={"step": 9, "samples_per_s": 99.0})
    reg = CollectorRegistry()
    reg.register(StoreCollector(store))  # no backend yet: no cluster series, no call to Ray
    assert sample(reg, "raydock_jobs", status="QUEUED", kind="train") == 1
    assert sample(reg, "raydock_jobs", status="QUEUED", kind="tune") == 1
    assert sample(reg, "raydock_jobs", status="FAILED", kind="train") == 0  # every status is a series
    assert sample(reg, "raydock_queue_depth") == 2
    assert 119 <= sample(reg, "raydock_queue_oldest_age_seconds") <= 121 + (time.monotonic() - t0)
    assert sample(reg, "raydock_job_throughput", job_id="jr", unit="samples") == 250.0
    assert sample(reg, "raydock_job_mfu", job_id="jr") == 0.25
    assert sample(reg, "raydock_job_step", job_id="jr") == 7
    text = generate_latest(reg).decode()
    assert "jd" not in text and "raydock_cluster_cpus" not in text


# ----------------------------------------------------------------------------- submit


def test_a_spec_asking_for_mlflow_is_refused_on_a_server_without_it(tmp_path):
    spec = parse_job_spec(digits_spec(tracking={"tensorboard": True, "mlflow": {"experiment": "digits"}}))
    with pytest.raises(InvalidSpec) as refused:
        enrol.check(spec, Settings(storage={"data_dir": tmp_path}))
    assert refused.value.code == "mlflow_not_configured" and "RAYDOCK_MLFLOW_TRACKING_URI" in str(refused.value)
    enrol.check(
        spec, Settings(storage={"data_dir": tmp_path}, tracking={"mlflow_tracking_uri": f"file:{tmp_path}/mlruns"})
    )  # accepted


def test_events_taken_in_and_dropped_are_counted_by_channel(store, tmp_path):
    from service.events.ingest import Ingest

    reg = instruments.REGISTRY
    add_job(store, "je", JobStatus.RUNNING, attempt=1)
    taken = sample(reg, "raydock_events_ingested_total", channel="push")
    dropped = sample(reg, "raydock_events_dropped_total", channel="push")
    events = [
        {"type": "metric", "seq": 0, "ts": 1.0, "metrics": {"step": 1, "loss": 0.5}},
        {"type": "metric", "seq": 1, "ts": 2.0, "metrics": {"step": 2, "loss": 0.4}},
        {"type": "no such event", "seq": 2},
        "not an event at all",
    ]
    assert Ingest(store, str(tmp_path)).take("je", events, push=True)
    assert sample(reg, "raydock_events_ingested_total", channel="push") == taken + 2
    assert sample(reg, "raydock_events_dropped_total", channel="push") == dropped + 2


def test_a_stream_is_timed_to_its_first_byte_not_for_as_long_as_it_stays_open():
    import asyncio

    from service.telemetry.latency import RequestTimer

    async def streaming_app(scope, receive, send):  # an SSE-like answer: a head, then a slow body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(3):
            await asyncio.sleep(0.1)
            await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    sent, at = [], {}

    async def send(message):
        sent.append(message["type"])
        at.setdefault(message["type"], time.perf_counter())  # the head went out (the body's end comes 0.3 s on)

    async def call():
        at["call"] = time.perf_counter()
        await RequestTimer(streaming_app)(scope, receive, send)

    labels = {"method": "GET", "route": UNMATCHED, "status": "2xx"}
    count = sample(instruments.REGISTRY, "raydock_http_request_duration_seconds_count", **labels)
    total = sample(instruments.REGISTRY, "raydock_http_request_duration_seconds_sum", **labels)
    scope = {"type": "http", "method": "GET", "path": "/stream"}
    asyncio.run(call())
    assert sent.count("http.response.body") == 4  # the stream went through whole
    assert sample(instruments.REGISTRY, "raydock_http_request_duration_seconds_count", **labels) == count + 1
    timed = sample(instruments.REGISTRY, "raydock_http_request_duration_seconds_sum", **labels) - total
    assert timed <= at["http.response.start"] - at["call"]  # stopped by the head, however slow this machine is


def test_tracking_is_a_field_of_the_search_not_of_its_trials():
    from pydantic import ValidationError

    search = {
        "kind": "tune",
        "base": digits_spec(epochs=1),
        "search_space": {"optimizer.lr": {"type": "loguniform", "low": 1e-3, "high": 1e-1}},
        "metric": "val_acc",
        "mode": "max",
        "tracking": {"tensorboard": True},
    }
    assert parse_job_spec(search).tracking.tensorboard
    with pytest.raises(ValidationError) as in_base:
        parse_job_spec({**search, "base": digits_spec(epochs=1, tracking={"tensorboard": True})})
    with pytest.raises(ValidationError) as searched:
        parse_job_spec({**search, "search_space": {"tracking.tensorboard": {"type": "grid", "values": [True, False]}}})
    assert "base.tracking" in str(in_base.value) and "set it on the tune job" in str(searched.value)
    with pytest.raises(ValidationError) as bad_name:
        parse_job_spec(digits_spec(tracking={"mlflow": {"experiment": "../" + "x" * 300}}))
    assert "experiment" in str(bad_name.value) and "pattern" in str(bad_name.value)
