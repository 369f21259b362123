"""Events, metrics, logs and checkpoint downloads over real HTTP, on a server whose Ray
address answers nothing (no Ray job needed): jobs are put where a test needs them in
the server's own SQLite store."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx
import pytest

from api.client import Client
from api.schemas.events import SUBMISSION_HEADER
from bench.harness.jobstore import dead_ray, job_service, set_columns, submit
from bench.harness.servers import ServerProcess
from service.db.event_models import CheckpointRow
from service.events.reads import series
from service.events.tokens import token_hash
from service.http.routes.events import MAX_BATCH

TOKEN = "events-token-of-the-test"
SID = "raydock-pushed-1-abcdef"


@pytest.fixture(scope="module")
def deadray_server(tmp_path_factory):
    data = tmp_path_factory.mktemp("deadray")
    proc = ServerProcess(data, dead_ray()).start()
    yield proc, job_service(f"sqlite:///{data / 'raydock.db'}", data)
    proc.stop()


@pytest.fixture()
def running(deadray_server):
    server, service = deadray_server
    job_id = submit(service)
    set_columns(service, job_id, status="RUNNING", attempt=1, ray_job_id=SID, events_token_hash=token_hash(TOKEN))
    with Client(server.url) as client:
        yield server, service, client, job_id


def push(server, job_id: str, body) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/internal/jobs/{job_id}/events",
        json=body,
        headers={"Authorization": f"Bearer {TOKEN}", SUBMISSION_HEADER: SID},
    )


def metric(i: int) -> dict:
    return {"type": "metric", "seq": i, "ts": 1.0 + i, "metrics": {"loss": (i % 97) / 97, "step": i}}


def test_pushed_batches_are_stored_and_read_back_in_pages_and_downsampled(running):
    server, _, client, job_id = running
    for start in range(0, 2500, MAX_BATCH):
        assert push(server, job_id, [metric(i) for i in range(start, min(start + MAX_BATCH, 2500))]).status_code == 204
    assert push(server, job_id, metric(0)).status_code == 204  # one event alone still works; stored once
    assert push(server, job_id, [metric(i) for i in range(MAX_BATCH + 1)]).status_code == 422
    assert push(server, job_id, [metric(2500), "not an object"]).status_code == 422

    job = client.job(job_id)
    assert [p.seq for p in job.metrics(page_size=700)] == list(range(2500))
    first = httpx.get(f"{server.url}/v1/jobs/{job_id}/metrics", params={"limit": 1000})
    assert len(first.json()) == 1000 and first.links["next"]["url"] == f"/v1/jobs/{job_id}/metrics?since=999&limit=1000"
    last = httpx.get(f"{server.url}/v1/jobs/{job_id}/metrics", params={"since": 1999, "limit": 1000})
    assert len(last.json()) == 500 and "next" not in last.links
    chart = job.metrics(max_points=50)
    assert len(chart) <= 50 and (chart[0].seq, chart[-1].seq) == (0, 2499)
    assert (
        min(p.metrics_min["loss"] for p in chart[1:]) == 0.0
        and max(p.metrics_max["loss"] for p in chart[1:]) == 96 / 97
    )


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": series.PAGE_MAX + 1},
        {"max_points": 1},
        {"max_points": series.POINTS_MAX + 1},
        {"since": -2},
    ],
)
def test_metric_query_bounds_are_4xx_with_a_code(running, params):
    server, _, _, job_id = running
    r = httpx.get(f"{server.url}/v1/jobs/{job_id}/metrics", params=params)
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "invalid_request"


def test_a_follow_stream_returns_every_character_once_while_the_log_grows(running):
    _, service, client, job_id = running
    text = "".join(f"step {i} {'é' * (i % 400)}\n" for i in range(3000))  # ~1.2 MB: many chunks
    got: list[str] = []
    follower = threading.Thread(target=lambda: got.extend(client.job(job_id).logs(follow=True)))
    follower.start()
    at = 0
    for size in (10, 70_000, 3, 300_000, 1, 10**9):
        at += service.ingest.log(job_id, text[at : at + size], at, final=True)
    set_columns(service, job_id, status="SUCCEEDED")
    follower.join(60)
    assert "".join(got) == text
    assert client.job(job_id).logs() == text
    assert httpx.get(f"{client.url}/v1/jobs/{job_id}/logs", params={"offset": 123_457}).text == text[123_457:]


def test_a_streamed_checkpoint_download_is_the_stored_files(running, tmp_path):
    _, service, client, job_id = running
    ckpt = Path(service.reads.prefix(job_id)) / "checkpoint_000001"
    files = {
        "model.pt": os.urandom(5 << 20),
        "state.json": b'{"step": 3}',
        "shards/__0_0.distcp": os.urandom(300_000),
        "empty": b"",
    }
    for name, data in files.items():
        (ckpt / name).parent.mkdir(parents=True, exist_ok=True)
        (ckpt / name).write_bytes(data)
    with service.sessions.begin() as s:
        row = CheckpointRow(job_id=job_id, attempt=1, path=str(ckpt), step=3, epoch=1, values={})
        s.add(row)
    got = client.job(job_id).download_checkpoint(row.id, dest=tmp_path)
    assert {str(p.relative_to(got)): p.read_bytes() for p in got.rglob("*") if p.is_file()} == files
