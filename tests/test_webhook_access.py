"""Who reads what of the webhooks, and which targets the URL policy refuses, through a
real server (real HTTP, SQLite, no Ray) with the callers of bench/harness/tenancy_world.py: the
server's webhooks (their URLs often carry a receiver's credential) are the server admin's;
a job's signing secrets are for those who may change the job, not its viewers; 6to4 and
Teredo addresses embedding a refused IPv4 address are refused as that address is."""

from __future__ import annotations

import json

import pytest

from bench.harness.specs import digits_spec
from bench.harness.tenancy_world import start_world

pytestmark = pytest.mark.slow  # starts a server (no Ray)

SERVER_HOOK = {
    "name": "ops",
    "url": "https://hooks.example.com/raydock?token=the-receivers-credential",
    "events": ["*"],
    "secret": "ops-secret-0123456789",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = start_world(tmp_path_factory.mktemp("webhook-access"), RAYDOCK_WEBHOOKS=json.dumps([SERVER_HOOK]))
    yield w
    w.stop()


def test_only_a_server_admin_lists_the_servers_webhooks(world):
    for who in ("owner", "mate", "viewer", "other"):
        with world.http(who) as c:
            r = c.get("/v1/webhooks")
        assert r.status_code == 403, (who, r.text)
        assert r.json()["error"]["code"] == "admin_only" and "server admins" in r.json()["error"]["message"]
        assert "the-receivers-credential" not in r.text
    with world.http("admin") as c:
        [hook] = c.get("/v1/webhooks").raise_for_status().json()
    assert (hook["id"], hook["url"], hook["secret"]) == ("server:ops", SERVER_HOOK["url"], None)


def test_a_jobs_signing_secrets_are_for_its_writers_not_its_viewers(world):
    notify = [{"url": "https://hooks.example.com/a"}, {"url": "https://hooks.example.com/b", "events": ["*"]}]
    with world.http("owner") as owner:
        r = owner.post("/v1/jobs", json=digits_spec(name="hooked", project="alpha", notify=notify))
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        written = owner.get(f"/v1/jobs/{job}/webhooks").raise_for_status().json()
    assert [h["url"] for h in written] == [n["url"] for n in notify]
    assert all(h["secret"].startswith("whsec_") for h in written)
    for who in ("mate", "admin"):  # a member of the project, the server admin: may change the job
        with world.http(who) as c:
            assert c.get(f"/v1/jobs/{job}/webhooks").raise_for_status().json() == written
    with world.http("viewer") as viewer:
        r = viewer.get(f"/v1/jobs/{job}/webhooks")
    assert r.status_code == 200, r.text
    seen = r.json()
    assert [(h["id"], h["url"], h["events"]) for h in seen] == [(h["id"], h["url"], h["events"]) for h in written]
    assert all(h["secret"] is None for h in seen)
    assert not any(h["secret"] in r.text for h in written)
    with world.http("other") as other:
        assert other.get(f"/v1/jobs/{job}/webhooks").json()["error"]["code"] == "job_not_found"


@pytest.mark.parametrize(
    "url",
    [
        "http://[2002:a9fe:a9fe::1]/latest/meta-data",  # 6to4 of 169.254.169.254
        "http://[2002:7f00:1::1]/hook",  # 6to4 of 127.0.0.1
        "http://[2001:0:4136:e378:8000:63bf:5601:5601]/hook",  # Teredo, its client 169.254.169.254
    ],
)
def test_6to4_and_teredo_addresses_of_a_refused_ipv4_are_refused(world, url):
    notify = [{"url": "https://hooks.example.com/fine"}, {"url": url}]
    with world.http("owner") as owner:
        r = owner.post("/v1/jobs", json=digits_spec(name="tunnelled", project="alpha", notify=notify))
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "webhook_url_refused" and "notify.1.url" in error["message"]
    assert "embedded in" in error["message"] and "RAYDOCK_WEBHOOK_ALLOW_PRIVATE" in error["message"]
