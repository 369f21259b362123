"""The isolation matrix: every route of the server's OpenAPI document x every kind of
caller (bench/harness/tenancy_world.py) with the answer each must get. A route the table below
does not know fails the test, so a new route cannot skip it.

What each class of answer means:
- ``ok``: the route ran for the caller (any answer but 401, 403 or a 404 that hides a
  job or project; a 404 for a checkpoint a QUEUED job has not made is ``ok``);
- ``hidden``: 404 with the code a missing job, project or package gets: a record of a
  project the caller is not in reads exactly as one that does not exist;
- ``forbidden``: 403 (a server admin's route; a viewer changing a job); ``401``: no token, a revoked or expired one.
Every 200 a caller of another project gets is also searched for the job's id: a list
that forgot its project filter fails here."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
import yaml

from api.client import Client
from api.errors import QuotaExceeded
from bench.harness.identity_attacks import lifetime_days, mint, same_key_in_two_projects, scrape
from bench.harness.specs import digits_spec
from bench.harness.tenancy_world import IDENTITIES, World
from service.db.models import utcnow
from service.db.tenancy_models import JobUsageRow
from tests.support.cli_runner import cli as run_cli

pytestmark = pytest.mark.slow  # starts a server (no Ray)

HIDDEN_CODES = {f"{what}_not_found" for what in ("job", "project", "code_package", "schedule", "pipeline")}
ALPHA_READERS = {"owner", "mate", "viewer", "admin"}


def rule(ok: set[str], hidden: set[str] = frozenset(), forbidden: set[str] = frozenset()) -> dict[str, str]:
    table = {who: "ok" for who in ok} | {who: "hidden" for who in hidden} | {who: "forbidden" for who in forbidden}
    table.update(none="401", revoked="401", expired="401")
    assert set(table) == set(IDENTITIES), table
    return table


AUTHENTICATED = {"owner", "mate", "other", "viewer", "admin"}
JOB_READ = rule(ALPHA_READERS, hidden={"other"})
JOB_WRITE = rule({"owner", "mate", "admin"}, hidden={"other"}, forbidden={"viewer"})
OPEN = rule(AUTHENTICATED)  # every caller; what they see is filtered (searched for leaks below)
SUBMIT = rule({"owner", "mate", "admin"}, hidden={"other", "viewer"})
SERVER_ADMIN = rule({"admin"}, forbidden=AUTHENTICATED - {"admin"})
OWN_TOKENS = rule({"owner", "admin"}, forbidden={"mate", "other", "viewer"})
MEMBERS = rule({"owner", "admin"}, hidden={"other"}, forbidden={"mate", "viewer"})
CODE_WRITE = rule({"owner", "mate", "admin"}, hidden={"other", "viewer"})
CODE_READ = rule(ALPHA_READERS, hidden={"other"})
PUBLIC = {who: "ok" for who in IDENTITIES}

# (method, path template) -> who gets what. Changing a job or a user uses a fresh one per call.
EXPECTED: dict[tuple[str, str], dict[str, str]] = {
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/livez"): PUBLIC,
    ("POST", "/v1/jobs"): SUBMIT,
    ("GET", "/v1/jobs"): OPEN,
    ("GET", "/v1/jobs/{job_id}"): JOB_READ,
    ("DELETE", "/v1/jobs/{job_id}"): JOB_WRITE,
    ("POST", "/v1/jobs:cancel"): OPEN,  # refusals per id: checked in test_bulk_cancel_refuses_what_is_not_yours
    ("POST", "/v1/jobs/{job_id}/cancel"): JOB_WRITE,
    ("POST", "/v1/jobs/{job_id}/resume"): JOB_WRITE,
    ("GET", "/v1/jobs/{job_id}/metrics"): JOB_READ,
    ("GET", "/v1/jobs/{job_id}/metrics/stream"): JOB_READ,
    ("GET", "/v1/jobs/{job_id}/logs"): JOB_READ,
    ("GET", "/v1/jobs/{job_id}/checkpoints"): JOB_READ,
    ("GET", "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/download"): JOB_READ,
    ("GET", "/v1/jobs/{job_id}/trials"): JOB_READ,
    ("GET", "/v1/jobs/{job_id}/trials/{trial_id}/metrics"): JOB_READ,
    ("GET", "/v1/jobs/{job_id}/lineage"): JOB_READ,
    ("GET", "/v1/jobs/{job_id}/best"): JOB_READ,
    ("GET", "/v1/jobs/{job_id}/best/replay"): JOB_READ,
    ("GET", "/v1/jobs/{job_id}/worker-groups"): JOB_READ,
    ("GET", "/v1/jobs/{job_id}/tensorboard"): JOB_READ,
    ("GET", "/v1/jobs/{job_id}/events"): JOB_READ,
    ("GET", "/v1/jobs/{job_id}/webhooks"): JOB_READ,
    ("GET", "/v1/cluster"): OPEN,
    ("GET", "/v1/replicas"): SERVER_ADMIN,
    ("GET", "/v1/code"): OPEN,
    ("PUT", "/v1/code/{sha256}"): CODE_WRITE,
    ("GET", "/v1/code/{sha256}"): CODE_READ,
    ("HEAD", "/v1/code/{sha256}"): CODE_READ,
    ("GET", "/v1/events"): OPEN,
    ("GET", "/v1/webhooks"): SERVER_ADMIN,
    ("GET", "/v1/webhooks/{subscription}/deliveries"): OPEN,
    ("GET", "/v1/users"): SERVER_ADMIN,
    ("POST", "/v1/users"): SERVER_ADMIN,
    ("DELETE", "/v1/users/{name}"): SERVER_ADMIN,
    ("POST", "/v1/users/{name}/tokens"): OWN_TOKENS,
    ("GET", "/v1/users/{name}/tokens"): OWN_TOKENS,
    ("DELETE", "/v1/users/{name}/tokens/{token_id}"): OWN_TOKENS,
    ("GET", "/v1/me"): OPEN,
    ("GET", "/v1/projects"): OPEN,
    ("POST", "/v1/projects"): SERVER_ADMIN,
    ("PUT", "/v1/projects/{name}/members/{user}"): MEMBERS,
    ("DELETE", "/v1/projects/{name}/members/{user}"): MEMBERS,
    ("GET", "/v1/projects/{project}/quota"): CODE_READ,  # alpha's quota: its readers
    ("PUT", "/v1/projects/{project}/quota"): SERVER_ADMIN,
    ("GET", "/v1/usage"): OPEN,  # by project: only the caller's (checked in test_lists_show_only_the_callers_projects)
    ("POST", "/v1/schedules"): SUBMIT,
    ("GET", "/v1/schedules"): OPEN,  # only the caller's projects' (tests/test_schedules_http.py)
    ("GET", "/v1/schedules/{schedule_id}"): JOB_READ,
    ("PATCH", "/v1/schedules/{schedule_id}"): JOB_WRITE,
    ("DELETE", "/v1/schedules/{schedule_id}"): JOB_WRITE,
    ("POST", "/v1/pipelines"): SUBMIT,
    ("GET", "/v1/pipelines"): OPEN,  # only the caller's projects' (tests/test_pipelines_http.py)
    ("GET", "/v1/pipelines/{pipeline_id}"): JOB_READ,
    ("POST", "/v1/pipelines/{pipeline_id}/cancel"): JOB_WRITE,
    ("POST", "/v1/pipelines/{pipeline_id}/resume"): JOB_WRITE,  # nothing to resume: 409, past the access check
}


@pytest.fixture(scope="module")
def world(tenancy_world):
    return tenancy_world  # shared with tests/test_schedules_http.py (one server start)


def outcome(status: int, code: str | None, path: str) -> str:
    if status >= 500 and not (status == 503 and path == "/v1/cluster"):  # no Ray answers this server
        return "error"
    if status == 401:
        return "401"
    if status == 403:
        return "forbidden"
    if status == 404 and code in HIDDEN_CODES:
        return "hidden"
    return "ok"


def test_every_route_answers_each_caller_as_the_matrix_says(world):
    with world.http("admin") as admin:
        document = admin.get("/openapi.json").raise_for_status().json()
        admin.post("/v1/users", json={"name": "temp"}).raise_for_status()
    world.pipeline = world.pipeline or world.fresh_pipeline()
    routes = [(m.upper(), p) for p, ops in document["paths"].items() for m in ops]
    clients = {who: world.http(who) for who in IDENTITIES}  # one connection each, kept alive
    unknown = [r for r in routes if r not in EXPECTED]
    assert not unknown, f"routes the isolation matrix does not know (add them to EXPECTED): {unknown}"
    wrong = []
    for method, path in routes:
        for who in IDENTITIES:
            url, options = world.request_for(method, path, who)
            with clients[who].stream(method, url, **options) as r:
                status = r.status_code
                body = b"" if (path.endswith("/stream") and status == 200) or method == "HEAD" else r.read()
            code = _code(body)
            got = outcome(status, code, path)
            if method == "HEAD" and status == 404 and EXPECTED[(method, path)][who] == "hidden":
                got = "hidden"  # a HEAD has no body to carry the code
            if got != EXPECTED[(method, path)][who]:
                wrong.append(f"{who:8} {method} {url}: {status} {code} (expected {EXPECTED[(method, path)][who]})")
            if who == "other" and status == 200 and world.job not in url and world.job.encode() in body:
                wrong.append(f"{who:8} {method} {url}: the answer names alpha's job {world.job}")
    for client in clients.values():
        client.close()
    assert not wrong, "\n".join(wrong)
    assert len(routes) == len(EXPECTED)  # every route the table knows is served


def _code(body: bytes) -> str | None:
    try:
        return json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def test_bulk_cancel_refuses_what_is_not_yours(world):
    alpha, beta = world.fresh_job("alpha"), world.fresh_job("beta")
    with world.http("other") as other:
        answer = other.post("/v1/jobs:cancel", json={"ids": [alpha, beta]}).json()
    assert answer["cancelled"] == [beta]
    assert [(r["id"], r["code"]) for r in answer["refused"]] == [(alpha, "job_not_found")]
    with world.http("viewer") as viewer:
        answer = viewer.post("/v1/jobs:cancel", json={"ids": [alpha]}).json()
    assert answer["cancelled"] == [] and answer["refused"][0]["code"] == "forbidden_role"
    with world.http("owner") as owner:
        assert owner.get(f"/v1/jobs/{alpha}").json()["status"] == "QUEUED"


def test_lists_show_only_the_callers_projects(world):
    beta = world.fresh_job("beta")
    with world.service.sessions.begin() as s:  # what alpha's job used, as accounting records it
        now = utcnow()
        s.add(JobUsageRow(job_id=world.job, attempt=1, project="alpha", cpus=1, gpus=0, started_at=now, until=now))
    with world.http("other") as other:
        jobs = other.get("/v1/jobs").json()
        events = other.get("/v1/events").json()["items"]
        projects = other.get("/v1/projects").json()
        usage = other.get("/v1/usage").json()["rows"]
        assert other.get("/v1/usage", params={"project": "alpha"}).json()["error"]["code"] == "project_not_found"
    assert {j["project"] for j in jobs["items"]} == {"beta"} and beta in {j["id"] for j in jobs["items"]}
    assert events and all(e["job_id"] is not None for e in events)  # no user, token or project changes
    assert [p["name"] for p in projects] == ["beta"]
    assert {row["project"] for row in usage} <= {"beta"}
    with world.http("owner") as owner:
        assert [row["project"] for row in owner.get("/v1/usage").json()["rows"]] == ["alpha"]
    with world.http("admin") as admin:
        every = {j["project"] for j in admin.get("/v1/jobs", params={"limit": 1000}).json()["items"]}
    assert {"alpha", "beta"} <= every


def test_submit_goes_to_the_default_project_or_a_named_one(world):
    with world.http("mate") as mate:
        job = mate.post("/v1/jobs", json=digits_spec(name="where")).json()
        assert job["project"] == "alpha"
        refused = mate.post("/v1/jobs", json=digits_spec(name="where", project="beta"))
        missing = mate.post("/v1/jobs", json=digits_spec(name="where", project="nowhere"))
    assert refused.status_code == missing.status_code == 404
    assert refused.json()["error"]["code"] == missing.json()["error"]["code"] == "project_not_found"
    with world.http("viewer") as viewer:
        assert viewer.post("/v1/jobs", json=digits_spec(name="where")).json()["error"]["code"] == "project_not_found"


def test_code_packages_are_held_per_project(world):
    """The same bytes in two projects are two references; a project neither sees, probes
    nor runs a package only another one holds."""
    params = {"project": "beta"}
    with world.http("other") as other:
        assert other.head(f"/v1/code/{world.sha}", params=params).status_code == 404  # alpha holds it: no probe
        job = {"name": "uses-alphas", "entrypoint": "main:train", "code": f"sha256:{world.sha}"}
        refused = other.post("/v1/jobs", json={**job, "scaling": {"num_workers": 1}})
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "code_package_not_found"
        uploaded = other.put(f"/v1/code/{world.sha}", params=params, content=world.code)
        assert uploaded.status_code == 201  # its own reference, though the bytes were known
        assert other.get(f"/v1/code/{world.sha}", params=params).json()["jobs"] == 0
        assert other.get(f"/v1/code/{world.sha}", params={"project": "alpha"}).status_code == 404
    with world.http("owner") as owner:
        assert owner.head(f"/v1/code/{world.sha}", params={"project": "alpha"}).status_code == 200


def test_audit_events_name_the_acting_user(world):
    with world.http("admin") as admin:
        events = admin.get("/v1/events", params={"limit": 1000}).json()["items"]
    seen = {(e["type"], e["actor"]) for e in events}
    assert ("submitted", "owner") in seen
    assert ("code_uploaded", "owner") in seen
    assert {("project_created", "admin"), ("user_created", "admin"), ("token_created", "admin")} <= seen
    assert ("token_revoked", "admin") in seen and ("member_set", "owner") in seen
    tokens = [e for e in events if e["type"] == "token_created"]
    assert all("rdk_" not in str(e["data"]) for e in tokens)  # the audit names the token by id, never its secret


def test_the_cli_manages_users_projects_and_tokens(world):
    admin = world.tokens["admin"]
    assert cli(world, admin, "project", "create", "gamma").exit_code == 0
    made = cli(world, admin, "user", "create", "dave", "--project", "gamma", "--role", "viewer")
    assert made.exit_code == 0, made.output
    dave = made.output.split("token (shown once): ")[1].split()[0]
    me = cli(world, dave, "token", "create", "--name", "ci", "--expires-in-days", "30")
    assert me.exit_code == 0 and me.output.strip().startswith("rdk_")
    listed = cli(world, dave, "token", "list")
    assert "first" in listed.output and "ci" in listed.output and dave not in listed.output
    assert cli(world, admin, "project", "add-member", "gamma", "dave", "--role", "member").exit_code == 0
    assert "dave:member" in cli(world, admin, "project", "list").output
    refused = cli(world, dave, "user", "list")
    assert refused.exit_code == 1 and "server admins" in refused.output and len(refused.output.splitlines()) <= 2
    bad_role = cli(world, admin, "project", "add-member", "gamma", "dave", "--role", "owner")
    assert bad_role.exit_code == 2
    first_id = next(line.split()[1] for line in listed.output.splitlines() if " first " in line)
    assert cli(world, dave, "token", "revoke", first_id).exit_code == 0
    assert cli(world, dave, "token", "list").exit_code == 1  # that was the token it sent: now refused
    assert cli(world, admin, "project", "remove-member", "gamma", "dave").exit_code == 0
    assert cli(world, admin, "user", "revoke", "dave").exit_code == 0
    assert "dave" not in cli(world, admin, "user", "list").output


def test_a_token_never_outlives_the_token_that_made_it(world):
    """A user's 1-day token cannot mint a token for that user that lives longer (nor one
    that never expires); no token made over the API lives past RAYDOCK_MAX_TOKEN_TTL_DAYS."""
    admin = world.tokens["admin"]  # the first start's token: it never expires
    short = mint(world.url, admin, "mate", expires_in_days=1, name="short").raise_for_status().json()
    forever = mint(world.url, short["token"], "mate", name="forever")  # no expiry asked for
    longer = mint(world.url, short["token"], "mate", expires_in_days=30, name="longer")
    capped = mint(world.url, admin, "mate", name="capped")
    too_long = mint(world.url, admin, "mate", expires_in_days=400, name="too-long")
    made = [r.json() for r in (forever, longer, capped, too_long) if r.status_code == 201] + [short]
    try:
        assert forever.status_code == 201 and forever.json()["expires_at"] is not None
        assert datetime.fromisoformat(forever.json()["expires_at"]) <= datetime.fromisoformat(short["expires_at"])
        assert longer.status_code == 422 and longer.json()["error"]["code"] == "token_lifetime_too_long"
        assert "expires_in_days" in longer.json()["error"]["message"]
        assert capped.status_code == 201 and 364.99 < lifetime_days(capped.json()) <= 365
        assert too_long.status_code == 422 and too_long.json()["error"]["code"] == "token_lifetime_too_long"
        assert "RAYDOCK_MAX_TOKEN_TTL_DAYS" in too_long.json()["error"]["message"]
    finally:
        with world.http("admin") as http:
            for token in made:
                http.delete(f"/v1/users/mate/tokens/{token['id']}").raise_for_status()


def test_metrics_need_a_token_once_local_mode_has_ended(world):
    """Every project's running job ids are in /metrics: once users hold tokens, a loopback
    client without one (or with a user's that is no server admin's) reads nothing."""
    refused = scrape(world.url)
    assert refused.status_code == 401 and "raydock_" not in refused.text
    assert scrape(world.url, world.tokens["owner"]).status_code == 401  # a project admin, not a server admin
    assert scrape(world.url, world.tokens["revoked"]).status_code == 401
    served = scrape(world.url, world.tokens["admin"])
    assert served.status_code == 200 and "raydock_jobs{" in served.text


def test_idempotency_keys_are_per_project(world):
    """A key another project used neither gets a 409 nor names its job: each project's keys are its own."""
    first, second, retry = same_key_in_two_projects(
        world.url, (world.tokens["owner"], "alpha"), (world.tokens["other"], "beta"), "nightly-1"
    )
    try:
        assert first.status_code == 202, first.text
        assert second.status_code == 202, second.text
        assert second.json()["project"] == "beta" and second.json()["id"] != first.json()["id"]
        assert retry.status_code == 200 and retry.json()["id"] == second.json()["id"]  # still idempotent within beta
    finally:
        with world.http("admin") as admin:
            ids = [r.json()["id"] for r in (first, second) if r.status_code == 202]
            admin.post("/v1/jobs:cancel", json={"ids": ids}).raise_for_status()


