"""A server with two projects and every kind of caller, for the isolation tests: one real
server (real HTTP, SQLite, no Ray: jobs stay QUEUED) and the same store opened in this
process, so jobs can be made where a request needs one without a submit over HTTP.

Projects ``alpha`` and ``beta``. Callers: ``owner`` (admin of alpha; submitted the job),
``mate`` (member of alpha), ``viewer`` (viewer of alpha), ``other`` (member of beta), the
server admin (its bootstrap token), no token, a revoked token and an expired one."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import httpx
from sqlalchemy import update

from api.schemas import parse_job_spec
from bench.harness.code_attacks import package
from bench.harness.jobstore import dead_ray, job_service
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec
from service.db.models import utcnow
from service.db.tenancy_models import ApiTokenRow
from service.runtime import Runtime

IDENTITIES = ("owner", "mate", "other", "viewer", "admin", "none", "revoked", "expired")


@dataclass
class World:
    server: ServerProcess
    service: Runtime
    tokens: dict[str, str | None] = field(default_factory=dict)
    token_ids: dict[str, int] = field(default_factory=dict)
    job: str = ""  # alpha's job, QUEUED, submitted by owner
    schedule: str = ""  # alpha's schedule, created by owner
    pipeline: str = ""  # alpha's pipeline, made by the first test that needs one (fresh_pipeline)
    code: bytes = b""
    sha: str = ""

    @property
    def url(self) -> str:
        return self.server.url

    def headers(self, who: str) -> dict[str, str]:
        token = self.tokens[who]
        return {"Authorization": f"Bearer {token}"} if token else {}

    def http(self, who: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(who), timeout=30)

    def fresh_job(self, project: str = "alpha") -> str:
        """A QUEUED job of ``project`` made in the store: for a request that changes its job."""
        job, _ = self.service.jobs.submit(parse_job_spec(digits_spec(name="fresh")), project=project)
        return job.id

    def fresh_schedule(self, who: str = "owner", **overrides) -> str:
        """A schedule of alpha made over HTTP by ``who``: for a request that changes or deletes it."""
        with self.http(who) as http:
            return http.post("/v1/schedules", json=schedule_body(**overrides)).raise_for_status().json()["id"]

    def fresh_pipeline(self, who: str = "owner") -> str:
        """A two-step pipeline of alpha made over HTTP by ``who`` (its steps QUEUED and WAITING)."""
        with self.http(who) as http:
            return http.post("/v1/pipelines", json=pipeline_body()).raise_for_status().json()["id"]

    def request_for(self, method: str, path: str, who: str) -> tuple[str, dict]:
        """The concrete URL and request options of a route for one caller."""
        job = self.fresh_job() if method in ("POST", "DELETE") and "{job_id}" in path else self.job
        name = "alpha" if path.startswith("/v1/projects/") else "owner"
        values = {
            "job_id": job,
            "checkpoint_id": "0",
            "trial_id": "t0",
            "sha256": self.sha,
            "subscription": f"{self.job}-0",
            "name": name,
            "user": "temp",
            "token_id": "0",
            "project": "alpha",
            "schedule_id": self.fresh_schedule() if method != "GET" and "{schedule_id}" in path else self.schedule,
            "pipeline_id": self.fresh_pipeline() if method != "GET" and "{pipeline_id}" in path else self.pipeline,
        }
        options: dict = {}
        if (method, path) == ("DELETE", "/v1/users/{name}"):
            values["name"] = f"gone-{who}"
            with self.http("admin") as admin:
                admin.post("/v1/users", json={"name": values["name"]}).raise_for_status()
        if (method, path) == ("DELETE", "/v1/users/{name}/tokens/{token_id}"):
            with self.http("admin") as admin:
                made = admin.post("/v1/users/owner/tokens", json={"name": f"r-{who}"}).raise_for_status().json()
            values["token_id"] = str(made["id"])
        if path.startswith("/v1/code/"):
            options["params"] = {"project": "alpha"}
        if (method, path) == ("PUT", "/v1/code/{sha256}"):
            options["content"] = self.code
        bodies = {
            ("POST", "/v1/jobs"): digits_spec(name="matrix", project="alpha"),
            ("POST", "/v1/jobs:cancel"): {"ids": [self.fresh_job()]},
            ("POST", "/v1/users"): {"name": f"new-{who}"},
            ("POST", "/v1/users/{name}/tokens"): {"name": "matrix"},
            ("POST", "/v1/projects"): {"name": f"new-{who}"},
            ("PUT", "/v1/projects/{name}/members/{user}"): {"role": "member"},
            ("PUT", "/v1/projects/{project}/quota"): {"max_queued": 1000},
            ("POST", "/v1/schedules"): schedule_body(name=f"matrix-{who}"),
            ("PATCH", "/v1/schedules/{schedule_id}"): {"paused": True},
            ("POST", "/v1/pipelines"): pipeline_body(name=f"matrix-{who}"),
        }
        if (method, path) in bodies:
            options["json"] = bodies[(method, path)]
        url = re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)
        return url, options

    def stop(self) -> None:
        self.server.stop()
        self.service.sessions.kw["bind"].dispose()


def schedule_body(**overrides) -> dict:
    """A schedule of alpha firing daily at 03:00 UTC."""
    return {"name": "nightly", "cron": "0 3 * * *", "project": "alpha", "job": digits_spec(name="nightly"), **overrides}


def pipeline_body(**overrides) -> dict:
    """A pipeline of alpha: a step and one after it."""
    steps = [
        {"name": "first", "job": digits_spec(name="first")},
        {"name": "second", "job": digits_spec(name="second"), "after": [{"step": "first"}]},
    ]
    return {"name": "chain", "project": "alpha", "steps": steps, **overrides}


def start_world(data_dir: Path, **env: str) -> World:
    """The world; ``env``: more of the server's settings."""
    url = f"sqlite:///{data_dir / 'raydock.db'}"
    service = job_service(url, data_dir)  # migrates the store before the server opens it
    server = ServerProcess(data_dir, dead_ray(), extra_env={"RAYDOCK_DATABASE_URL": url, **env}).start()
    world = World(server, service)
    admin_token = (data_dir / "admin-token").read_text().strip()
    world.tokens.update(admin=admin_token, none=None)
    http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30)
    for project in ("alpha", "beta"):
        http.post("/v1/projects", json={"name": project}).raise_for_status()
    roles = {"owner": ("alpha", "admin"), "mate": ("alpha", "member"), "viewer": ("alpha", "viewer")}
    roles["other"] = ("beta", "member")
    for user, (project, role) in roles.items():
        http.post("/v1/users", json={"name": user, "project": project, "role": role}).raise_for_status()
        made = http.post(f"/v1/users/{user}/tokens", json={"name": "t"}).raise_for_status().json()
        world.tokens[user], world.token_ids[user] = made["token"], made["id"]
    revoked = http.post("/v1/users/mate/tokens", json={"name": "gone"}).raise_for_status().json()
    http.delete(f"/v1/users/mate/tokens/{revoked['id']}").raise_for_status()
    expired = http.post("/v1/users/mate/tokens", json={"name": "old"}).raise_for_status().json()
    with service.sessions.begin() as s:  # a token whose expiry passed (the API takes future ones only)
        past = utcnow() - timedelta(seconds=1)
        s.execute(update(ApiTokenRow).where(ApiTokenRow.id == expired["id"]).values(expires_at=past))
    world.tokens.update(revoked=revoked["token"], expired=expired["token"])
    with world.http("owner") as owner:
        world.job = owner.post("/v1/jobs", json=digits_spec(name="alpha-job")).raise_for_status().json()["id"]
        world.code = package({"main.py": b"def train(config):\n    pass\n"})
        world.sha = hashlib.sha256(world.code).hexdigest()
        owner.put(f"/v1/code/{world.sha}", params={"project": "alpha"}, content=world.code).raise_for_status()
    http.close()
    world.schedule = world.fresh_schedule()
    return world
