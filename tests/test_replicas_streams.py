"""Any replica serves a job's events and its streams: two real ``raydock serve`` replicas on
one real PostgreSQL (no Ray: the job is put in RUNNING in the store, its events pushed as
its driver pushes them). A metrics stream opened on replica B shows what replica A took
in, and what B took in after; a job's pushes may go to either replica, a batch sent
again to the other is not stored twice; the stream ends when the job does, with every
report once, in order."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import update

from api.schemas.events import SUBMISSION_HEADER
from bench.harness.replicas import replica
from bench.harness.specs import digits_spec
from service.db.engine import make_engine
from service.db.models import JobRow
from service.events.tokens import token_hash

pytestmark = pytest.mark.slow  # two servers of its own

TTL_S = 3.0
TOKEN = "events-token-of-the-attempt"
SID = "raydock-streamed-1-abcdef"


def _push(server, job_id: str, seqs: range) -> None:
    body = [{"type": "metric", "seq": i, "ts": 1.0 + i, "metrics": {"loss": 1.0 / (i + 1)}} for i in seqs]
    headers = {"Authorization": f"Bearer {TOKEN}", SUBMISSION_HEADER: SID}
    r = httpx.post(f"{server.url}/v1/internal/jobs/{job_id}/events", json=body, headers=headers, timeout=30)
    assert r.status_code == 204, r.text


def _set(store: str, job_id: str, **values) -> None:
    engine = make_engine(store)
    with engine.begin() as c:
        c.execute(update(JobRow).where(JobRow.id == job_id).values(**values))
    engine.dispose()


def test_a_stream_on_one_replica_shows_what_another_took_in(tmp_path, store, started):
    a = replica(tmp_path / "a", store, TTL_S)
    started.append(a)
    b = replica(tmp_path / "b", store, TTL_S)
    started.append(b)
    r = httpx.post(a.url + "/v1/jobs", json=digits_spec(name="streamed"), timeout=30)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    _set(store, job_id, status="RUNNING", attempt=1, ray_job_id=SID, events_token_hash=token_hash(TOKEN))

    _push(a, job_id, range(0, 5))  # taken in by A
    seen: list[int] = []
    ended = None
    with httpx.stream("GET", f"{b.url}/v1/jobs/{job_id}/metrics/stream", timeout=60) as stream:
        event = None
        for line in stream.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("id: ") and event == "metric":
                seen.append(int(line.removeprefix("id: ")))
                if len(seen) == 5:
                    _push(b, job_id, range(5, 10))  # taken in by B, while B's stream is open
                    _push(a, job_id, range(0, 10))  # the whole batch again, to the other replica
                    _push(b, job_id, range(0, 10))
                elif len(seen) == 10:
                    _set(store, job_id, status="SUCCEEDED")  # the stream ends with the job
            elif line.startswith("data: ") and event == "end":
                ended = line
                break
    assert seen == list(range(10))  # every report once, in order, from both replicas' pushes
    assert ended is not None and "SUCCEEDED" in ended
    points = httpx.get(f"{a.url}/v1/jobs/{job_id}/metrics", timeout=30).json()
    assert [p["seq"] for p in points] == list(range(10))
    assert [p["metrics"]["loss"] for p in points] == [1.0 / (i + 1) for i in range(10)]