def test_the_event_logs_own_actor_and_the_admins_name_are_reserved(world):
    with world.http("admin") as admin:
        answers = {name: admin.post("/v1/users", json={"name": name}) for name in ("system", "admin")}
        names = [u["name"] for u in admin.get("/v1/users").json()]
    for name, r in answers.items():
        assert r.status_code == 422, (name, r.text)
        assert r.json()["error"]["code"] == "user_name_reserved"
    assert "system" not in names


def test_a_submit_past_its_projects_quota_says_which_quota_and_who_raises_it(world, tmp_path):
    """The CLI and the SDK name the quota, its figures and the command a server admin runs;
    the CLI does not say the server is busy nor to try again in a few seconds."""
    admin = world.tokens["admin"]
    with world.http("admin") as http:
        http.post("/v1/projects", json={"name": "full"}).raise_for_status()
        http.put("/v1/projects/full/quota", json={"max_queued": 1}).raise_for_status()
        queued = http.post("/v1/jobs", json=digits_spec(name="fills", project="full")).raise_for_status().json()
    try:
        spec = tmp_path / "job.yaml"
        spec.write_text(yaml.safe_dump(digits_spec(name="one-more", project="full")))
        told = cli(world, admin, "submit", str(spec))
        assert told.exit_code == 1
        assert "Project full is at its quota: 1 of 1 jobs waiting to start (max_queued)." in told.output
        assert "server admin" in told.output and "raydock quota set full --max-queued" in told.output
        assert "not a busy server" in told.output
        assert "The server is busy" not in told.output and "Try again" not in told.output
        with Client(world.url, token=admin) as sdk, pytest.raises(QuotaExceeded) as refused:
            sdk.submit(digits_spec(name="one-more", project="full"))
        assert "not a busy server" in str(refused.value) and "raydock quota set full" in str(refused.value)
    finally:
        with world.http("admin") as http:
            http.post(f"/v1/jobs/{queued['id']}/cancel").raise_for_status()


def cli(world: World, token: str, *args: str):
    return run_cli(world.url, token, *args)
