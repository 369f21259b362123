"""Webhooks and the event log through a real server process, with a real receiver on
loopback in this process (allowed by RAYDOCK_WEBHOOK_ALLOW_PRIVATE on this server only)
and the session's Ray cluster: a real job's transitions arrive once each, in order, signed;
a receiver answering 500 twice gets the third try; a post cut by a SIGKILLed server is
sent again after its restart; the actor of a token cancel and of a monitor timeout; and
the session server (default policy) refuses a loopback webhook."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from api.client import Client
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from bench.harness.waiting import wait_for
from bench.harness.webhook_receiver import Receiver
from service.cli.main import app
from service.eventlog import signing
from tests.support.specs import user_spec

TOKEN = "webhook-test-token"
SERVER_SECRET = "server-secret-0123456789"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def receiver():
    with Receiver() as rx:
        yield rx


@pytest.fixture(scope="module")
def hooked(ray_head, receiver, tmp_path_factory):
    server_hooks = [{"name": "ops", "url": receiver.url + "/ops", "events": ["submitted"], "secret": SERVER_SECRET}]
    env = {
        "RAYDOCK_WEBHOOK_ALLOW_PRIVATE": "1",
        "RAYDOCK_WEBHOOK_BACKOFF_S": "0.2",
        "RAYDOCK_WEBHOOKS": json.dumps(server_hooks),
    }
    proc = ServerProcess(tmp_path_factory.mktemp("hooked"), ray_head.dashboard_url, token=TOKEN, extra_env=env).start()
    yield proc
    proc.stop()


@pytest.fixture()
def hc(hooked) -> Client:
    with Client(hooked.url, token=TOKEN) as c:
        yield c


def _notify(receiver: Receiver, path: str, events: list[str]) -> list[dict]:
    return [{"url": receiver.url + path, "events": events}]


def test_a_jobs_transitions_arrive_once_in_order_signed_and_its_timeout_is_the_systems(hc, receiver):
    spec = user_spec(
        "userpkg.ckpt_steps:train",
        name="hooked",
        config={"steps": 10_000, "every": 5, "sleep_s": 0.2},
        scaling={"num_workers": 1},
        max_runtime_s=3,
        notify=_notify(receiver, "/timeline", ["status_changed"]),
    )
    job = hc.submit(spec)
    job.wait(timeout=120)
    assert job.status.value == "FAILED" and job.info.failure_cause.value == "TIMEOUT", job.info.error

    logged = job.events(type="status_changed")
    got = receiver.wait_for("/timeline", lambda posts: len(posts) >= len(logged), timeout=30)
    time.sleep(1.0)  # nothing more may come
    got = receiver.at("/timeline")
    assert [p.event for p in got] == [e.model_dump(mode="json") for e in logged]  # once each, in order
    assert [(e.data["from"], e.data["to"]) for e in logged] == [
        ("QUEUED", "STARTING"),
        ("STARTING", "RUNNING"),
        ("RUNNING", "CANCELLING"),
        ("CANCELLING", "FAILED"),
    ]
    [hook] = job.webhooks()
    assert hook.secret and hook.secret not in json.dumps([p.headers for p in got])
    for post in got:
        assert signing.verify(hook.secret, post.headers["Raydock-Signature"], post.body)
        assert post.headers["Raydock-Event-Id"] == str(post.event["id"]) and post.event["version"] == 1
    # The monitor stopped it: the system's actions, with the cause.
    timeout, failed = logged[2], logged[3]
    assert (timeout.actor, timeout.data["reason"]) == ("system", "stopping: exceeded max_runtime_s")
    assert (failed.actor, failed.data["cause"]) == ("system", "TIMEOUT")
    types = [e.type for e in job.events()]
    assert types[:2] == ["submitted", "admitted"] and "started" in types and types.count("status_changed") == 4
    assert job.events()[0].actor == "admin"
    deliveries = hc.deliveries(hook.id).items
    assert {d.state for d in deliveries} == {"delivered"} and len(deliveries) == 4


def test_a_token_cancel_is_named_and_a_receiver_failing_twice_gets_the_third_try(hc, receiver, hooked):
    receiver.answers["/flaky"] = [500, 500]
    job = hc.submit(digits_spec(name="flaky", epochs=1, notify=_notify(receiver, "/flaky", ["submitted", "cancelled"])))
    job.cancel()
    tries = receiver.wait_for("/flaky", lambda posts: len(posts) >= 4, timeout=30)
    submitted = [p for p in tries if p.event["type"] == "submitted"]
    assert len(submitted) == 3 and len({p.body for p in submitted}) == 1  # the same event, tried three times
    assert tries[3].event["type"] == "cancelled" and tries[3].event["actor"] == "admin"  # after it, in order
    [hook] = job.webhooks()
    by_event = {d.event_id: d for d in hc.deliveries(hook.id).items}
    first = by_event[submitted[0].event["id"]]
    assert (first.state, first.attempts, first.last_status) == ("delivered", 3, 200)
    cancel = [e for e in job.events() if e.type in ("cancelled", "status_changed")]
    assert cancel and all(e.actor == "admin" for e in cancel)

    # The server's webhook got the submit too, signed with the operator's secret.
    ops = receiver.wait_for("/ops", lambda posts: any(p.event["job_id"] == job.id for p in posts), timeout=30)
    mine = [p for p in ops if p.event["job_id"] == job.id]
    assert len(mine) == 1 and signing.verify(SERVER_SECRET, mine[0].headers["Raydock-Signature"], mine[0].body)
    assert [w.id for w in hc.webhooks()] == ["server:ops"] and hc.webhooks()[0].secret is None

    out = CliRunner().invoke(app, ["events", job.id, "--url", hooked.url, "--token", TOKEN])
    assert out.exit_code == 0, out.output
    assert "submitted" in out.output and "cancelled" in out.output and "admin" in out.output

    # /metrics counts the deliveries by outcome: the two 500s as retrying, then delivered.
    scraped = httpx.get(hooked.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    counts = {
        s.labels["outcome"]: s.value
        for family in text_string_to_metric_families(scraped)
        for s in family.samples
        if s.name == "raydock_webhook_deliveries_total"
    }
    assert counts["retrying"] >= 2 and counts["delivered"] >= 3


def test_a_post_cut_by_a_killed_server_is_sent_again_after_its_restart(hc, receiver, hooked):
    receiver.delays["/slow"] = [20.0]  # the first post hangs: the server dies while it waits
    job = hc.submit(digits_spec(name="slow-hook", epochs=1, notify=_notify(receiver, "/slow", ["submitted"])))
    job.cancel()
    receiver.wait_for("/slow", lambda posts: len(posts) == 1, timeout=30)
    hooked.kill()  # SIGKILL mid-post: the delivery was never marked
    hooked.start()
    posts = receiver.wait_for("/slow", lambda posts: len(posts) == 2, timeout=30)
    assert posts[0].body == posts[1].body and posts[1].headers["Raydock-Event-Id"] == str(posts[0].event["id"])
    with Client(hooked.url, token=TOKEN) as again:
        [hook] = again.job(job.id).webhooks()
        delivery = wait_for(lambda: [d for d in again.deliveries(hook.id).items if d.state == "delivered"], 10, "it")[0]
    assert delivery.event_id == posts[0].event["id"]


def test_a_loopback_webhook_is_refused_unless_the_operator_allows_it(server):
    spec = digits_spec(name="no-hook", notify=[{"url": "http://127.0.0.1:9/hook"}])
    r = httpx.post(server.url + "/v1/jobs", json=spec, timeout=30)
    assert r.status_code == 422, r.text
    body = r.json()["error"]
    assert body["code"] == "webhook_url_refused" and "notify.0.url" in body["message"]
    assert "RAYDOCK_WEBHOOK_ALLOW_PRIVATE" in body["message"]
