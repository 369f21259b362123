"""The SDK's users, tokens and projects (``Client`` has these methods):

client.create_user("ann", project="vision")        # server admin
token = client.create_token("ann", expires_in_days=90).token   # shown once
client.set_member("vision", "bob", role="viewer")   # server admin or project admin
client.me()
"""

from __future__ import annotations

from typing import Any

import httpx

from api.schemas.tenancy import (
    Me,
    MemberSet,
    ProjectCreate,
    ProjectPublic,
    Role,
    TokenCreate,
    TokenCreated,
    TokenPublic,
    UserCreate,
    UserPublic,
)


class TenancyClient:
    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...  # Client's

    def me(self) -> Me:
        """Who this client's token is: name, server admin or not, projects and roles."""
        return Me.model_validate(self.request("GET", "/v1/me").json())

    # ------------------------------------------------------------------ users

    def create_user(
        self, name: str, *, admin: bool = False, project: str | None = None, role: Role = "member"
    ) -> UserPublic:
        body = UserCreate(name=name, admin=admin, project=project, role=role).model_dump(mode="json")
        return UserPublic.model_validate(self.request("POST", "/v1/users", json=body).json())

    def users(self) -> list[UserPublic]:
        return [UserPublic.model_validate(u) for u in self.request("GET", "/v1/users").json()]

    def delete_user(self, name: str) -> None:
        self.request("DELETE", f"/v1/users/{name}")

    # ------------------------------------------------------------------ tokens

    def create_token(self, user: str, *, name: str = "token", expires_in_days: float | None = None) -> TokenCreated:
        """A new token for ``user``; its ``token`` is shown in this answer only."""
        body = TokenCreate(name=name, expires_in_days=expires_in_days).model_dump(mode="json")
        return TokenCreated.model_validate(self.request("POST", f"/v1/users/{user}/tokens", json=body).json())

    def tokens(self, user: str) -> list[TokenPublic]:
        return [TokenPublic.model_validate(t) for t in self.request("GET", f"/v1/users/{user}/tokens").json()]

    def revoke_token(self, user: str, token_id: int) -> None:
        self.request("DELETE", f"/v1/users/{user}/tokens/{token_id}")

    # ------------------------------------------------------------------ projects

    def create_project(self, name: str) -> ProjectPublic:
        body = ProjectCreate(name=name).model_dump(mode="json")
        return ProjectPublic.model_validate(self.request("POST", "/v1/projects", json=body).json())

    def projects(self) -> list[ProjectPublic]:
        return [ProjectPublic.model_validate(p) for p in self.request("GET", "/v1/projects").json()]

    def set_member(self, project: str, user: str, role: Role = "member") -> ProjectPublic:
        body = MemberSet(role=role).model_dump(mode="json")
        r = self.request("PUT", f"/v1/projects/{project}/members/{user}", json=body)
        return ProjectPublic.model_validate(r.json())

    def remove_member(self, project: str, user: str) -> None:
        self.request("DELETE", f"/v1/projects/{project}/members/{user}")
