"""Attacks on identity, as a user (or anyone on the server's machine) could make them,
against a real server process (real HTTP, SQLite, no Ray): a short-lived token minting a
longer one, local mode brought back by deleting users, the server admin's name taken,
/metrics read without a token, another project's Idempotency-Key probed. Shared by
tests/test_tenancy_matrix.py, tests/test_local_mode.py and ``python -m bench.abuse_identity``,
which print the same figures."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx

from bench.harness.jobstore import dead_ray
from bench.harness.servers import ServerProcess
from bench.harness.specs import digits_spec


@dataclass
class LocalServer:
    """A fresh server in local mode (no RAYDOCK_API_TOKEN, loopback), with its first start's admin token."""

    server: ServerProcess

    @property
    def admin_token(self) -> str:
        return (self.server.data_dir / "admin-token").read_text().strip()

    def http(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.server.url, headers=headers, timeout=30)

    def tokenless_status(self) -> int:
        """What a request with no token gets: 200 while local mode lasts, 401 once it is over."""
        with self.http() as anyone:
            return anyone.get("/v1/me").status_code

    def add_user(self, name: str, *, admin: bool = False) -> str:
        """A user and their first token (what ``raydock user create`` does)."""
        with self.http(self.admin_token) as http:
            http.post("/v1/users", json={"name": name, "admin": admin}).raise_for_status()
            return http.post(f"/v1/users/{name}/tokens", json={"name": "first"}).raise_for_status().json()["token"]


def start_local(data_dir: Path) -> LocalServer:
    return LocalServer(ServerProcess(data_dir, dead_ray()).start())


def local_mode_after_users_left(local: LocalServer, users: int = 3) -> list[int]:
    """Tokenless answers: before any user, once ``users`` users hold tokens, once all of them are deleted."""
    seen = [local.tokenless_status()]
    names = [f"gone{i}" for i in range(users)]
    for name in names:
        local.add_user(name)
    seen.append(local.tokenless_status())
    with local.http(local.admin_token) as admin:
        for name in names:
            admin.delete(f"/v1/users/{name}").raise_for_status()
    seen.append(local.tokenless_status())
    return seen


def take_the_admin_name(local: LocalServer) -> httpx.Response:
    """Another server admin deletes ``admin`` and makes a user of that name: the answer to the make."""
    boss = local.add_user("boss", admin=True)
    with local.http(boss) as http:
        http.delete("/v1/users/admin").raise_for_status()
        return http.post("/v1/users", json={"name": "admin"})


def mint(url: str, token: str, user: str, expires_in_days: float | None = None, name: str = "minted") -> httpx.Response:
    """POST /v1/users/{user}/tokens with ``token``: the answer (201 with the new token, or a refusal)."""
    body: dict = {"name": name}
    if expires_in_days is not None:
        body["expires_in_days"] = expires_in_days
    return httpx.post(f"{url}/v1/users/{user}/tokens", json=body, headers=_bearer(token), timeout=30)


def lifetime_days(made: dict) -> float | None:
    """A token's lifetime as the API answers it (None: it never expires)."""
    if made.get("expires_at") is None:
        return None
    expires, created = datetime.fromisoformat(made["expires_at"]), datetime.fromisoformat(made["created_at"])
    return (expires - created).total_seconds() / 86_400


def scrape(url: str, token: str | None = None) -> httpx.Response:
    return httpx.get(f"{url}/metrics", headers=_bearer(token), timeout=30)


def same_key_in_two_projects(
    url: str, first: tuple[str, str], second: tuple[str, str], key: str
) -> list[httpx.Response]:
    """The same Idempotency-Key and body submitted by ``first`` (token, project), then by
    ``second``, then by ``second`` again (its retry)."""
    answers = []
    for token, project in (first, second, second):
        spec = digits_spec(name="keyed", project=project)
        headers = {**_bearer(token), "Idempotency-Key": key}
        answers.append(httpx.post(f"{url}/v1/jobs", json=spec, headers=headers, timeout=30))
    return answers


def _bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}
