"""Users, API tokens, projects and roles as the API shows them and takes them: what the
server admin sends to create a user, a token or a project, a membership's role, and what
``GET /v1/me`` answers. A token's secret appears once, in ``TokenCreated``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from api.schemas.common import Strict
from api.schemas.job_common import DEFAULT_PROJECT, PROJECT_RE, ProjectName  # noqa: F401 - the project's name, here too
from api.schemas.jobs import UtcDatetime

USER_RE = r"^[a-z][a-z0-9._-]{0,62}$"
TOKEN_PREFIX = "rdk_"
MAX_TOKENS_PER_USER = 20  # live (not revoked, not expired) tokens
DEFAULT_TOKEN_TTL_DAYS = 365  # RAYDOCK_MAX_TOKEN_TTL_DAYS unless set: the longest a token made over the API lives
MAX_TOKEN_TTL_DAYS = 3650  # what that setting, and a token's asked lifetime, may be at most
RESERVED_USER_NAMES = frozenset({"admin", "system"})  # the server admin's name and the event log's own actor
MAX_USERS = 10_000
MAX_PROJECTS = 1_000

Role = Literal["admin", "member", "viewer"]
UserName = Annotated[
    str,
    Field(
        pattern=USER_RE, description="A user: 1-63 lowercase letters, digits, '.', '_' or '-', starting with a letter."
    ),
]


class UserCreate(Strict):
    name: UserName
    admin: bool = Field(default=False, description="A server admin: sees every project, manages users and projects.")
    project: ProjectName | None = Field(
        default=None, description="A project to add the user to at once (it must exist), with `role`."
    )
    role: Role = Field(default="member", description="The user's role in `project`.")


class Membership(Strict):
    project: ProjectName
    role: Role = Field(
        description="admin (manage members, every job action), member (submit and control jobs), viewer (read only)."
    )


class UserPublic(Strict):
    name: str
    admin: bool
    created_at: UtcDatetime
    projects: list[Membership] = Field(default_factory=list)


class TokenCreate(Strict):
    name: str = Field(
        default="token",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
        description="A label to tell a user's tokens apart (a laptop, a CI job).",
    )
    expires_in_days: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TOKEN_TTL_DAYS,
        description="Days until the token stops working: at most the server's longest token lifetime "
        "(RAYDOCK_MAX_TOKEN_TTL_DAYS, 365 unless set), and no later than the token that asks for it expires. "
        "Leave out for the longest allowed.",
    )


class TokenPublic(Strict):
    id: int
    user: str
    name: str
    created_at: UtcDatetime
    expires_at: UtcDatetime | None = None
    revoked_at: UtcDatetime | None = None


class TokenCreated(TokenPublic):
    token: str = Field(description="The token itself: shown this once, never stored by the server (only its sha256).")


class ProjectCreate(Strict):
    name: ProjectName


class ProjectPublic(Strict):
    name: str
    created_at: UtcDatetime
    members: dict[str, Role] = Field(default_factory=dict, description="user -> role")


class MemberSet(Strict):
    role: Role = Field(default="member", description="The user's role in the project.")


class Me(Strict):
    name: str
    admin: bool = Field(description="A server admin.")
    default_project: str | None = Field(description="Where a submit without `project` goes.")
    projects: list[Membership]
