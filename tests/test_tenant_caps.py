"""One tenant against the server-wide caps: streams and code uploads are shared out per
user and per project, a stream of a job that does not run ends, a stream ends with its
caller's access, an upload must keep a least rate, a project's code has a quota, and a
package's record shows its own project's times only. Real servers (real HTTP, SQLite,
no Ray)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from contextlib import ExitStack
from datetime import datetime

import httpx
import pytest

from bench.harness import attacks, caps_attacks
from bench.harness.caps_attacks import CAPS_ENV
from bench.harness.code_attacks import package
from bench.harness.tenancy_world import start_world

pytestmark = pytest.mark.slow  # starts servers (no Ray)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world = start_world(tmp_path_factory.mktemp("caps"), **CAPS_ENV)
    yield world
    world.stop()


def test_one_user_holds_its_share_of_streams_and_another_project_is_still_served(world):
    alpha, beta = caps_attacks.running_job(world, "alpha"), caps_attacks.running_job(world, "beta")
    with ExitStack() as stack:
        viewer = caps_attacks.open_follows(world, "viewer", alpha, caps_attacks.MAX_STREAMS, stack)
        mate = caps_attacks.open_follows(world, "mate", alpha, caps_attacks.MAX_STREAMS, stack)
        owner = caps_attacks.open_follows(world, "owner", alpha, 1, stack)
        other = caps_attacks.open_follows(world, "other", beta, 1, stack)
        print(f"\nviewer {viewer.codes}, mate {mate.codes}, owner {owner.codes}, other project {other.codes}")
        assert viewer.served == 2 and set(viewer.shares) == {"user"}  # a quarter of 8
        assert mate.served == 2 and set(mate.shares) == {"user"}
        assert owner.codes == [429] and owner.shares == ["project"]  # alpha holds half of 8
        assert other.codes == [200]  # beta's member still gets a stream


def test_one_user_holds_its_share_of_downloads_and_another_project_still_downloads(world):
    alpha, beta = caps_attacks.running_job(world, "alpha"), caps_attacks.running_job(world, "beta")
    alpha_path, beta_path = caps_attacks.big_checkpoint(world, alpha), caps_attacks.big_checkpoint(world, beta)
    with ExitStack() as stack:
        viewer = caps_attacks.open_answers(world, "viewer", alpha_path, {}, caps_attacks.MAX_DOWNLOADS, stack)
        mate = caps_attacks.open_answers(world, "mate", alpha_path, {}, 1, stack)
        owner = caps_attacks.open_answers(world, "owner", alpha_path, {}, 1, stack)
        other = caps_attacks.open_answers(world, "other", beta_path, {}, 1, stack)
        print(f"\nviewer {viewer.codes}, mate {mate.codes}, owner {owner.codes}, other project {other.codes}")
        assert viewer.served == 1 and set(viewer.shares) == {"user"}  # a quarter of 4
        assert mate.codes == [200]
        assert owner.codes == [429] and owner.shares == ["project"]  # alpha holds half of 4
        assert other.codes == [200]


def test_one_member_holds_its_share_of_uploads_and_another_project_still_uploads(world):
    mate = caps_attacks.hold_uploads(world, "mate", "alpha", caps_attacks.MAX_UPLOADS)
    owner = caps_attacks.hold_uploads(world, "owner", "alpha", 1)
    try:
        print(f"\nmate holds {len(mate.socks)} uploads, {len(mate.refused)} refused; owner {len(owner.socks)}")
        assert len(mate.socks) == 1 and len(mate.refused) == caps_attacks.MAX_UPLOADS - 1  # a quarter of 4
        assert b" 429 " in mate.refused[0].split(b"\r\n")[0] and b'"too_many_uploads"' in mate.refused[0]
        assert len(owner.socks) == 1  # alpha now holds its half
        body, _ = caps_attacks.code_body("beta-while-alpha-holds")
        r = caps_attacks.upload(world, "other", "beta", body)
        assert r.status_code == 201, r.text
    finally:
        mate.release()
        owner.release()


def test_a_follow_of_a_queued_job_ends_with_a_line_saying_why(world):
    job_id = world.fresh_job("alpha")  # QUEUED: no cluster behind this server
    text = caps_attacks.read_to_end(world, "viewer", f"/v1/jobs/{job_id}/logs", {"follow": "true"})
    last = text.strip().splitlines()[-1]
    assert last.startswith("[raydock]") and "QUEUED" in last and "RAYDOCK_STREAM_IDLE_S" in last, text
    events = caps_attacks.read_to_end(world, "viewer", f"/v1/jobs/{job_id}/metrics/stream", {})
    end = json.loads(events.strip().splitlines()[-1].removeprefix("data:"))
    assert end["status"] == "QUEUED" and end["reason"] == "not_running", events


def _stream_until_end(world, token: str, job_id: str, out: dict) -> None:
    with httpx.Client(base_url=world.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        try:
            with client.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"}) as r:
                out["status"] = r.status_code
                out["text"] = r.read().decode()
        except httpx.HTTPError as exc:
            out["error"] = exc


@pytest.mark.parametrize("how", ["revoke the token", "remove from the project"])
def test_an_open_stream_ends_when_its_caller_loses_access(world, how):
    job_id = caps_attacks.running_job(world, "alpha")
    name = "leaver-" + how.split()[0]
    with world.http("admin") as admin:
        admin.post("/v1/users", json={"name": name, "project": "alpha", "role": "viewer"}).raise_for_status()
        made = admin.post(f"/v1/users/{name}/tokens", json={"name": "t"}).raise_for_status().json()
        out: dict = {}
        reader = threading.Thread(target=_stream_until_end, args=(world, made["token"], job_id, out))
        reader.start()
        try:
            with world.http("admin") as probe:  # the stream is open once the server counts it
                for _ in range(100):
                    if probe.get(f"/v1/jobs/{job_id}/logs").status_code == 200 and "status" in out:
                        break
                    threading.Event().wait(0.05)
            if how == "revoke the token":
                admin.delete(f"/v1/users/{name}/tokens/{made['id']}").raise_for_status()
            else:
                admin.delete(f"/v1/projects/alpha/members/{name}").raise_for_status()
        finally:
            reader.join(40)
    print(f"\n{how}: {out}")
    assert out.get("status") == 200 and "error" not in out, out
    assert out["text"].strip().splitlines()[-1].startswith("[raydock]") and "no longer reads it" in out["text"]


def test_another_projects_upload_of_the_same_bytes_shows_only_its_own_times(world):
    with world.http("owner") as owner:
        alpha_first = owner.get(f"/v1/code/{world.sha}", params={"project": "alpha"}).raise_for_status().json()
    with world.http("other") as other:
        stored = other.put(f"/v1/code/{world.sha}", params={"project": "beta"}, content=world.code)
        assert stored.status_code == 201, stored.text
        beta_first = stored.json()
        with world.http("owner") as owner:  # alpha uses it again
            assert owner.head(f"/v1/code/{world.sha}", params={"project": "alpha"}).status_code == 200
        beta_after = other.get(f"/v1/code/{world.sha}", params={"project": "beta"}).raise_for_status().json()
    print(f"\nalpha created {alpha_first['created_at']}; beta sees {beta_first['created_at']}")
    alpha_created = datetime.fromisoformat(alpha_first["created_at"])
    assert datetime.fromisoformat(beta_first["created_at"]) > alpha_created  # beta's own upload, not alpha's
    assert beta_after["last_used_at"] == beta_first["last_used_at"]  # alpha's use is not shown to beta


BODY_A, BODY_B = package({"a.py": b"a = 1\n" * 2000}), package({"b.py": b"b = 2\n" * 3000})


@pytest.fixture()
def target(tmp_path, request):
    target = attacks.start_target(tmp_path, **request.param)
    yield target
    target.stop()


SLOW = {"RAYDOCK_UPLOAD_MIN_BYTES_PER_S": "1000", "RAYDOCK_UPLOAD_GRACE_S": "1"}
QUOTA = {"RAYDOCK_CODE_QUOTA_BYTES": str(len(BODY_A) + len(BODY_B) - 1)}


@pytest.mark.parametrize("target", [SLOW], indirect=True)
def test_an_upload_slower_than_the_least_rate_is_cut_with_408(target):
    body = os.urandom(50_000)  # cut long before its end: what the bytes are does not matter
    answer, closed = caps_attacks.trickle_upload(target.url, body, chunk=100, every_s=0.5, wait_s=25)
    print(f"\ntrickled upload answered: {answer[:60]!r}; connection closed: {closed}")
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert closed  # the trickle holds no connection either
    assert b'"upload_too_slow"' in answer and b"RAYDOCK_UPLOAD_MIN_BYTES_PER_S" in answer
    assert httpx.get(f"{target.url}/healthz").status_code == 200


@pytest.mark.parametrize("target", [QUOTA], indirect=True)
def test_a_project_past_its_code_quota_gets_413_saying_how_to_free_space(target):
    body_a, body_b = BODY_A, BODY_B
    put = lambda body: httpx.put(  # noqa: E731
        f"{target.url}/v1/code/{hashlib.sha256(body).hexdigest()}", content=body, timeout=30
    )
    assert put(body_a).status_code == 201
    refused = put(body_b)
    assert refused.status_code == 413, refused.text
    err = refused.json()["error"]
    assert err["code"] == "code_quota_exceeded" and "DELETE /v1/jobs" in err["message"], err
    assert err["details"][0]["limit"] == len(body_a) + len(body_b) - 1
    assert put(body_a).status_code == 200  # what the project holds already costs nothing


@pytest.mark.parametrize("target", [{"RAYDOCK_CODE_RETENTION_S": "2"}], indirect=True)
def test_a_projects_hold_on_a_package_it_no_longer_uses_lapses_while_another_uses_it(target):
    """The package's last use is the other project's; the hold of the project that stopped
    using it lapses anyway, so its code quota is freed."""
    with httpx.Client(base_url=target.url, timeout=30) as admin:
        admin.post("/v1/projects", json={"name": "beta"}).raise_for_status()
        for project in ("default", "beta"):
            r = admin.put(f"/v1/code/{hashlib.sha256(BODY_A).hexdigest()}", params={"project": project}, content=BODY_A)
            assert r.status_code == 201, r.text
        sha = hashlib.sha256(BODY_A).hexdigest()
        held = {"default": 200}
        for _ in range(100):  # beta keeps using it; the monitor collects every second
            assert admin.head(f"/v1/code/{sha}", params={"project": "beta"}).status_code == 200
            held = {p: admin.get(f"/v1/code/{sha}", params={"project": p}).status_code for p in ("default", "beta")}
            if held["default"] == 404:
                break
            threading.Event().wait(0.3)
    print(f"\nafter the retention period: {held}")
    assert held == {"default": 404, "beta": 200}
