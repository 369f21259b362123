"""Who a request is: a ``Caller`` (a user with a role per project, or a server admin),
and the lookup of a user token (``authenticate``). Every access decision reads a Caller:
what it may read, write and manage, and where its submits go by default."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import or_, select
from sqlalchemy.orm import sessionmaker

from api.errors import Forbidden
from api.schemas.tenancy import DEFAULT_PROJECT, Me, Membership
from service.db.models import utcnow
from service.db.tenancy_models import ApiTokenRow, MembershipRow, UserRow
from service.tenancy.tokens import looks_like_token, token_hash

WRITERS = ("admin", "member")
ADMIN_NAME = "admin"  # the first start's server admin; RAYDOCK_API_TOKEN and local mode act as them


@dataclass(frozen=True)
class Caller:
    name: str
    user_id: int | None
    admin: bool  # server admin: every project, users and projects
    roles: dict[str, str] = field(default_factory=dict)  # project -> admin | member | viewer, oldest first
    # When the user token this request came with expires (None: it does not, or no user
    # token was sent): a token it makes may not outlive it.
    token_expires_at: datetime | None = None

    def can_read(self, project: str) -> bool:
        return self.admin or project in self.roles

    def can_write(self, project: str) -> bool:
        """Submit, cancel, resume, delete, upload code: a member or a project admin."""
        return self.admin or self.roles.get(project) in WRITERS

    def require_write(self, project: str, records: str) -> None:
        """Raise 403 ``forbidden_role`` unless the caller may change ``project``'s
        ``records`` (jobs, schedules, pipelines): a viewer reads them, nothing more."""
        if not self.can_write(project):
            raise Forbidden(
                f"You are a viewer in project {project!r}: you may read its {records}, not change them.",
                code="forbidden_role",
            )

    def can_manage(self, project: str) -> bool:
        """Add and remove members: a project admin."""
        return self.admin or self.roles.get(project) == "admin"

    @property
    def projects(self) -> list[str] | None:
        """The projects whose records the caller sees; None: all of them."""
        return None if self.admin else list(self.roles)

    @property
    def default_project(self) -> str | None:
        """Where a submit without ``project`` goes: a server admin's is ``default``, a
        user's the first project they joined where they may submit."""
        if self.admin:
            return DEFAULT_PROJECT
        return next((p for p, role in self.roles.items() if role in WRITERS), None)

    def me(self) -> Me:
        return Me(
            name=self.name,
            admin=self.admin,
            default_project=self.default_project,
            projects=[Membership(project=p, role=r) for p, r in self.roles.items()],
        )


def roles_of(s, user_id: int) -> dict[str, str]:
    rows = s.execute(
        select(MembershipRow.project, MembershipRow.role)
        .where(MembershipRow.user_id == user_id)
        .order_by(MembershipRow.created_at, MembershipRow.project)
    )
    return {r.project: r.role for r in rows}


def authenticate(sessions: sessionmaker, token: str) -> Caller | None:
    """The caller a user token names; None when it is unknown, revoked or expired."""
    if not looks_like_token(token):
        return None
    with sessions() as s:
        row = s.execute(
            select(UserRow.id, UserRow.name, UserRow.is_admin, ApiTokenRow.expires_at)
            .join(ApiTokenRow, ApiTokenRow.user_id == UserRow.id)
            .where(
                ApiTokenRow.token_hash == token_hash(token),
                ApiTokenRow.revoked_at.is_(None),
                or_(ApiTokenRow.expires_at.is_(None), ApiTokenRow.expires_at > utcnow()),
            )
        ).first()
        if row is None:
            return None
        return Caller(row.name, row.id, bool(row.is_admin), roles_of(s, row.id), token_expires_at=row.expires_at)


def server_admin(sessions: sessionmaker) -> Caller:
    """The server admin that RAYDOCK_API_TOKEN and local mode act as."""
    with sessions() as s:
        user = s.scalar(select(UserRow).where(UserRow.name == ADMIN_NAME))
        if user is None:
            return Caller(ADMIN_NAME, None, True)
        return Caller(user.name, user.id, True, roles_of(s, user.id))
